"""Rule scorers for the built-in tasks: pure Python (re only), safe to run in a process pool."""
