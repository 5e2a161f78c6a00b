"""The chaos matrix: real faults at random moments in real `rlctl train` runs, and what each one cost.

    python bench/chaos.py [--rows "SUBSTRING;..."] [--seed N] [--work DIR]

Every row trains the tiny model on the CPU arith task (4 steps, a checkpoint every 2) in a
subprocess (`python -m rlctl train`, embedded Ray, run.max_restarts=2), strikes once, and reads
what happened: recovered in the same command (the restart line names the method the rank was in),
or a clean stop with its exit code, after which the cause is removed and `rlctl resume` finishes
the run. Steps lost: steps finished before the fault that had to be computed again. Equal: the final
weights (and the metrics rows, minus wall clock and run/restarts) are the uninterrupted run's, bit
for bit. Worker ranks are found as `ray::WorkerHost` processes under the run (tests/support/chaos.py);
the groups start in order (actor, then critic / reward model / rollout group), which names them.
Moments are random: a kill lands at a random point of the targeted phase, timed from the
uninterrupted run's `timing/*` metrics ("during save": the moment a .tmp-step_ folder appears).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.chaos import latest_step, metric_rows, worker_pids  # noqa: E402

BASE = ["resources.gpus_per_node=0", "data.max_response_length=8", "data.max_prompt_length=96", "data.val_files=[]",
        'data.train_files=["data/arith/train.parquet"]', "reward.workers=1", "reward.overlong.buffer_len=4",
        "model.dtype=float32", "model.gradient_checkpointing=false", "run.total_steps=4", "run.save_every=2",
        "run.keep_last=0", "actor.lr=1e-3", "data.batch_size=4", "actor.mini_batch_size=2",
        "actor.micro_batch_size=2", "critic.mini_batch_size=2", "critic.micro_batch_size=2"]
GRPO = ["resources.workers=2", "reward.function=arith", "rollout.n=2"]
SETUPS = {   # name: (recipe, overrides, worker ranks per group in start order)
    "grpo": ("grpo-gsm8k", GRPO, {"actor": 2}),
    "ppo": ("ppo-gsm8k", ["resources.workers=1", "resources.colocate=false", "reward.function=arith", "rollout.n=1",
                          "actor.micro_batch_size=1", "critic.micro_batch_size=1"], {"actor": 1, "critic": 1}),
    "offpolicy": ("grpo-gsm8k", ["resources.workers=1", "resources.rollout_workers=1", "rollout.mode=one_step_off",
                                 "reward.function=arith", "rollout.n=2"], {"actor": 1, "rollout": 1}),
    "rm": ("grpo-gsm8k", ["resources.workers=1", "resources.colocate=false", "reward.function=", "reward.model=rm",
                          "rollout.n=2"], {"actor": 1, "reward_model": 1}),
    "remote": ("grpo-gsm8k", GRPO[:1] + ["reward.function=", "reward.remote_url=URL", "reward.retries=1",
                                         "rollout.n=2"], {"actor": 2}),
}
VARIES = ("timing/", "perf/", "run/restarts")


@dataclass
class Row:
    name: str
    setup: str
    fault: str            # kill | sigterm | sigint | sigterm2 | disk | corrupt | service
    group: str = "actor"  # whose rank a kill hits
    phase: str = ""       # gen | ref | values | update_critic | update_actor | save
    result: dict = field(default_factory=dict)


ROWS = [Row("actor rank, generation", "grpo", "kill", "actor", "gen"),
        Row("actor rank, update", "grpo", "kill", "actor", "update_actor"),
        Row("actor rank, save", "grpo", "kill", "actor", "save"),
        Row("reference (in the actor ranks), ref log-probs", "grpo", "kill", "actor", "ref"),
        Row("critic rank, values", "ppo", "kill", "critic", "values"),
        Row("critic rank, update", "ppo", "kill", "critic", "update_critic"),
        Row("critic rank, save", "ppo", "kill", "critic", "save"),
        Row("one-step-off rollout rank, generation", "offpolicy", "kill", "rollout", "update_actor"),
        Row("one-step-off actor rank, save (batch in flight)", "offpolicy", "kill", "actor", "save"),
        Row("reward-model rank, scoring", "rm", "kill", "reward_model", "gen"),
        Row("SIGTERM to the controller", "grpo", "sigterm"),
        Row("Ctrl-C (SIGINT to the process group)", "grpo", "sigint"),
        Row("SIGTERM twice", "grpo", "sigterm2"),
        Row("disk full during a save", "grpo", "disk"),
        Row("newest checkpoint's shard corrupted, then a rank killed", "grpo", "corrupt", "actor", "gen"),
        Row("remote reward service killed", "remote", "service")]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def rlctl(proj: Path, *args, log: Path) -> subprocess.Popen:
    out = open(log, "a")
    return subprocess.Popen([sys.executable, "-m", "rlctl", *map(str, args)], cwd=proj, env=env(), stdout=out,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def make_project(work: Path, name: str, setup: str, model: Path, data: Path, url: str) -> tuple[Path, list[str]]:
    from rlctl.project import write_project

    recipe, overrides, _ = SETUPS[setup]
    proj = work / name
    write_project(proj, recipe, str(model))
    (proj / "data").mkdir()
    (proj / "data" / "arith").symlink_to(data)
    if setup == "rm":
        from rlctl.models.tiny import build_tiny_reward_model

        build_tiny_reward_model(proj / "rm", seed=3)
    return proj, BASE + [o.replace("URL", url) for o in overrides]


def rows_and_weights(run: Path, out: Path) -> tuple[list[dict], dict]:
    from safetensors.torch import load_file

    from rlctl.checkpoint.merge import export_hf

    rows = [{k: v for k, v in json.loads(line).items() if not k.startswith(VARIES)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]
    return rows, load_file(str(Path(export_hf(run, out)) / "model.safetensors"))


def equal(a: tuple, b: tuple) -> bool:
    import torch

    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


class Service:
    """tests/support/reward_server.py's service in a process of its own, on a fixed port."""

    def __init__(self, port: int):
        code = ("import sys, time; sys.path.insert(0, 'tests'); from support.reward_server import RewardService; "
                f"RewardService(port={port}).__enter__(); print('up', flush=True); time.sleep(1e9)")
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                                     text=True)
        self.proc.stdout.readline()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


ORDER = ["gen", "greedy_baseline", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"]


def phase_offset(ref_row: dict, phase: str, rng: random.Random) -> float:
    """Seconds after step 3 starts at which `phase` is under way (from the uninterrupted run)."""
    before = sum(ref_row.get(f"timing/{p}_s", 0.0) for p in ORDER[:ORDER.index(phase)])
    return before + rng.uniform(0.1, 0.9) * ref_row.get(f"timing/{phase}_s", 0.0)


def wait_until(condition, proc, timeout_s: float = 600) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(0.005)
    return False


def kill_rank(row: Row, proc, rng: random.Random) -> str:
    ranks = SETUPS[row.setup][2]
    pids = worker_pids(proc.pid)
    start = sum(n for g, n in ranks.items() if list(ranks).index(g) < list(ranks).index(row.group))
    victim = pids[start + rng.randrange(ranks[row.group])]
    os.kill(victim, signal.SIGKILL)
    return f"pid {victim}"


def strike(row: Row, proc, run: Path, ref_row: dict, rng: random.Random, ctx: dict) -> int:
    """Wait for the moment, strike; returns the steps finished when it struck."""
    ckpts = run / "checkpoints"
    first = 3 if row.fault == "corrupt" else 2
    if not wait_until(lambda: latest_step(run) >= first, proc):
        return -1
    if row.fault == "corrupt":   # one byte of the newest step's optimizer shard, same size
        shard = max((p for p in (ckpts / "step_3" / "actor" / "optim").rglob("*") if p.is_file()),
                    key=lambda p: p.stat().st_size)
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    if row.phase == "save":
        wait_until(lambda: any(ckpts.glob(".tmp-step_4-*")), proc)
        time.sleep(rng.uniform(0, 0.02))
    elif row.phase:
        time.sleep(phase_offset(ref_row, row.phase, rng))
    done = metric_rows(run)
    if row.fault in ("kill", "corrupt"):
        ctx["struck"] = kill_rank(row, proc, rng)
    elif row.fault == "service":
        ctx["service"].kill()
    elif row.fault == "disk" and "limit" in ctx:
        import resource

        for pid in worker_pids(proc.pid):   # no tmpfs: a file-size limit on the ranks
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (ctx["limit"], ctx["limit"]))
    elif row.fault.startswith("sig"):
        time.sleep(rng.uniform(0, 0.3 * ref_row.get("timing/step_s", 1.0)))   # early in step 3
        done = metric_rows(run)
        (os.killpg if row.fault == "sigint" else os.kill)(proc.pid, signal.SIGINT if row.fault == "sigint"
                                                          else signal.SIGTERM)
        if row.fault == "sigterm2":
            time.sleep(0.05)
            os.kill(proc.pid, signal.SIGTERM)
    return done


def restart_point(log: str) -> int | None:
    """The step the run went on from after the fault (the last "continuing/resuming from" line)."""
    import re

    found = re.findall(r"(?:continuing|resuming) from (?:checkpoint )?step (\d+)", log)
    return int(found[-1]) if found else None


def prepare_disk(proj: Path, ref_run: Path, ctx: dict) -> str:
    """A tmpfs at the project's runs/ that holds one checkpoint and the logs, not two (root only);
    else a file-size limit the ranks get after the first checkpoint."""
    step_bytes = sum(f.stat().st_size for f in (ref_run / "checkpoints" / "step_2").rglob("*") if f.is_file())
    runs = proj / "runs"
    runs.mkdir()
    size = int(step_bytes * 1.5) + (512 << 10)   # the logs and run files are a few KB
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(runs)],
                      capture_output=True).returncode == 0:
        ctx["mount"] = runs
        return f"tmpfs of {size / 2**20:.1f} MiB"
    largest = max(f.stat().st_size for f in (ref_run / "checkpoints" / "step_2").rglob("*") if f.is_file())
    ctx["limit"] = largest // 2
    return "RLIMIT_FSIZE"


def fix_cause(row: Row, ctx: dict) -> None:
    if "mount" in ctx:
        subprocess.run(["mount", "-o", "remount,size=512m", str(ctx["mount"])], check=True)
    if row.fault == "service":
        ctx["service"] = Service(ctx["port"])


def run_row(row: Row, work: Path, refs: dict, model: Path, data: Path, rng: random.Random) -> dict:
    ref_run, reference = refs[row.setup]
    ctx: dict = {}
    if row.setup == "remote":
        from rlctl.utils.net import free_port

        ctx["port"] = free_port("127.0.0.1")
        ctx["service"] = Service(ctx["port"])
    url = f"http://127.0.0.1:{ctx.get('port', 0)}/get_reward"
    proj, overrides = make_project(work, row.name.replace(" ", "_").replace(",", "").replace("'", ""), row.setup,
                                   model, data, url)
    how = prepare_disk(proj, ref_run, ctx) if row.fault == "disk" else ""
    if row.fault == "corrupt":
        overrides = overrides + ["run.save_every=1"]
    log, run = proj / "chaos.log", proj / "runs" / SETUPS[row.setup][0]
    ref_row = json.loads((ref_run / "metrics.jsonl").read_text().splitlines()[2])
    try:
        proc = rlctl(proj, "train", "rlctl.toml", *overrides, "run.max_restarts=2", "run.restart_backoff_s=1",
                     log=log)
        done = strike(row, proc, run, ref_row, rng, ctx)
        first = proc.wait()
        resumed = None
        if first != 0:   # steps it finished before stopping (a failed save stops at the end of its step)
            done = max(done, metric_rows(run))
            fix_cause(row, ctx)
            resumed = rlctl(proj, "resume", run, log=log).wait()
        text = log.read_text()
        point = restart_point(text)
        info = json.loads((run / "run.json").read_text())
        same = resumed in (None, 0) and equal(rows_and_weights(run, proj / "export"), reference)
    finally:
        if "service" in ctx:
            ctx["service"].kill()
        if "mount" in ctx:
            subprocess.run(["umount", str(ctx["mount"])], check=False)
    if first == 0:
        hit = next((line.split(": ", 1)[1].split(";")[0] for line in text.splitlines()
                    if line.startswith("restart ")), "?")
        what = f"recovered ({info.get('restarts')} restart): {hit}"
    else:
        last = [line for line in text.splitlines() if line.startswith("error:")]
        what = f"clean stop, exit {first}" + (f": {last[0][7:140]}" if last else "")
        what += "" if resumed is None else f"; resume exit {resumed}"
    return {"what": what + (f" [{how}]" if how else ""), "lost": max(0, done - point) if point is not None else "?",
            "equal": same}


def reference(setup: str, work: Path, model: Path, data: Path) -> tuple[Path, tuple]:
    ctx = {}
    if setup == "remote":
        from rlctl.utils.net import free_port

        ctx["port"] = free_port("127.0.0.1")
        service = Service(ctx["port"])
    proj, overrides = make_project(work, f"reference-{setup}", setup, model, data,
                                   f"http://127.0.0.1:{ctx.get('port', 0)}/get_reward")
    try:
        code = rlctl(proj, "train", "rlctl.toml", *overrides, log=proj / "chaos.log").wait()
    finally:
        if setup == "remote":
            service.kill()
    if code != 0:
        raise SystemExit(f"the uninterrupted {setup} run failed:\n{(proj / 'chaos.log').read_text()[-3000:]}")
    run = proj / "runs" / SETUPS[setup][0]
    return run, rows_and_weights(run, proj / "export")


def main() -> None:
    import tempfile

    from rlctl.models.tiny import build_tiny_model
    from rlctl.tasks.prep import PrepOptions, prepare

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="substrings of row names, separated by ; (default: all)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--work", default="", help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    wanted = [s.strip() for s in args.rows.split(";") if s.strip()]
    rows = [r for r in ROWS if not wanted or any(w in r.name for w in wanted)]
    work = Path(args.work or tempfile.mkdtemp(prefix="rlctl-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    model, data = work / "tiny", work / "arith"
    if not model.exists():
        build_tiny_model(model, layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
        prepare("arith", PrepOptions(out=data))
    print(f"chaos matrix, seed {args.seed}, runs under {work}", flush=True)
    refs = {s: reference(s, work, model, data) for s in dict.fromkeys(r.setup for r in rows)}
    for row in rows:
        start = time.monotonic()
        row.result = run_row(row, work, refs, model, data, rng)
        print(f"  {row.name}: {row.result} ({time.monotonic() - start:.0f}s)", flush=True)
    print("\n| fault | what happened | steps lost | final weights and rows equal to the uninterrupted run |")
    print("|---|---|---|---|")
    for row in rows:
        r = row.result
        print(f"| {row.name} ({row.setup}) | {r['what']} | {r['lost']} | {'yes' if r['equal'] else 'NO'} |")


if __name__ == "__main__":
    main()
