"""Read rlctl.toml + dotted overrides into the typed `Config`, reporting every problem at once.

Pass 1 (here) checks the file alone: syntax, unknown keys ("did you mean"), types, ranges, enum
values and required keys. Cross-field rules and checks against the machine live beside the
code that reads those keys, gathered by `rlctl.validate`. Nothing raises on the first problem:
all are collected, then one ConfigError carries the list (exit 2).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from rlctl.config.names import MOVED_KEYS

RESOLVED_CONFIG = "config.resolved.toml"   # rlctl.checkpoint.manifest.CONFIG_FILE (config imports no checkpoint)
from rlctl.config.schema import Config, iter_keys
from rlctl.config.verl_names import known_rename
from rlctl.errors import ConfigError, UsageError

MAX_CONFIG_BYTES = 1 << 20  # a real rlctl.toml is a few KiB; anything this big is a mistake
MAX_INT = 2**53  # beyond this an "int" setting is a typo (and floats lose it)
LEAF_KEYS = {key: f for key, f in iter_keys()}


@dataclass(frozen=True)
class Problem:
    """One thing wrong: a config key (or a data file's `file:line`) and what is wrong with it.
    `kind` names the sort of problem where a report counts them (data prep: "malformed JSON")."""

    key: str
    message: str
    line: int | None = None
    severity: str = "error"  # or "warning"
    kind: str = ""

    def format(self, source: str = "") -> str:
        where = f"{source}:{self.line}: " if source and self.line else (f"{source}: " if source else "")
        return f"{where}{self.key}: {self.message}" if self.key else f"{where}{self.message}"

    def __str__(self) -> str:
        return self.format()

    def placed(self, source: str, lines: dict) -> str:
        """format(), naming "overrides" instead of the file when the key (or its table) was set on
        the command line: `lines` maps such keys to None (LoadedConfig.lines)."""
        key = self.key
        while key:
            if key in lines:
                return self.format("overrides" if lines[key] is None else source)
            key = key.rpartition(".")[0]
        return self.format(source)


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    path: Path | None  # None when built from overrides alone
    raw: dict  # the user's own keys (after overrides)
    problems: tuple = ()  # warnings; with strict=False also the errors (their keys keep defaults)
    lines: dict = dataclasses.field(default_factory=dict)  # dotted key -> its line in the file (None: overridden)

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()


def read_toml_text(path: Path) -> str:
    """The file's text, or a one-line UsageError for a missing, huge, binary or non-file path."""
    sections = {key.split(".")[0] for key in LEAF_KEYS}
    if not path.exists() and str(path).split(".")[0] in sections and re.fullmatch(r"\w+(\.\w+)+", str(path)):
        raise UsageError(f"{path} is neither a config file nor a setting: a setting needs `=`",
                         hint=f"write {path}=VALUE (no spaces around `=`), e.g. run.total_steps=2.")
    if not path.exists():
        raise UsageError(f"config file {path} not found",
                         hint="run `rlctl init DIR --recipe NAME` to create one, or pass its path.")
    if path.is_dir():
        raise UsageError(f"{path} is a folder, not a config file",
                         hint=f"pass the TOML file, e.g. {path / 'rlctl.toml'}.")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise UsageError(f"{path} is {size / 2**20:.1f} MiB; an rlctl config is a small TOML file",
                         hint="check that you passed the right file.")
    data = path.read_bytes()
    if b"\x00" in data:
        raise UsageError(f"{path} is a binary file, not TOML", hint="pass the rlctl.toml file.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start})", hint="save it as UTF-8.") from None


def parse_toml(text: str, source: str) -> dict:
    import tomlkit
    from tomlkit.exceptions import ParseError, TOMLKitError

    try:
        return tomlkit.parse(text).unwrap()
    except ParseError as e:
        raise UsageError(f"{source}:{e.line}: invalid TOML: {_parse_reason(e)}",
                         hint="fix the syntax at that line (strings need quotes, tables need [brackets]).") from None
    except (TOMLKitError, ValueError, OverflowError) as e:
        raise UsageError(f"{source}: invalid TOML: {e}") from None


def _parse_reason(e) -> str:
    reason = re.sub(r"\s+at line \d+ col \d+$", "", str(e))
    if reason.endswith("'\\x00'"):   # tomlkit's end-of-text marker: something opened was never closed
        return "the file ends inside something never closed (a [ list, a { table or a quoted string)"
    if reason.endswith("'\\n'"):
        return "the line ends too early (an unclosed [table] header, [ list, { table or quote?)"
    return reason


def key_lines(text: str) -> dict[str, int]:
    """Map dotted keys to the 1-based line that sets them (tomlkit keeps no positions)."""
    lines, table = {}, ""
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if m := re.match(r"^\[\s*([A-Za-z0-9_.\-\s\"']+?)\s*\]", s):
            table = m.group(1).replace(" ", "").replace('"', "").replace("'", "")
            lines.setdefault(table, no)
        elif m := re.match(r"^([A-Za-z0-9_.\-\"']+)\s*=", s):
            key = m.group(1).replace('"', "").replace("'", "")
            lines.setdefault(f"{table}.{key}" if table else key, no)
    return lines


def parse_override(word: str) -> tuple[str, Any]:
    """`section.key=value` -> (dotted key, value); the value is read as TOML, else as a string."""
    if "=" not in word:
        raise UsageError(f"override {word!r} is not section.key=value", hint="e.g. actor.lr=1e-6 rollout.n=8")
    key, text = word.split("=", 1)
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", key):
        raise UsageError(f"override key {key!r} is not a dotted section.key", hint="e.g. actor.lr=1e-6")
    import tomlkit

    try:
        value = tomlkit.parse(f"v = {text}").unwrap()["v"]
    except Exception:
        value = text  # a bare word: a string such as a path or an enum value
    field = LEAF_KEYS.get(key)
    if (field is not None and isinstance(_default(field), str) and not field.metadata.get("int_or_auto")
            and not isinstance(value, (str, list, dict))):
        value = text.strip()  # typed by the schema: run.name=123 or =2024-01-01 is the text as written
    return key, value


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            d[p] = nxt = {}
        d = nxt
    d[parts[-1]] = value


def suggest(word: str, options) -> str:
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def suggest_key(key: str, *options) -> str:
    """"did you mean" for an unknown dotted key: rlctl's name for a verl name first, then the
    closest spelling among each of `options` in turn."""
    rename = known_rename(key, LEAF_KEYS)
    if rename is not None:
        return f" (did you mean {rename!r}? rlctl's name for it)"
    return next((hint for hint in (suggest(key, o) for o in options) if hint), "")


def check_value(key: str, f: dataclasses.Field, value: Any) -> tuple[Any, list[str]]:
    """Coerce a TOML value to the field's type; return (value, problems)."""
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    meta = f.metadata
    kind = type(default)
    if meta.get("int_or_auto"):
        if value == "auto":
            return value, []
        if isinstance(value, bool) or not isinstance(value, int):
            bound = f" >= {meta['ge']}" if meta.get("ge") is not None else ""
            return value, [f"expected an integer{bound} or \"auto\", got {_show(value)}"]
        kind = int
    if kind is bool:
        if not isinstance(value, bool):
            return value, [f"expected true or false, got {_show(value)}"]
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return value, [f"expected an integer, got {_show(value)}"]
        if abs(value) > MAX_INT:
            return value, [f"{value} is implausibly large (limit {MAX_INT})"]
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value, [f"expected a number, got {_show(value)}"]
        if not math.isfinite(value) or abs(value) > 1e30:
            return value, [f"{value} is not a usable finite number"]
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            return value, [f"expected a string, got {_show(value)}"]
    elif kind is tuple and meta.get("items", str) is float:
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  and math.isfinite(v) for v in value):
            return value, [f"expected a list of finite numbers, got {_show(value)}"]
        value = tuple(float(v) for v in value)
    elif kind is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return value, [f"expected a list of strings, got {_show(value)}"]
        value = tuple(value)
    elif kind is dict:
        return _check_table(meta, value)
    return value, _bounds(meta, value)


def _check_table(meta, value) -> tuple[Any, list[str]]:
    """A dict field: an algorithm's free parameter table, distill.teachers or reward.weights."""
    if meta.get("table"):  # an algorithm's parameters: checked by validate against its dataclass
        bad = [k for k, v in value.items() if not _plain(v)] if isinstance(value, dict) else None
        if bad is None or bad:
            return value, [f"expected a table of numbers, booleans, strings or lists of them, got "
                           f"{_show(value if bad is None else value[bad[0]])}"]
        return dict(value), []
    if not meta.get("choices"):  # distill.teachers: names -> strings
        if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
            return value, [f"expected a table of names to non-empty strings, such as {{ math = \"models/t\" }}, "
                           f"got {_show(value)}"]
        return dict(value), []
    # reward.weights: names -> finite numbers
    if not isinstance(value, dict):
        return value, [f"expected an inline table such as {{ function = 1.0 }}, got {_show(value)}"]
    problems = []
    for name, weight in value.items():
        if name not in meta.get("choices", ()):
            problems.append(f"{name!r} is not one of {', '.join(map(repr, meta['choices']))}"
                            f"{suggest(str(name), meta['choices'])}")
        elif isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            problems.append(f"{name} = {_show(weight)} is not a finite number")
    return {k: float(v) for k, v in value.items() if not problems}, problems


def _plain(value) -> bool:
    scalar = (bool, int, float, str)
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))


def _bounds(meta, value) -> list[str]:
    problems = []
    choices = meta.get("choices")
    if choices and not meta.get("extensible"):
        bad = [v for v in (value if isinstance(value, tuple) else (value,)) if v not in choices]
        for v in bad:
            problems.append(f"{v!r} is not one of {', '.join(map(repr, choices))}{suggest(str(v), choices)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for name, sign, ok in (("ge", ">=", lambda b: value >= b), ("gt", ">", lambda b: value > b),
                               ("le", "<=", lambda b: value <= b), ("lt", "<", lambda b: value < b)):
            bound = meta.get(name)
            if bound is not None and not ok(bound):
                problems.append(f"must be {sign} {bound}, got {value}")
    return problems


def _show(value) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def _leaf_paths(table: dict, prefix: str) -> list[str]:
    out = []
    for k, v in table.items():
        out += _leaf_paths(v, f"{prefix}.{k}") if isinstance(v, dict) and v else [f"{prefix}.{k}"]
    return out


def build_section(cls, raw: dict, prefix: str, problems: list[Problem], lines: dict) -> Any:
    """Instantiate dataclass `cls` from `raw`, appending problems instead of raising."""
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for name, value in raw.items():
        key = prefix + name
        if name not in known and key in MOVED_KEYS:
            table, leaf = MOVED_KEYS[key][0].rsplit(".", 1)
            problems.append(Problem(key, f"moved to [{table}] {leaf}: write `{leaf} = {json.dumps(value)}` under "
                                         f"[{table}] (each algorithm's parameters live in its own table)",
                                    lines.get(key)))
            continue
        if name not in known:
            options = [k for k in LEAF_KEYS if k.startswith(prefix)] + [prefix + n for n in known]
            if isinstance(value, dict) and value:   # a misspelt section: name its keys (acter.lr -> actor.lr)
                for inner in _leaf_paths(value, key):
                    problems.append(Problem(inner, f"unknown key{suggest_key(inner, LEAF_KEYS, options)}",
                                            lines.get(inner, lines.get(key))))
                continue
            problems.append(Problem(key, f"unknown key{suggest_key(key, options, LEAF_KEYS)}",
                                    lines.get(key)))
            continue
        f = known[name]
        sub = f.default_factory if isinstance(f.default_factory, type) and is_dataclass(f.default_factory) else None
        if sub is not None:
            if not isinstance(value, dict):
                problems.append(Problem(key, f"expected a [{key}] table, got {_show(value)}", lines.get(key)))
                continue
            kwargs[name] = build_section(sub, value, key + ".", problems, lines)
            continue
        value, errs = check_value(key, f, value)
        problems.extend(Problem(key, e, lines.get(key)) for e in errs)
        if not errs:
            kwargs[name] = value
    for f in fields(cls):
        if f.name in raw:
            continue
        if isinstance(f.default_factory, type) and is_dataclass(f.default_factory):
            kwargs[f.name] = build_section(f.default_factory, {}, prefix + f.name + ".", problems, lines)
        elif f.metadata.get("required"):
            problems.append(Problem(prefix + f.name, f"missing required key ({f.metadata['help']})",
                                    lines.get(prefix.rstrip("."))))
    return cls(**kwargs)


def load_config(path: str | Path | None, overrides: list[str] | tuple = (), *, strict: bool = True) -> LoadedConfig:
    """Read, override and type-check a config; raise ConfigError listing every problem.

    With strict=False, key errors are returned in `problems` instead (the bad keys keep their
    defaults), so `config validate` can add the cross-field problems and report all at once.
    """
    raw, lines, source = {}, {}, "overrides"
    if path is not None:
        path = Path(path)
        text = read_toml_text(path)
        source = str(path)
        raw = parse_toml(text, source)
        lines = key_lines(text)
        if path.name == RESOLVED_CONFIG:
            migrate_moved_keys(raw)
    for word in overrides:
        key, value = parse_override(word)
        set_dotted(raw, key, value)
        # an overridden key's problems are the override's: no file line, nor its table's line
        lines = {k: v for k, v in lines.items() if k != key and not k.startswith(key + ".")}
        lines[key] = None
    problems: list[Problem] = []
    config = build_section(Config, raw, "", problems, lines)
    errors = [p for p in problems if p.severity == "error"]
    if errors and strict:
        raise ConfigError(f"{len(errors)} problem(s) in {source}", [p.placed(source, lines) for p in errors])
    return LoadedConfig(config=config, path=path.resolve() if path else None, raw=raw, problems=tuple(problems),
                        lines=lines)


def migrate_moved_keys(raw: dict) -> None:
    """A run's config.resolved.toml written before the algorithms' parameters moved into their tables
    holds every old flat key: move each into its table when the run's algorithm reads it, else drop it."""
    for old, (new, owner) in MOVED_KEYS.items():
        section, key = old.split(".")
        table = raw.get(section)
        if not isinstance(table, dict) or key not in table:
            continue
        value = table.pop(key)
        used = raw.get("actor", {}).get("policy_loss") if section == "actor" else table.get("name")
        if used == owner and value not in ((), [], 0.0):   # an empty / zero old default means "unset"
            set_dotted(raw, new, value)


def find_config(path: str | Path | None) -> Path:
    """The config to use: the given file, DIR/rlctl.toml for a folder, else ./rlctl.toml."""
    if path is None:
        return Path("rlctl.toml")
    p = Path(path)
    return p / "rlctl.toml" if p.is_dir() and (p / "rlctl.toml").is_file() else p


def config_to_dict(config) -> dict:
    """The resolved config as plain TOML-able values (tuples become lists)."""
    out = {}
    for f in fields(config):
        v = getattr(config, f.name)
        out[f.name] = config_to_dict(v) if is_dataclass(v) else (list(v) if isinstance(v, tuple) else v)
    return out
