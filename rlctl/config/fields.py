"""`opt`: a config field with its help text, bounds and allowed values, as rlctl.config.schema
declares every key (the loader, `config schema` and the docs read the metadata)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any, help: str, *, ge=None, gt=None, le=None, lt=None, choices=None,
        required: bool = False, path: bool = False, extensible: bool = False, items: type = str,
        int_or_auto: bool = False, table: bool = False) -> Any:
    """A config field with its help text, bounds and allowed values in `metadata`.

    extensible: `choices` are the built-in names; algorithm.plugins may register more, so the
    value is checked against the registry by validate, not against `choices` by the loader.
    items: the element type of a list field (str or float).
    int_or_auto: an integer (within the bounds) or the string "auto", which is resolved against
    the machine once at start-up (rlctl.runtime.checks.resolve_auto).
    table: a free-form table of scalars and lists (an algorithm's parameters), whose keys and types
    are checked by validate against the algorithm's declaration, not by the loader."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices,
            "required": required, "path": path, "extensible": extensible, "items": items,
            "int_or_auto": int_or_auto, "table": table}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    if isinstance(default, dict):  # an inline table (reward.weights): a fresh dict per config
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)
