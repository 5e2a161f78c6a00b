"""What the Tinker protocol costs: forward_backward + optim_step and sample tokens/s through
`rlctl tinker` (the official SDK over HTTP, protobuf bodies, futures) against the same work done
in-process by the same engine objects the server uses (rlctl.tinker.training / sampling), and,
with --train-step, against an `rlctl train` step of the same shape on the same model.

    python bench/tinker_bench.py MODEL_DIR [--batch 8] [--length 128] [--steps 3] [--samples 8] [--tokens 32]
                                 [--train-step]

Starts `rlctl tinker` on a free port itself and stops it at the end. --train-step also runs
`rlctl train` in this process (embedded Ray, one rank, one CPU): GRPO with the same LoRA (rank 16,
alpha 32), one arith prompt x --samples samples of <= --tokens new tokens a step (the prompt asks
for the working, so answers run to the limit as the other sides' `stop=[]` samples do), one update
of those rows per step; its figures are the step's own phase timings (timing/gen_s for sampling,
timing/update_actor_s for forward + backward + optimizer step) over the tokens that step sampled
and trained on (prompt + response). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

URL = re.compile(r"Tinker API for .* on (http://[^ ;]+)")


def datums(n: int, length: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab - 10, size=length + 1) for _ in range(n)]


def through_server(model_dir: str, seqs, args) -> dict:
    import tinker
    from tinker import types

    cmd = [sys.executable, "-m", "rlctl", "tinker", "--model", model_dir, "--port", "0", "--state-dir", "/tmp/tinker-bench"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url = next(m.group(1) for line in proc.stderr if (m := URL.search(line)))
    try:
        service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        tc = service.create_lora_training_client(base_model=os.path.abspath(model_dir), rank=16, seed=0).result()
        data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1].tolist()),
                            loss_fn_inputs={"target_tokens": s[1:].tolist(), "weights": [1.0] * (len(s) - 1)}) for s in seqs]
        train_s = timed(args.steps, lambda: (tc.forward_backward(data, "cross_entropy").result(),
                                             tc.optim_step(types.AdamParams(learning_rate=1e-5)).result()))
        sampler = tc.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(seqs[0][:32].tolist())
        params = types.SamplingParams(max_tokens=args.tokens, temperature=1.0, stop=[], seed=1)
        sample_s = timed(args.steps, lambda: sampler.sample(prompt, args.samples, params).result())
        service.close("success").result()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"train_s": train_s, "sample_s": sample_s}


def in_process(model_dir: str, seqs, args) -> dict:
    from rlctl.tinker.base import BaseModel, LoraSpec
    from rlctl.tinker.sampling import Sampler, parse_params
    from rlctl.tinker.training import TrainingRun
    from rlctl.tinker.wire import Datum, ForwardBackward

    base = BaseModel(os.path.abspath(model_dir), model_dir)
    run = TrainingRun("bench", base, LoraSpec(16, seed=0))
    req = ForwardBackward("bench", 1, "cross_entropy", {}, False,
                          [Datum(s[:-1].astype(np.int64), {"target_tokens": s[1:].astype(np.int64),
                                                           "weights": np.ones(len(s) - 1, np.float32)}) for s in seqs])
    train_s = timed(args.steps, lambda: (run.forward_backward(req), run.optim_step({"learning_rate": 1e-5})))
    base.engine.put_adapter(base.snapshot(run.adapter, "bench"))
    sampler = Sampler("bench", base, "bench")
    params = parse_params({"max_tokens": args.tokens, "temperature": 1.0, "stop": [], "seed": 1}, base, 32, args.samples)
    sample_s = timed(args.steps, lambda: sample_now(sampler, seqs[0][:32].tolist(), params))
    base.engine.shutdown()
    return {"train_s": train_s, "sample_s": sample_s}


def sample_now(sampler, prompt: list[int], params) -> list:
    """One request on the sampling engine, waited for: what the server's asample runs."""
    import threading

    from rlctl.tinker.sampling import submit

    done, out = threading.Event(), []
    submit(sampler, prompt, params, lambda events: (out.append(events), done.set()))
    done.wait()
    return out[0]


TRAIN_TOML = """
[run]
name = "tinker-side"
output_dir = "runs"
seed = 0
total_steps = {total}
loggers = ["jsonl"]
log_samples = 0

[model]
path = "{model}"
dtype = "float32"
gradient_checkpointing = false
lora.rank = 16
lora.alpha = 32

[data]
train_files = ["data/train.parquet"]
max_prompt_length = 128
max_response_length = {tokens}
batch_size = 1

[algorithm]
name = "grpo"
dynamic_sampling.enable = false

[actor]
lr = 1e-5
ppo_epochs = 1
micro_batch_size = {samples}

[rollout]
engine = "hf"
n = {samples}
temperature = 1.0

[reward]
function = "arith_answer"
workers = 1

[resources]
workers = 1
cpus_per_worker = 1
"""


def train_step(model_dir: str, args) -> dict:
    """`rlctl train` steps of the same shape; the first (warm-up) step is dropped like timed()'s."""
    import tempfile
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training
    from rlctl.tasks import arith

    with tempfile.TemporaryDirectory(prefix="tinker-bench-train-") as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        rows = arith.generate(seed=0)["train"]
        for row in rows:   # "Reply with digits only" gets 2-token answers: sampling would be all prompt
            row["prompt"][0]["content"] = row["prompt"][0]["content"].replace("Reply with digits only.",
                                                                              "Explain each step in words.")
        pq.write_table(pa.Table.from_pylist(rows), root / "data" / "train.parquet")
        (root / "rlctl.toml").write_text(TRAIN_TOML.format(total=args.steps + 1, model=os.path.abspath(model_dir),
                                                           tokens=args.tokens, samples=args.samples))
        start_training(load_config(root / "rlctl.toml"), address=None, force=True)
        rows = [json.loads(line) for line in (root / "runs" / "tinker-side" / "metrics.jsonl").read_text().splitlines()]
    steps = rows[1:]
    sampled = [m["response_length/mean"] * m["data/sequences"] for m in steps]
    trained = [(m["response_length/mean"] + m["prompt_length/mean"]) * m["data/sequences"] for m in steps]
    gen = [m["timing/gen_s"] - m.get("timing/reward_s", 0.0) for m in steps]
    update = [m["timing/update_actor_s"] for m in steps]
    return {"train_tokens_per_s": round(float(np.median([t / u for t, u in zip(trained, update)])), 1),
            "sample_tokens_per_s": round(float(np.median([t / g for t, g in zip(sampled, gen)])), 1),
            "train_tokens": [round(t) for t in trained], "sample_tokens": [round(t) for t in sampled],
            "update_s": [round(x, 3) for x in update], "gen_s": [round(x, 3) for x in gen],
            "old_log_prob_s": [round(m.get("timing/old_log_prob_s", 0.0), 3) for m in steps],
            "step_s": [round(m["timing/step_s"], 3) for m in steps]}


def timed(steps: int, fn) -> list[float]:
    fn()   # warm-up: first-call allocations, the packed decode weights
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--train-step", action="store_true", help="also an `rlctl train` step of the same shape")
    args = ap.parse_args()
    from transformers import AutoConfig

    seqs = datums(args.batch, args.length, AutoConfig.from_pretrained(args.model).vocab_size)
    report = {"args": vars(args)}
    if args.train_step:   # first: the side a killed run would otherwise lose
        report["rlctl_train"] = train_step(args.model, args)
        print(json.dumps({"rlctl_train": report["rlctl_train"]}), flush=True)
    for name, fn in (("in_process", in_process), ("server", through_server)):
        r = fn(args.model, seqs, args)
        train_tokens, sample_tokens = args.batch * args.length, args.samples * args.tokens
        report[name] = {"train_tokens_per_s": round(train_tokens / float(np.median(r["train_s"])), 1),
                        "sample_tokens_per_s": round(sample_tokens / float(np.median(r["sample_s"])), 1),
                        "train_s": [round(x, 3) for x in r["train_s"]], "sample_s": [round(x, 3) for x in r["sample_s"]]}
        print(json.dumps({name: report[name]}), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
