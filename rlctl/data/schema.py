"""The verl-compatible row schema (docs/data.md, "The row format"), and checks that name the wrong column.

    data_source: str
    prompt: list<struct<role: str, content: str>>         the chat messages, last one the user's
    ability: str                                           (optional on read)
    reward_model: struct<style: str, ground_truth: str>
    extra_info: struct<split: str, index: int64, ...>      (optional on read; any extra fields)

pyarrow is imported inside functions so that `rlctl --help` stays light.
"""

from __future__ import annotations

from rlctl.errors import DataError

REQUIRED = ("data_source", "prompt", "reward_model")
OPTIONAL = ("ability", "extra_info")


def arrow_schema(extra_info: tuple = ()):
    """The schema `rlctl data prep` writes: extra_info carries split, index, question, answer, then a
    task's own `extra_info` fields ((name, pyarrow type) pairs: reasoning-gym's task and metadata)."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(message)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()),
                                  ("question", pa.string()), ("answer", pa.string()), *extra_info])),
    ])


def _is_str(t) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_truth(t) -> bool:
    import pyarrow as pa

    return _is_str(t) or pa.types.is_struct(t) or _is_list(t)


def _is_list(t) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)


def _struct_field_problems(t, column: str, wanted: dict) -> list[str]:
    """Problems with struct `column`'s fields; `wanted` maps field name -> (required, is_type, label)."""
    import pyarrow as pa

    if not pa.types.is_struct(t):
        return [f"column {column!r} is {t}, expected struct<{', '.join(wanted)}>"]
    names = [t.field(i).name for i in range(t.num_fields)]
    problems = []
    for name, (required, check, label) in wanted.items():
        if name not in names:
            if required:
                problems.append(f"column '{column}.{name}' is missing (expected {label})")
        elif not check(t.field(name).type):
            problems.append(f"column '{column}.{name}' is {t.field(name).type}, expected {label}")
    return problems


def schema_problems(schema) -> list[str]:
    """Every schema problem at once, each naming the exact column; empty when the schema fits."""
    import pyarrow as pa

    problems = [f"required column {c!r} is missing" for c in REQUIRED if c not in schema.names]
    for name in ("data_source", "ability"):
        if name in schema.names and not _is_str(schema.field(name).type):
            problems.append(f"column {name!r} is {schema.field(name).type}, expected string")
    if "prompt" in schema.names:
        t = schema.field("prompt").type
        if not _is_list(t):
            problems.append(f"column 'prompt' is {t}, expected list<struct<role: string, content: string>>")
        else:
            message = {"role": (True, _is_str, "string"), "content": (True, _is_str, "string")}
            problems += _struct_field_problems(t.value_type, "prompt[]", message)
    if "reward_model" in schema.names:
        # text, or a struct / list as verl's Search-R1 data writes it ({"target": [answers]})
        wanted = {"ground_truth": (True, _is_truth, "string (or a struct / list of answers)"),
                  "style": (False, _is_str, "string")}
        problems += _struct_field_problems(schema.field("reward_model").type, "reward_model", wanted)
    if "extra_info" in schema.names:
        wanted = {"split": (False, _is_str, "string"), "index": (False, pa.types.is_integer, "integer")}
        problems += _struct_field_problems(schema.field("extra_info").type, "extra_info", wanted)
    return problems


def value_problems(table) -> list[str]:
    """Row-level problems in a schema-valid table: nulls and empty prompts, with a row number."""
    import pyarrow.compute as pc

    checks = {
        "data_source": pc.is_null(table["data_source"]),
        "prompt": pc.fill_null(pc.less_equal(pc.list_value_length(table["prompt"]), 0), True),
        "prompt[].content": pc.is_null(pc.list_flatten(table["prompt"]).combine_chunks().field("content")),
        "reward_model.ground_truth": pc.is_null(pc.struct_field(table["reward_model"], "ground_truth")),
    }
    problems = []
    for column, bad in checks.items():
        count = pc.sum(bad).as_py() or 0
        if count:
            first = pc.index(bad, True).as_py()
            where = "message" if column == "prompt[].content" else "row"
            problems.append(f"column {column!r} is null or empty in {count} row(s) (first: {where} {first})")
    return problems


def validate_table(table, *, source: str = "table") -> None:
    """Raise DataError naming every wrong column of `table` (schema, then nulls); None if it fits."""
    problems = schema_problems(table.schema)
    if not problems:
        problems = value_problems(table)
    if problems:
        raise DataError(f"{source}: {'; '.join(problems)}",
                        hint="rows need data_source, prompt (chat messages) and reward_model.ground_truth; "
                             "`rlctl data prep` writes them.")
