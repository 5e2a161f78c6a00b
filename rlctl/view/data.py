"""What `rlctl view` shows, read from disk: no Textual, no HTML, no torch.

A source is one of
    a run folder (RL or SFT): metrics.jsonl (curves), rollouts/step_<N>.jsonl (run.log_rollouts:
        every sample with ids, mask and conversation) or else samples.jsonl (a few decoded samples a step);
    an `rlctl eval --out` file: one JSON line per sample (index, sample, prompt, response, score, correct...).
Reading is forgiving where a run is: a line cut off by a crash (or still being written) is skipped
and noted, an empty run is a view with nothing in it yet. A path that is neither is a UsageError
(exit 2) naming what a run folder holds.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.checkpoint.run_folder import METRICS_FILE, ROLLOUTS_DIR, SAMPLES_FILE, is_run_folder, read_run_info
from rlctl.errors import UsageError
from rlctl.view.samples import eval_sample, logged_sample, rollout_sample, run_slices


@dataclass
class RunView:
    """One source as the views show it. `samples`: normalised dicts (rlctl.view.samples)."""

    path: Path
    name: str
    kind: str                                    # "rl" | "sft" | "eval"
    info: dict = field(default_factory=dict)     # run.json ({} for an eval file)
    metrics: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # what was skipped and why, shown to the user
    tail: MetricsTail | None = None
    samples_loaded: bool = True                      # False: load_source(with_samples=False), read them later

    @property
    def metric_keys(self) -> list[str]:
        keys = {k for row in self.metrics for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        return sorted(keys)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        pairs = [(row["step"], float(row[key])) for row in self.metrics
                 if isinstance(row.get(key), (int, float)) and isinstance(row.get("step"), int)
                 and math.isfinite(row[key])]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def follow(self) -> int:
        """Append the metrics rows written since the last read (a run still training); returns how many."""
        if self.tail is None:
            return 0
        rows, reset = self.tail.poll()
        if reset:
            self.metrics = []
        self.metrics.extend(rows)
        return len(rows)


class MetricsTail:
    """Reads a growing JSONL file by offset: only complete lines are parsed; a partial last line waits
    for its newline (the writer flushes each step), and a file that shrank (resume truncated it) is
    read again from the start."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.stamp: tuple[int, int] | None = None
        self.bad_lines = 0

    def poll(self) -> tuple[list[dict], bool]:
        """(new rows, whether earlier rows were dropped because the file was rewritten)."""
        try:
            stat = self.path.stat()
        except OSError:
            return [], False
        stamp = (stat.st_size, stat.st_mtime_ns)
        if stamp == self.stamp:
            return [], False
        reset = stat.st_size < self.offset
        if reset:
            self.offset = 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.stamp = (self.offset, stat.st_mtime_ns) if len(complete) == len(chunk) else None
        rows = []
        for line in complete.decode("utf-8", errors="replace").splitlines():
            row = parse_line(line)
            if row is None:
                self.bad_lines += line.strip() != ""
            else:
                rows.append(row)
        return rows, reset

    def pending(self) -> bool:
        """True when the file ends in a line without its newline (cut off, or being written)."""
        try:
            return self.path.stat().st_size > self.offset
        except OSError:
            return False


def parse_line(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


def read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    """Rows of a JSONL file; unreadable lines are skipped and counted in `notes`."""
    rows, bad, last_bad = [], 0, False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            row = parse_line(line)
            last_bad = row is None and line.strip() != ""
            bad += last_bad
            if row is not None:
                rows.append(row)
    if bad:
        where = "the last line is cut off (the run stopped mid-write)" if bad == 1 and last_bad else \
            f"{bad} lines are not JSON objects"
        notes.append(f"{path.name}: {where}; skipped")
    return rows


def load_source(path: str | os.PathLike, *, with_samples: bool = True, decode: bool = False) -> RunView:
    """A run folder or an eval output file as a RunView; UsageError (exit 2) for anything else.
    `decode`: decode every logged response into its mask segments now (the HTML page), not on demand."""
    path = Path(path)
    if path.is_file() and path.suffix == ".jsonl":
        return load_eval(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist", hint="pass a run folder (runs/<name>) or an `rlctl eval --out` file.")
    if not path.is_dir() or not is_run_folder(path):
        raise UsageError(f"{path} is not a run folder (no run.json, metrics.jsonl or checkpoints/)",
                         hint="pass <output_dir>/<run name>, e.g. runs/my-run, or an `rlctl eval --out` .jsonl file.")
    return load_run(path, with_samples=with_samples, decode=decode)


def load_run(path: Path, *, with_samples: bool = True, decode: bool = False) -> RunView:
    info = read_run_info(path)
    view = RunView(path=path, name=info.get("name") or path.name, kind="rl", info=info)
    view.tail = MetricsTail(path / METRICS_FILE)
    view.metrics, _ = view.tail.poll()
    problems = ([f"{view.tail.bad_lines} lines are not JSON objects"] if view.tail.bad_lines else []) + \
        (["the last line is cut off"] if view.tail.pending() else [])
    if problems:
        view.notes.append(f"{METRICS_FILE}: {' and '.join(problems)}; skipped "
                          "(a line still being written is read once it is complete)")
    if any("train/loss" in row for row in view.metrics):
        view.kind = "sft"
    view.samples_loaded = with_samples
    if with_samples:
        view.samples = load_samples(path, view.notes, decode=decode)
    if not view.metrics:
        view.notes.append("no metrics yet: the run has not finished a step")
    return view


def load_samples(path: Path, notes: list[str], *, decode: bool = False) -> list[dict]:
    """Every sample of run.log_rollouts when the run logged them, else samples.jsonl's few per step."""
    files = rollout_files(path)
    if files:
        decoder = token_decoder(path) if decode else None
        return [s for file in files for s in read_rollout_file(file, notes, decoder)]
    if (path / SAMPLES_FILE).is_file():
        rows = read_jsonl(path / SAMPLES_FILE, notes)
        counts: dict[int, int] = {}
        out = []
        for row in rows:
            step = row.get("step") if isinstance(row.get("step"), int) else 0
            counts[step] = counts.get(step, 0) + 1
            out.append(logged_sample(row, step, counts[step] - 1))
        return out
    return []


def rollout_files(path: Path) -> list[Path]:
    """rollouts/step_<N>.jsonl of a run, by step."""
    folder = path / ROLLOUTS_DIR
    files = [f for f in folder.glob("step_*.jsonl") if _step_of(f) >= 0] if folder.is_dir() else []
    return sorted(files, key=_step_of)


# The token arrays of a rollout-log line, cut out as text before json.loads: parsing 5 x ~1000 numbers per
# sample into Python objects was most of the time to open a 64k-sample run, and the list only needs their
# length and the mask's runs (the tokens of one sample are read back when it is opened: token_record).
_ARRAYS = re.compile(r'"(prompt_ids|response_ids|response_mask|log_probs|advantages)": \[([^\]]*)\]')
_RUNS = re.compile(r"1+|0+")


def read_rollout_file(file: Path, notes: list[str], decoder=None) -> list[dict]:
    """The samples of one rollouts/step_<N>.jsonl; `decoder` given, each response decoded by mask runs
    (all of the file's runs in one batch: the tokenizers library decodes a batch on all cores)."""
    step, samples, bad, slices = _step_of(file), [], 0, []
    with open(file, encoding="utf-8", errors="replace") as f:
        for line in f:
            arrays: dict[str, str] = {}

            def cut(match, arrays=arrays):
                arrays[match.group(1)] = match.group(2)
                return f'"{match.group(1)}": []'
            rec = parse_line(_ARRAYS.sub(cut, line))
            if rec is None:
                bad += line.strip() != ""
                continue
            if "response_ids" not in arrays and isinstance(rec.get("response_ids"), list):   # not cut: other spacing
                arrays = {k: ", ".join(str(int(v)) for v in rec[k]) for k in ("response_ids", "response_mask",
                                                                              "log_probs", "advantages")
                          if isinstance(rec.get(k), list)}
            ids_text, mask = arrays.get("response_ids", ""), arrays.get("response_mask", "").replace(", ", "")
            runs = [[int(m.group()[0]), len(m.group())] for m in _RUNS.finditer(mask)]
            samples.append(rollout_sample(rec, step, len(samples), str(file), runs=runs,
                                          length=ids_text.count(",") + 1 if ids_text.strip() else 0,
                                          tokens=[k for k in ("log_probs", "advantages") if arrays.get(k)]))
            if decoder is not None and ids_text.strip():
                slices.append((samples[-1], json.loads(f"[{ids_text}]")))
    if slices:
        texts = iter(decoder([part for sample, ids in slices for part in run_slices(ids, sample["mask_runs"])]))
        for sample, _ids in slices:
            sample["segments"] = [[m, next(texts)] for m, _n in sample["mask_runs"]]
    if bad:
        notes.append(f"{file.parent.name}/{file.name}: {bad} lines are not JSON objects; skipped")
    return samples


def load_eval(path: Path) -> RunView:
    notes: list[str] = []
    rows = read_jsonl(path, notes)
    if rows and not all("score" in r and ("response" in r or "messages" in r) for r in rows[:5]):
        raise UsageError(f"{path} is not an `rlctl eval --out` file (its lines lack score and response)",
                         hint="pass a run folder, or the file `rlctl eval MODEL --data FILE --out OUT.jsonl` wrote.")
    view = RunView(path=path, name=path.stem, kind="eval", notes=notes)
    view.samples = [eval_sample(row, i) for i, row in enumerate(rows)]
    if not rows:
        notes.append(f"{path.name} has no samples")
    return view


def token_record(sample: dict) -> dict | None:
    """The rollout-log line a sample came from (its ids, mask and per-token arrays), or None."""
    if not sample.get("file"):
        return None
    try:
        rows = read_jsonl(Path(sample["file"]), [])
    except OSError:
        return None
    return rows[sample["i"]] if sample["i"] < len(rows) else None


@functools.lru_cache(maxsize=8)
def token_decoder(run_dir: Path):
    """A function [ids, ...] -> [text, ...] from the run's tokenizer.json (the `tokenizers` library, no
    transformers), or None when the run's model folder is not on this machine: masks are then counts only."""
    try:
        import tomllib
    except ImportError:   # Python 3.10
        import tomli as tomllib   # type: ignore[no-redef]
    try:
        config = tomllib.loads((run_dir / "config.resolved.toml").read_text(encoding="utf-8"))
        model = Path(config["model"]["path"])
    except (OSError, KeyError, TypeError, ValueError):
        return None
    candidates = [model / "tokenizer.json", *sorted(model.glob("hf/step_*/tokenizer.json"))]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(found))
    except Exception:   # an unreadable tokenizer only costs the token-level view
        return None
    return lambda batch: tokenizer.decode_batch(batch, skip_special_tokens=False)


def _step_of(path: Path) -> int:
    try:
        return int(path.stem.removeprefix("step_"))
    except ValueError:
        return -1
