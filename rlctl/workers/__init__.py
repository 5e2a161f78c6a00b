"""What runs inside the Ray workers: the training engine and the role classes.

actor.py (ActorRolloutRefWorker), critic.py (CriticWorker), engine.py (TrainEngine: FSDP2,
AdamW, schedule, clipping), logprob.py (padding-free log-probs/values), checkpoint_io.py (DCP),
groups.py (start_workers), rollout/ (generation engines).
"""
