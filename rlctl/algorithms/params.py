"""An algorithm's own parameters: a frozen dataclass declared beside its function.

`register_estimator(..., params=SpinParams)` / `register_policy_loss(..., params=SapoParams)` name
the dataclass; the config's free tables `[algorithm.params]` / `[actor.loss_params]` hold the user's
values, checked here against the declaration (unknown key with "did you mean", wrong type, the
dataclass's own bounds from `__post_init__`), every problem at once. The function then receives
the fields as keyword arguments, so adding a knob is one field beside the function.
Field types: bool, int, float (an int is accepted), str, tuple[str, ...], tuple[float, ...].
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import Mapping

from .errors import AlgorithmError


def check_params_class(owner: str, params) -> None:
    """At registration: `params` is None or a frozen dataclass whose every field has a default and a
    supported type (so the config can be checked against it and an empty table is valid)."""
    if params is None:
        return
    if not (isinstance(params, type) and dataclasses.is_dataclass(params)
            and params.__dataclass_params__.frozen):
        raise AlgorithmError(f"{owner}: params must be a frozen dataclass type, got {params!r}")
    hints = typing.get_type_hints(params)
    for f in dataclasses.fields(params):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise AlgorithmError(f"{owner}: parameter {f.name!r} of {params.__name__} needs a default")
        if _kind(hints[f.name]) is None:
            raise AlgorithmError(f"{owner}: parameter {f.name!r} has type {hints[f.name]!r}; use bool, int, float, "
                                 "str, tuple[str, ...] or tuple[float, ...]")


def params_problems(owner: str, params, values: Mapping) -> list[tuple[str, str]]:
    """Every problem of `values` against the dataclass `params` (None: takes no parameters), as
    (key, message) pairs: unknown keys (with did-you-mean), wrong types, then its own bounds."""
    values = dict(values or {})
    if params is None:
        return [(k, f"{owner} takes no parameters: remove it") for k in values]
    hints, known = typing.get_type_hints(params), [f.name for f in dataclasses.fields(params)]
    problems = []
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((key, f"unknown parameter of {owner}{hint}; known: {', '.join(known) or 'none'}"))
        elif (why := _type_problem(_kind(hints[key]), value)) is not None:
            problems.append((key, f"{owner}: {why}, got {type(value).__name__} {value!r}"[:200]))
    if not problems:
        try:
            params(**_coerced(params, values))
        except (ValueError, TypeError) as e:   # the dataclass's own bounds (__post_init__)
            problems.append(("", f"{owner}: {e}"))
    return problems


def make_params(owner: str, params, values: Mapping | None = None):
    """The dataclass instance for `values` (defaults for the rest), or None when `params` is None
    and nothing was given. AlgorithmError listing every problem otherwise."""
    problems = params_problems(owner, params, values or {})
    if problems:
        raise AlgorithmError("; ".join(f"{k}: {m}" if k else m for k, m in problems))
    return None if params is None else params(**_coerced(params, values or {}))


def params_kwargs(instance) -> dict:
    """The fields of a params instance as keyword arguments ({} for None)."""
    return {} if instance is None else {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}


def _kind(hint):
    if hint in (bool, int, float, str):
        return hint
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis and args[0] in (str, float):
            return (tuple, args[0])
    return None


def _type_problem(kind, value) -> str | None:
    if kind is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if kind is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "expected a finite number"
    if kind is str:
        return None if isinstance(value, str) else "expected a string"
    item = kind[1]
    if not isinstance(value, (list, tuple)):
        return f"expected a list of {'numbers' if item is float else 'strings'}"
    if item is float and not all(_type_problem(float, v) is None for v in value):
        return "expected a list of finite numbers"
    if item is str and not all(isinstance(v, str) for v in value):
        return "expected a list of strings"
    return None


def _coerced(params, values: Mapping) -> dict:
    hints, out = typing.get_type_hints(params), {}
    for key, value in values.items():
        kind = _kind(hints[key])
        if kind is float:
            value = float(value)
        elif isinstance(kind, tuple):
            value = tuple(float(v) for v in value) if kind[1] is float else tuple(value)
        out[key] = value
    return out
