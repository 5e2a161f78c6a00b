"""How a batch is generated: the rollout table (`table.py`: each kind and what it is built with, each
environment library), its checks (`checks.py`), the `Rollout` protocol every kind implements and
the policy wrapper that holds one (`base.py`), and the single-turn kind (`single.py`)."""
