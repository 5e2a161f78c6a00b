"""Multi-turn rollouts: tool-call formats, tools, interactions (see docs/multi-turn.md)."""
