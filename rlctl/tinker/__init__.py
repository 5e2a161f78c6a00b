"""`rlctl tinker`: the Tinker training API (the official `tinker` SDK's routes) over rlctl's own
LoRA training step and hf decode engine, on the user's machine. See docs/tinker.md."""
