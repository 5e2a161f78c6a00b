"""What runs inside the Ray workers: the training engine and the role classes.

actor.py (ActorRolloutRefWorker), critic.py (CriticWorker), engine.py (TrainEngine: FSDP2,
AdamW, schedule, clipping, and the model's sequence- and expert-parallel groups), logprob.py
(padding-free log-probs/values), checkpoint_io.py (DCP), roles.py (the role table: where each role
runs, which checkpoint folder it owns), groups.py (start_workers), rollout/ (generation engines).
"""
