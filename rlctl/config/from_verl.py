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
import re
from dataclasses import dataclass
from typing import Any

from rlctl.config.verl_rules import ALSO_SETS, EMPTY_DEFAULTS, RULES, SAME, VERL_DEFAULTS, Rule
from rlctl.config.verl_script import Launch
from rlctl.config.verl_semantics import adjust
from rlctl.config.verl_sft import ENGINE_SFT_DEFAULTS, FSDP_SFT_DEFAULTS, SFT_DEFAULTS, SFT_RULES, torchrun_resources
from rlctl.errors import UsageError

_A = "actor_rollout_ref"


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


def rule_for(key: str, rules: tuple = RULES) -> Rule | None:
    """The rule of `key`: its own, else the first family (`prefix.*`) it belongs to."""
    exact = next((rule for rule in rules if rule.verl == key), None)
    return exact or next((rule for rule in rules if rule.verl.endswith(".*") and key.startswith(rule.verl[:-1])),
                         None)


@dataclass(frozen=True)
class KnownAlgorithms:
    """rlctl's registered algorithm names (given by the caller: config does not import algorithms)."""
    estimators: tuple = ()
    losses: tuple = ()
    grouped: frozenset = frozenset()   # estimators that compare samples of one prompt (need rollout.n >= 2)


@dataclass
class Conversion:
    values: dict            # rlctl key -> value
    sources: dict           # rlctl key -> the verl key (or "verl default") it came from
    not_honoured: list      # (verl key, value as written, why)


_TABLES = {"actor.loss_params": None, "algorithm.params": "gdpo_"}   # dict targets: leaf = the verl key's last word


def convert(launch: Launch, known: KnownAlgorithms) -> Conversion:
    """Map every override; UsageError for a key neither rlctl nor a `+key` addition accounts for."""
    _recipe_check(launch.entry, known)
    rules = SFT_RULES if launch.sft else RULES
    values = {key: parse_value(text) for key, text in launch.overrides}
    out, sources, skipped = {}, {}, []
    for key, text in launch.overrides:
        rule = rule_for(key, rules) or _unknown(key, rules, launch)
        _map(key, text, rule, values, launch.sft, (out, sources, skipped))
    for launch_key in launch.unresolved:
        skipped.append((launch_key, "$(...)", "its value comes from a shell command: set it by hand"))
    for option in launch.options:
        skipped.append((option, "", "hydra's own option: rlctl reads no verl YAML"))
    if launch.sft:
        _sft_defaults(out, sources, values, launch)
        return Conversion(out, sources, skipped)
    for target, (default, verl_key) in VERL_DEFAULTS.items():
        if target not in out and verl_key not in values:
            out[target], sources[target] = default, "verl default"
    _inherited(out, sources, values)
    megatron = any("megatron" in o for o in launch.options) or any(".megatron." in k for k in values)
    adjust(out, sources, values, skipped, megatron, known.grouped)
    return Conversion(out, sources, skipped)


def _unknown(key: str, rules: tuple, launch: Launch) -> Rule:
    """A key no rule names: listed when hydra adds it (`+key`: verl's code may never read it), else
    refused as verl's hydra refuses a key its config lacks."""
    if key in launch.added:
        return Rule(key, why="a +key addition with no rlctl equivalent")
    close = difflib.get_close_matches(key, [r.verl for r in rules if not r.verl.endswith("*")], n=1)
    raise UsageError(f"unknown verl key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                     hint="check the spelling against verl's trainer config (verl refuses a key it does not "
                          "have unless written +key); docs/verl.md lists every key rlctl reads.")


def _map(key: str, text: str, rule: Rule, values: dict, sft: bool, into: tuple) -> None:
    """One override into (out, sources, skipped): its rlctl key and value, or why it is not honoured."""
    out, sources, skipped = into
    if not rule.rlctl:
        skipped.append((key, text, rule.why))
        return
    if values[key] == "" and key in EMPTY_DEFAULTS and not sft:   # `trainer.nnodes=$NNODES`, NNODES unset
        values[key] = EMPTY_DEFAULTS[key]
        skipped.append((key, "''", f"empty in the launch (an unset environment variable?): verl's default "
                                   f"{EMPTY_DEFAULTS[key]} is written"))
    elif values[key] == "":
        skipped.append((key, "''", "empty in the launch (an unset environment variable?): rlctl's default "
                                   "applies; set it in the file"))
        return
    value = rule.convert(values[key], values) if rule.convert else values[key]
    if value is None:
        return
    if rule.rlctl in _TABLES:   # verl's policy_loss.<knob> -> [actor.loss_params] <knob>
        leaf = key.rsplit(".", 1)[1].removeprefix(_TABLES[rule.rlctl] or "")
        out.setdefault(rule.rlctl, {})[leaf] = value
        sources[rule.rlctl] = key
        return
    for target in (key if rule.rlctl == SAME else rule.rlctl, ALSO_SETS.get(key)):
        if target:
            out[target], sources[target] = value, key


def _recipe_check(entry: str, known: KnownAlgorithms) -> None:
    """`recipe.<name>.main_*`: converted when rlctl has <name> (an estimator, a loss, DAPO's preset
    or GMPO's geo_mean loss)."""
    m = re.search(r"recipe\.(\w+)\.main_\w+", entry)
    if not m or m.group(1) in ("dapo", "gmpo") or m.group(1) in known.estimators + known.losses:
        return
    raise UsageError(f"{entry} is verl's {m.group(1)} recipe trainer: rlctl has no {m.group(1)!r} algorithm "
                     "(rlctl's: " + ", ".join(known.estimators) + ")",
                     hint="start from the closest rlctl recipe (rlctl init --list), or register the algorithm "
                          "in a plugin (docs/algorithms.md).")


def _sft_defaults(out: dict, sources: dict, values: dict, launch: Launch) -> None:
    """verl's SFT defaults where rlctl's differ, then the GPUs torchrun starts."""
    engine = not launch.entry.endswith("fsdp_sft_trainer")
    defaults = {**SFT_DEFAULTS, **(ENGINE_SFT_DEFAULTS if engine else FSDP_SFT_DEFAULTS)}
    if engine:   # the engine trainer packs micro-batches by tokens unless data.use_dynamic_bsz=false
        defaults.pop("sft.micro_batch_max_tokens") if values.get("data.use_dynamic_bsz") is False else None
    for key, value in torchrun_resources(launch.launcher).items():
        if key not in out:
            out[key], sources[key] = value, "torchrun"
    for target, (default, verl_key) in defaults.items():
        if target not in out and verl_key not in values:
            out[target], sources[target] = default, "verl default"
    out["run.kind"], sources["run.kind"] = "sft", f"verl's SFT trainer ({launch.entry})"


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


def convert_launch(words: list[str], known: KnownAlgorithms, model: str | None = None
                   ) -> tuple[str, dict, Conversion]:
    """`rlctl config from-verl WORDS`: (the rlctl.toml text, its typed values, the conversion)."""
    from rlctl.config.verl_script import read_launch

    conversion = convert(read_launch(list(words)), known)
    if model:
        conversion.values["model.path"], conversion.sources["model.path"] = model, "--model"
    typed = checked(conversion)
    return to_toml(typed, conversion, words[0] if "=" not in words[0] else "verl overrides"), typed, conversion


def to_toml(typed: dict, conversion: Conversion, origin: str) -> str:
    """The rlctl.toml text, built as a tomlkit document (the loader's library) so every value is
    quoted as TOML needs: the mapped keys by table, each commented with the verl key it came from,
    and the keys rlctl does not honour as comments at the top."""
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment(_one_line(f"converted by `rlctl config from-verl` from {origin}")))
    if conversion.not_honoured:
        doc.add(tomlkit.comment("verl keys rlctl does not honour (docs/verl.md says why):"))
        for key, value, why in conversion.not_honoured:
            doc.add(tomlkit.comment("  " + _one_line(f"{key}={value}: {why}")))
    leaves = {}
    for key, value in typed.items():   # a table value ([actor.loss_params]) becomes its own table
        items = value.items() if key in _TABLES and isinstance(value, dict) else [(None, value)]
        for leaf, item in items:
            leaves[f"{key}.{leaf}" if leaf else key] = (item, conversion.sources[key])
    for key in sorted(leaves, key=_section_order):
        table, leaf = key.rsplit(".", 1)
        container = doc
        for part in table.split("."):
            if part not in container:
                container.add(part, tomlkit.table())
            container = container[part]
        value, source = leaves[key]
        item = tomlkit.item(list(value) if isinstance(value, tuple) else value)
        item.comment(_one_line(source))
        container.add(leaf, item)
    return tomlkit.dumps(doc)


def _one_line(text: str) -> str:
    """A comment's text on one line, without control characters (a NUL from a script stays out)."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())


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
    rows += ["", "verl's SFT trainers (`verl.trainer.fsdp_sft_trainer`, `verl.trainer.sft_trainer`): the keys", "",
             "| verl key | rlctl key | notes |", "|---|---|---|"]
    rows += [f"| `{r.verl}` | " + (f"`{r.rlctl}`" if r.rlctl else "not honoured") + f" | {r.why} |" for r in SFT_RULES]
    rows += ["", "and verl's SFT defaults written when a launch does not set the key:", "",
             "| rlctl key | verl's default | verl key |", "|---|---|---|"]
    rows += [f"| `{key}` | `{default}` | `{verl}` |" for key, (default, verl) in
             {**SFT_DEFAULTS, **FSDP_SFT_DEFAULTS}.items()]
    rows += [f"| `{key}` | `{default}` (`sft_trainer` only) | `{verl}` |" for key, (default, verl) in
             ENGINE_SFT_DEFAULTS.items()]
    return "\n".join(rows) + "\n"
