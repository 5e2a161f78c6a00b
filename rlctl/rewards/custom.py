"""Load a reward function and check what it returns (verl's `compute_score` contract).

`reward.function = ""` picks the built-in scorers by each sample's `data_source`;
`reward.function = "gsm8k"` (a built-in's name) uses that scorer for every sample;
`reward.function = "reward.py:compute_score"` loads a user file resolved relative to the config
file's folder. Either way the result is one callable `fn(data_source, solution_str, ground_truth,
extra_info)` returning a float or a dict with `score` plus extra metrics. Loading runs in the
controller (to fail at startup with exit 2) and again once in every reward worker process.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlctl.errors import ConfigError, UsageError

VERL_SIGNATURE = "compute_score(data_source, solution_str, ground_truth, extra_info=None)"
BUILTIN_MODULE = "rlctl.rewards.builtin"
BUILTIN_FN = "default_compute_score"
_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


@dataclass(frozen=True)
class RewardSpec:
    """Where the reward function lives: a user file (`path`) or the built-ins (`path is None`).

    For the built-ins, `fn_name` is a scorer's name ("gsm8k") or "" to choose by data_source.
    """

    path: Path | None
    fn_name: str
    format_score: float = 0.0
    sandbox_url: str = ""  # built-in code reward: run on this SandboxFusion service

    @property
    def label(self) -> str:
        if self.path is None:
            return f"built-in {self.fn_name!r} scorer" if self.fn_name else "built-in scorers"
        return f"{self.path}:{self.fn_name}"


def parse_spec(function_spec: str, config_dir: Path, format_score: float = 0.0, sandbox_url: str = "") -> RewardSpec:
    """`""` -> built-ins by data_source; `"gsm8k"` -> that built-in; `"path/to/file.py:fn"` -> that
    file, relative to `config_dir`."""
    spec = function_spec.strip()
    if not spec:
        return RewardSpec(None, "", format_score, sandbox_url)
    if spec.replace("-", "_").isidentifier():   # a built-in's name: "gsm8k", "calc-tools"
        return RewardSpec(None, spec, format_score, sandbox_url)
    file, sep, fn_name = spec.rpartition(":")
    if not sep or not file or not fn_name:
        raise ConfigError(f"reward.function = {function_spec!r} is not \"file.py:function\"",
                          hint='write e.g. reward.function = "reward.py:compute_score", "gsm8k", '
                               'or "" for the built-ins.')
    path = Path(file).expanduser()
    if not path.is_absolute():
        path = Path(config_dir) / path
    return RewardSpec(path.resolve(), fn_name, format_score, sandbox_url)


def load_reward_fn(spec: RewardSpec) -> Callable[[str, str, Any, Any], Any]:
    """Import the function and return `call(data_source, solution_str, ground_truth, extra_info)`.

    Raises ConfigError (exit 2) naming the file and function when the file is missing, does not
    import, lacks the function, or the function cannot take verl's four arguments.
    """
    if spec.path is None:
        return _load_builtin(spec.fn_name, spec.format_score, spec.sandbox_url)
    module = _import_file(spec.path, spec.fn_name)
    fn = getattr(module, spec.fn_name, None)
    where = f"reward function {spec.path.name}:{spec.fn_name}"
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"{where}: {spec.path} has no {spec.fn_name!r}",
                          hint=f"functions there: {', '.join(public) or 'none'}; fix reward.function.")
    if not callable(fn):
        raise ConfigError(f"{where} is {_short(fn)}, not a function",
                          hint=f"define def {VERL_SIGNATURE}.")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{where} is async; reward functions must be plain functions",
                          hint="remove `async` (rewards already run in parallel worker processes).")
    return _adapt_call(fn, where)


def _import_file(path: Path, fn_name: str):
    from rlctl.plugins import import_checked

    # once per process: the file may also be an algorithm.plugins file
    return import_checked(path, f"reward function {path.name}:{fn_name}", relative_to="reward.function")


def _adapt_call(fn: Callable, where: str) -> Callable:
    """Call by keyword when the parameter names are verl's (verl does), else by position."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a C function without a signature: trust it
        return lambda ds, sol, gt, extra: fn(ds, sol, gt, extra)
    try:
        sig.bind(**dict.fromkeys(_ARGS))
        return lambda ds, sol, gt, extra: fn(data_source=ds, solution_str=sol, ground_truth=gt, extra_info=extra)
    except TypeError:
        pass
    try:
        sig.bind(*([None] * len(_ARGS)))
        return lambda ds, sol, gt, extra: fn(ds, sol, gt, extra)
    except TypeError:
        raise ConfigError(f"{where} has the signature {fn.__name__}{sig}, which cannot take verl's four arguments",
                          hint=f"define def {VERL_SIGNATURE}.") from None


def _load_builtin(name: str, format_score: float, sandbox_url: str = "") -> Callable:
    """`default_compute_score` (by data_source) or the built-in called `name`."""
    try:
        module = importlib.import_module(BUILTIN_MODULE)
    except ImportError as e:  # a broken install, not a user mistake
        raise ConfigError(f"the built-in reward scorers could not be imported: {e}",
                          hint='reinstall rlctl, or set reward.function = "reward.py:compute_score".') from e
    try:
        fn = module.resolve_builtin(name) if name else getattr(module, BUILTIN_FN)
    except UsageError as e:
        raise ConfigError(f"reward.function: {e.message}", hint=e.hint) from None
    return lambda ds, sol, gt, extra: fn(ds, sol, gt, extra, format_score=format_score, sandbox_url=sandbox_url)


def check_builtin_sources(spec: RewardSpec, data_sources) -> None:
    """Built-ins by data_source: ConfigError (exit 2) before scoring a source no built-in knows."""
    if spec.path is not None or spec.fn_name:
        return
    from rlctl.rewards.builtin import scorer_for_source

    for source in sorted(set(data_sources)):
        try:
            scorer_for_source(source)
        except UsageError as e:
            raise ConfigError(f"reward.function = \"\": {e.message}", hint=e.hint) from None


def normalize_score(value: Any) -> tuple[float, dict[str, float], list[str]]:
    """(score, numeric extras, names of dropped non-numeric extras) from a float or a dict.

    Raises ValueError with a short reason when the value is no finite number (NaN, None, a string,
    a dict without `score`): the runner turns that into a sample error.
    """
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"returned a dict without 'score' (keys: {', '.join(map(str, value)) or 'none'})")
        score = _finite(value["score"], "score")
        extras, dropped = {}, []
        for key, extra in value.items():
            if key == "score":
                continue
            number = _as_number(extra)
            if number is None:
                dropped.append(str(key))
            else:
                extras[str(key)] = number
        return score, extras, dropped
    return _finite(value, "score"), {}, []


def _as_number(value: Any) -> float | None:
    if value is None or isinstance(value, (str, bytes, dict, list, tuple)):
        return None
    try:
        return float(value)  # int, bool, numpy scalars, 0-d arrays and tensors
    except (TypeError, ValueError):
        return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(value: Any, what: str) -> float:
    number = _as_number(value)
    if number is None:
        raise ValueError(f"returned {what} = {_short(value)} ({type(value).__name__}), not a number")
    if not math.isfinite(number):
        raise ValueError(f"returned {what} = {number}, not a finite number")
    return number
