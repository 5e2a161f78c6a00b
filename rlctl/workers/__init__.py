"""What runs inside the Ray workers, in four folders, each importing only those below it:

roles/     the worker classes (actor, critic, reward model, PRIME's PRM, teacher, SFT, rollout
           ranks), the role table (table.py) and start-up (groups.py)
rollout/   the generation engines (hf, vLLM, SGLang) and partial rollouts
compute/   the training engine (engine.py: FSDP2, AdamW, schedule, clipping), the passes it runs
           (log-probs, the update schedule, micro-batches), models, LoRA, vision inputs, checkpoints
parallel/  how a model is split over ranks: FSDP, Ulysses sequence parallelism, expert parallelism
Each `*_checks.py` (config checks) sits beside what it checks.
"""
