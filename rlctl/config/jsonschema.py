"""A JSON schema of rlctl.toml, generated from the config dataclasses (for editors' TOML plugins)."""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass

from rlctl import __version__
from rlctl.config.schema import Config

_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array", dict: "object"}


def _field_schema(f) -> dict:
    default = f.default_factory() if f.default is MISSING else f.default
    meta = f.metadata
    out = {"description": meta.get("help", ""), "type": _TYPES[type(default)]}
    if isinstance(default, dict) and meta.get("table"):  # an algorithm's parameters: checked by validate
        out.update(default=default, additionalProperties=True)
        return out
    if isinstance(default, dict) and not meta.get("choices"):  # distill.teachers: any name -> a string
        out.update(default=default, additionalProperties={"type": "string"})
        return out
    if isinstance(default, dict):  # reward.weights: source name -> number
        out.update(default=default, additionalProperties=False,
                   properties={name: {"type": "number"} for name in meta.get("choices") or ()})
        return out
    if isinstance(default, tuple):
        out["items"] = {"type": "number" if meta.get("items") is float else "string"}
        if meta.get("choices"):
            out["items"]["enum"] = list(meta["choices"])
        out["default"] = list(default)
    else:
        out["default"] = default
        if meta.get("choices"):   # extensible: plugins may register other names, so only suggest these
            out["examples" if meta.get("extensible") else "enum"] = list(meta["choices"])
    number = out
    if meta.get("int_or_auto"):   # an integer within the bounds, or "auto"
        number = {"type": "integer"}
        out = {"description": out["description"], "default": default, "anyOf": [number, {"const": "auto"}]}
    for name, key in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum"), ("lt", "exclusiveMaximum")):
        if meta.get(name) is not None:
            number[key] = meta[name]
    return out


def _section_schema(cls, help_text: str = "") -> dict:
    props, required = {}, []
    for f in fields(cls):
        factory = f.default_factory
        if isinstance(factory, type) and is_dataclass(factory):
            props[f.name] = _section_schema(factory, f.metadata.get("help", ""))
        else:
            props[f.name] = _field_schema(f)
            if f.metadata.get("required"):
                required.append(f.name)
    out = {"type": "object", "additionalProperties": False, "properties": props}
    if help_text:
        out["description"] = help_text
    if required:
        out["required"] = required
    return out


def config_json_schema() -> dict:
    schema = _section_schema(Config)
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                   "$id": f"https://rlctl.dev/schema/rlctl-{__version__}.json",
                   "title": "rlctl.toml", "description": "rlctl training configuration",
                   "required": ["model", "data"]})
    return schema
