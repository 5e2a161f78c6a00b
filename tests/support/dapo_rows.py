"""DAPO-Math-17k / AIME-2024 hub files in their own layout (verl rows in DAPO's template, each problem
repeated as the hub's file repeats it), for the data prep tests, the DAPO run test and a by-hand run:

    PYTHONPATH=tests python -m support.dapo_rows DIR FILE REPEATS [N [FIRST]]   # DIR/data/FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

from support.parquet_rows import write_rows

from rlctl.tasks.math_dapo import dapo_prompt



def arithmetic(n: int, first: int = 0) -> list[tuple[str, str]]:
    """N distinct sums of two small numbers with their integer answers, from the FIRST-th on."""
    pairs = ((2 + i % 17, 3 + 7 * i % 31) for i in range(first, first + n))
    return [(f"What is {a} + {b}?", str(a + b)) for a, b in pairs]


ARITHMETIC = arithmetic(6)


def verl_rows(problems: list[tuple[str, str]], repeats: int) -> list[dict]:
    """Each (problem, answer) as the hub's DAPO-Math-17k row, the whole list `repeats` times over."""
    return [{"data_source": "math_dapo", "prompt": [{"content": dapo_prompt(q), "role": "user"}], "ability": "MATH",
             "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": f"{rep}-{i}"}}
            for rep in range(repeats) for i, (q, a) in enumerate(problems)]


def write_hub_copy(root: Path, name: str, repeats: int, problems: list[tuple[str, str]] = ARITHMETIC) -> Path:
    """A download of the hub repo: ROOT/data/NAME holding the rows; returns ROOT (prep's --source)."""
    write_rows(root / "data" / name, verl_rows(problems, repeats))
    return root


if __name__ == "__main__":
    root, name, repeats, *count = sys.argv[1:]
    problems = arithmetic(*map(int, count)) if count else ARITHMETIC
    print(write_hub_copy(Path(root), name, int(repeats), problems))
