"""`rlctl config from-verl`: a verl launch's overrides -> rlctl.toml, every key accounted for.

rlctl.config.verl_rules.RULES is the one mapping (verl key or family -> rlctl key and conversion, or
why it is not honoured); docs/verl.md's key table is generated from it (tests/config/test_from_verl.py
keeps the page and the table equal).

verl's defaults that differ from rlctl's are written too when the launch relied on them
(VERL_DEFAULTS): a verl run without `algorithm.adv_estimator` is GAE, with 1,024 prompts a step.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from rlctl.config.verl_rules import ALSO_SETS, RULES, SAME, VERL_DEFAULTS

_A = "actor_rollout_ref"
from rlctl.config.verl_script import Launch
from rlctl.errors import UsageError


def parse_value(text: str) -> Any:
    """A hydra override value: true/false, null, numbers, [a, b] lists, quoted or bare strings."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t.lower() in ("null", "none", "~"):
        return None
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        return [parse_value(p) for p in inner.split(",")] if inner else []
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return t


def rule_for(key: str) -> Rule | None:
    for rule in RULES:
        if rule.verl == key or (rule.verl.endswith(".*") and key.startswith(rule.verl[:-1])):
            return rule
    return None


@dataclass
class Conversion:
    values: dict            # rlctl key -> value
    sources: dict           # rlctl key -> the verl key (or "verl default") it came from
    not_honoured: list      # (verl key, value as written, why)


def convert(launch: Launch) -> Conversion:
    """Map every override; UsageError for a key rlctl does not know as verl's."""
    values = {key: parse_value(text) for key, text in launch.overrides}
    out, sources, skipped = {}, {}, []
    for key, text in launch.overrides:
        rule = rule_for(key)
        if rule is None:
            close = difflib.get_close_matches(key, [r.verl for r in RULES if not r.verl.endswith("*")], n=1)
            raise UsageError(f"unknown verl key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                             hint="check the spelling against verl's trainer config; docs/verl.md lists every "
                                  "key rlctl reads.")
        if not rule.rlctl:
            skipped.append((key, text, rule.why))
            continue
        value = rule.convert(values[key], values) if rule.convert else values[key]
        if value is None:
            continue
        if rule.rlctl == "actor.loss_params":   # verl's policy_loss.<knob> -> [actor.loss_params] <knob>
            out.setdefault(rule.rlctl, {})[key.rsplit(".", 1)[1]] = value
            sources[rule.rlctl] = key
            continue
        for target in (key if rule.rlctl == SAME else rule.rlctl, ALSO_SETS.get(key)):
            if target:
                out[target], sources[target] = value, key
    for launch_key in launch.unresolved:
        skipped.append((launch_key, "$(...)", "its value comes from a shell command: set it by hand"))
    for option in launch.options:
        skipped.append((option, "", "hydra's own option: rlctl reads no verl YAML"))
    for target, (default, verl_key) in VERL_DEFAULTS.items():
        if target not in out and verl_key not in values:
            out[target], sources[target] = default, "verl default"
    _inherited(out, sources, values)
    return Conversion(out, sources, skipped)


def _inherited(out: dict, sources: dict, values: dict) -> None:
    """verl's defaults that follow other keys: overlong prompts stop the run unless filtered or
    truncated; a critic takes the actor's mini-batch, epochs, loss aggregation and token budget."""
    if "data.filter_overlong_prompts" not in values:
        truncate = values.get("data.truncation", "error") not in ("error", None)
        out["data.overlong_prompts"] = "truncate" if truncate else "error"
        sources["data.overlong_prompts"] = "verl default (data.truncation)" if truncate else "verl default"
    if out.get("algorithm.name") != "gae" and not any(k.startswith("critic.") for k in values):
        return
    follows = {"critic.mini_batch_size": "actor.mini_batch_size", "critic.ppo_epochs": "actor.ppo_epochs",
               "critic.loss_agg_mode": "actor.loss_agg_mode"}
    for critic_key, actor_key in follows.items():
        if critic_key not in out and actor_key in out:
            out[critic_key], sources[critic_key] = out[actor_key], f"verl default (the actor's {actor_key})"
    if "critic.micro_batch_max_tokens" not in out and "critic.use_dynamic_bsz" not in values and values.get(
            f"{_A}.actor.use_dynamic_bsz"):
        out["critic.micro_batch_max_tokens"] = int(values.get("critic.ppo_max_token_len_per_gpu", 32768))
        sources["critic.micro_batch_max_tokens"] = "verl default (the actor's use_dynamic_bsz)"


def checked(conversion: Conversion) -> dict:
    """rlctl's values typed by its schema; UsageError naming the verl key of the first that does not fit."""
    from rlctl.config.loader import LEAF_KEYS, check_value

    typed = {}
    for key, value in conversion.values.items():
        field = LEAF_KEYS.get(key)
        if field is None:   # a target another change has not added to the schema yet
            conversion.not_honoured.append((conversion.sources[key], str(value), f"{key} is not in this rlctl yet"))
            continue
        default = field.default if field.default_factory is dataclasses.MISSING else None
        if (isinstance(default, str) and not field.metadata.get("int_or_auto")
                and isinstance(value, (int, float)) and not isinstance(value, bool)):
            value = str(value)   # a text key given a number (rollout_rs_threshold=1.01), as hydra would keep it
        value, errors = check_value(key, field, value)
        if errors:
            raise UsageError(f"{conversion.sources[key]}={value!r}: {errors[0]} (rlctl's {key})",
                             hint="fix the value in the verl script or pass key=value after it.")
        typed[key] = list(value) if isinstance(value, tuple) else value
    return typed


def to_toml(typed: dict, conversion: Conversion, origin: str) -> str:
    """The rlctl.toml text: the mapped keys by table, each commented with the verl key it came from,
    and the keys rlctl does not honour as comments at the top."""
    import tomlkit

    lines = [f"# converted by `rlctl config from-verl` from {origin}"]
    if conversion.not_honoured:
        lines.append("# verl keys rlctl does not honour (docs/verl.md says why):")
        lines += [f"#   {key}={value}: {why}".rstrip() for key, value, why in conversion.not_honoured]
    tables: dict[str, list[str]] = {}
    for key in sorted(typed, key=_section_order):
        table, leaf = key.rsplit(".", 1)
        item = tomlkit.item(typed[key]).as_string()
        tables.setdefault(table, []).append(f"{leaf} = {item}  # {conversion.sources[key]}")
    for table, entries in tables.items():
        lines += ["", f"[{table}]", *entries]
    return "\n".join(lines) + "\n"


_ORDER = ("run", "model", "data", "algorithm", "actor", "critic", "rollout", "reward", "resources")


def _section_order(key: str) -> tuple:
    head = key.split(".")[0]
    return (_ORDER.index(head) if head in _ORDER else len(_ORDER), key.rsplit(".", 1)[0], key)


def key_table() -> str:
    """docs/verl.md's key table (markdown), generated from RULES and VERL_DEFAULTS."""
    rows = ["| verl key | rlctl key | notes |", "|---|---|---|"]
    for rule in RULES:
        target = f"`{rule.rlctl}`" if rule.rlctl else "not honoured"
        also = f", `{ALSO_SETS[rule.verl]}`" if rule.verl in ALSO_SETS else ""
        rows.append(f"| `{rule.verl}` | {target}{also} | {rule.why} |")
    rows += ["", "verl's defaults written when a launch does not set the key (rlctl's default differs):", "",
             "| rlctl key | verl's default | verl key |", "|---|---|---|"]
    rows += [f"| `{key}` | `{default}` | `{verl}` |" for key, (default, verl) in VERL_DEFAULTS.items()]
    rows += ["| `data.overlong_prompts` | `\"error\"` (`\"truncate\"` with `data.truncation` left / right) | "
             "`data.filter_overlong_prompts` |",
             "| `critic.mini_batch_size`, `critic.ppo_epochs`, `critic.loss_agg_mode` | the actor's | "
             "`critic.ppo_mini_batch_size`, ... (GAE runs) |",
             "| `critic.micro_batch_max_tokens` | 32768 when the actor's `use_dynamic_bsz` is on | "
             "`critic.use_dynamic_bsz` |"]
    return "\n".join(rows) + "\n"
