"""Splitting a model over ranks: FSDP, Ulysses sequence parallelism, expert parallelism (and MoE routing)."""
