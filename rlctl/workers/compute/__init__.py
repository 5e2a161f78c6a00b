"""The training engine and the passes it runs: log-probs, the update schedule, micro-batches, models."""
