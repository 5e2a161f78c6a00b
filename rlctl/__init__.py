"""rlctl: reinforcement-learning post-training of LLMs from the command line."""

__version__ = "0.1.0"
