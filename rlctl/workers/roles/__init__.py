"""The worker roles: one class per role, the role table (table.py) and start-up (groups.py)."""
