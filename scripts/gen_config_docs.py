#!/usr/bin/env python3
"""Regenerate docs/config.md (every rlctl.toml key, its type, default and meaning) from the schema.

    python scripts/gen_config_docs.py          # write
    python scripts/gen_config_docs.py --check  # exit 1 if stale (tests/config/test_docs.py)
"""

from __future__ import annotations

import sys
from dataclasses import MISSING
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlctl.config.schema import iter_keys  # noqa: E402


def _default(f) -> str:
    value = f.default_factory() if f.default is MISSING else f.default
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {v!r}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _rules(meta) -> str:
    parts = []
    if meta.get("required"):
        parts.append("required")
    for name, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if meta.get(name) is not None:
            parts.append(f"{sign} {meta[name]}")
    if meta.get("int_or_auto"):
        parts.append('or `"auto"`')
    if meta.get("choices"):
        names = ", ".join(f"`{c}`" for c in meta["choices"])
        parts.append(f"built-in: {names}, or a name an `algorithm.plugins` file registers" if meta.get("extensible")
                     else "one of " + names)
    return "; ".join(parts)


def render() -> str:
    out = ["# rlctl.toml reference", "",
           "Generated from `rlctl/config/schema.py` by `scripts/gen_config_docs.py`; do not edit by hand.",
           "Every key can be overridden for one run as `section.key=value` after the config file",
           "(`rlctl train actor.lr=2e-6 rollout.n=8`). Paths are relative to the config file.",
           "`rlctl config schema` prints the same as a JSON schema for editors.", ""]
    section = None
    for key, f in iter_keys():
        sect = key.rsplit(".", 1)[0]
        if sect != section:
            section = sect
            out += ["", f"## [{sect}]", "", "| key | default | allowed | meaning |", "|---|---|---|---|"]
        name = key.rsplit(".", 1)[1]
        out.append(f"| `{name}` | `{_default(f)}` | {_rules(f.metadata)} | {f.metadata['help']} |")
    return "\n".join(out) + "\n"


def main(argv) -> int:
    path, text = ROOT / "docs" / "config.md", render()
    if "--check" in argv:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale; run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
