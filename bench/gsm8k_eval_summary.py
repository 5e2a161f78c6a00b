"""What a model's GSM8K answers look like, from the jsonl files `rlctl eval` writes: one row per file.

The strict `gsm8k` reward (verl's) scores only the number after a final `#### `; a small model moves
on the form before the sums, so this counts the steps between: answers with the `####` line, answers
whose last number is right (any form), answers cut at the token limit, mean answer tokens, and
`####` lines per answer (a policy paid for the line can learn to repeat it).

    python bench/gsm8k_eval_summary.py base=eval-base.jsonl seed0=eval-s0.jsonl ...
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rlctl.tasks.gsm8k import answer_lines, extract_answer

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    found = NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def summary(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    n = len(rows)
    mean = lambda values: sum(values) / n if n else 0.0  # noqa: E731   (of booleans: a share)
    return {
        "samples": n,
        "strict right": mean(r["correct"] for r in rows),
        "#### line": mean(extract_answer(r["response"]) is not None for r in rows),
        "#### lines per answer": mean(len(answer_lines(r["response"])) for r in rows),
        "last number right": mean(last_number(r["response"]) == str(r["ground_truth"]) for r in rows),
        "cut at the limit": mean(r.get("finish_reason") == "length" for r in rows),
        "mean tokens": mean(r.get("response_tokens", 0) for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="NAME=PATH of an `rlctl eval` jsonl")
    args = parser.parse_args()
    table = {}
    for item in args.files:
        name, _, path = item.rpartition("=")
        table[name or path] = summary(Path(path))
    columns = list(next(iter(table.values())))
    print("| model | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, row in table.items():
        cells = [str(v) if isinstance(v, int) else f"{v:.3f}" if k != "mean tokens" else f"{v:.1f}"
                 for k, v in row.items()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
