"""Local stand-ins for the hub data sets tinker-cookbook's recipes load, in the hub's own layout and
columns, made offline from two-digit sums (small enough for SmolLM2-135M to learn on a CPU):

    OUT/openai/gsm8k/{train,test}.jsonl             question, answer ("... #### 68"): rl_loop
    OUT/HuggingFaceH4/no_robots/{train,test}.jsonl  prompt, prompt_id, messages, category: sl_loop
    OUT/Anthropic/hh-rlhf/{train,test}.jsonl        chosen, rejected ("\\n\\nHuman: ...\\n\\nAssistant: ..."): DPO

    python examples/tinker/cookbook_data.py data/cookbook --seed 0

`cookbook_local.py --data-dir OUT` answers the recipes' `datasets.load_dataset(<hub id>)` with these
files. Standard library only, so any Python runs it.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

# rl_loop appends this to each question and grades the \\boxed{} answer; the SL and DPO answers use
# the same form so one model can go through all three recipes.
BOXED = " Provide a numerical answer without units, written inside \\boxed{}."


def sums(rng: random.Random, n: int) -> list[tuple[int, int]]:
    return [(rng.randint(10, 49), rng.randint(10, 49)) for _ in range(n)]


def gsm8k_row(a: int, b: int) -> dict:
    return {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}


def no_robots_row(i: int, a: int, b: int) -> dict:
    question = f"What is {a} + {b}?{BOXED}"
    return {"prompt": question, "prompt_id": f"sum-{i}", "category": "Math",
            "messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}"}]}


def hh_rlhf_row(rng: random.Random, a: int, b: int) -> dict:
    wrong = a + b + rng.choice([-10, -2, -1, 1, 2, 10])
    prompt = f"\n\nHuman: What is {a} + {b}?{BOXED}\n\nAssistant:"
    return {"chosen": f"{prompt} {a} + {b} = {a + b}. \\boxed{{{a + b}}}",
            "rejected": f"{prompt} {a} + {b} = {wrong}. \\boxed{{{wrong}}}"}


def write(folder: Path, split: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0, help="which sums (the test split is the same for every seed)")
    ap.add_argument("--train", type=int, default=1024)
    ap.add_argument("--test", type=int, default=128)
    args = ap.parse_args()
    rng, test_rng = random.Random(args.seed), random.Random(10_000)
    for split, pairs in (("train", sums(rng, args.train)), ("test", sums(test_rng, args.test))):
        write(args.out / "openai" / "gsm8k", split, [gsm8k_row(a, b) for a, b in pairs])
        write(args.out / "HuggingFaceH4" / "no_robots", split, [no_robots_row(i, a, b) for i, (a, b) in enumerate(pairs)])
        write(args.out / "Anthropic" / "hh-rlhf", split, [hh_rlhf_row(rng, a, b) for a, b in pairs])
    print(f"wrote gsm8k, no_robots and hh-rlhf stand-ins ({args.train} train / {args.test} test rows) under {args.out}")


if __name__ == "__main__":
    main()
