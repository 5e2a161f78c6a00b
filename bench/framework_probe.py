#!/usr/bin/env python3
"""What a framework example's agent earns on a model before any training: its command agent played on
arith rows through the endpoint `rlctl eval --agent` uses (rlctl.serve.eval_agent), no Ray, no training.

  .venv/bin/python bench/framework_probe.py FRAMEWORK --model-dir models/smollm2 --data data/arith/train.parquet \
      [--rows 8 --n 4 --temperature 0.7 --prompt-length 384 --response-length 256] [--step N]

--model-dir may be a run folder: its checkpoint (the newest, or --step N) is played, which is how a run
stopped before its last validation is scored the way that validation scores (--n 1 --temperature 0).

FRAMEWORK is a folder of examples/agents/frameworks; its agent.py runs in .venv-agents, as its
rlctl.toml runs it, against the model rendered with the tools template (smollm2-tools.jinja). Prints the
mean reward, the share of episodes whose calculator ran (agent/called), the calls per episode and each
failure reason with its count: a context-length 400 there means the example's data.max_prompt_length /
max_response_length are too small for what that framework sends. Used to pick the example that can
learn on SmolLM2 (a base reward inside (0, 1)) and to size those lengths (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from rlctl.config.rollout_tables import AgentConfig
    from rlctl.data.dataset import load_rows
    from rlctl.models.chat_template import bundled
    from rlctl.serve.eval_agent import evaluate_agent
    from rlctl.serve.source import model_folder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("framework", choices=sorted(d.name for d in (ROOT / "examples/agents/frameworks").iterdir()
                                               if (d / "agent.py").is_file()))
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--prompt-length", type=int, default=384)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--concurrency", type=int, default=16, help="episodes at once (the example's rollout.agent.concurrency)")
    p.add_argument("--step", type=int, default=None, help="a run folder's checkpoint step (default: the newest)")
    args = p.parse_args()

    rows = load_rows([Path(args.data)], "images")[: args.rows]
    opts = SimpleNamespace(dtype=args.dtype, chat_template=str(bundled("smollm2-tools.jinja")), top_p=1.0,
                           n=args.n, seed=0)
    # the example's own limits: calc.MAX_TURNS calls; a generous timeout, as the machine may be loaded
    agent = AgentConfig(command=(str(ROOT / ".venv-agents/bin/python"), "agent.py"), max_calls=4, timeout_s=900,
                        concurrency=args.concurrency)
    with model_folder(args.model_dir, args.step) as folder:
        scores, _, metrics, records = evaluate_agent(
            folder, rows, opts, args.temperature, (args.prompt_length, args.response_length), agent,
            ROOT / "examples/agents/frameworks" / args.framework)
    flat = [m for row in metrics for m in row]
    print(f"{args.framework}: {len(flat)} episodes, reward {sum(s for r in scores for s in r) / len(flat):.3f}, "
          f"called {sum(m.get('called', 0.0) for m in flat) / len(flat):.3f}, "
          f"calls {[int(m['calls']) for m in flat]}")
    reasons = collections.Counter(r["failure"].strip().splitlines()[-1][:200] for r in records if r["failure"])
    for reason, count in reasons.most_common():
        print(f"  failed x{count}: {reason}")


if __name__ == "__main__":
    main()
