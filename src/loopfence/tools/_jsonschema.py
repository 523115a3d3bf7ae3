"""A small JSON-schema subset for tools declared by schema (drill canned tools, MCP-style tools).

Covers: type (incl. lists of types), properties, required, additionalProperties (bool or schema),
enum, const, items, minimum/maximum, minLength/maxLength. A schema using any other keyword (anyOf,
$ref, pattern, format, ...) is then checked in full by jsonschema (_fullschema), when installed.
"""

from __future__ import annotations

from typing import Any

from ._fullschema import full_problem, needs_full

__all__ = ["validate_schema", "apply_defaults", "json_type"]

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate_schema(value: Any, schema: dict[str, Any], where: str = "arguments") -> str | None:
    """None when `value` fits `schema`, else one message naming the first field that does not."""
    problem = _subset(value, schema, where)
    if problem is None and needs_full(schema):
        return full_problem(value, schema, where)
    return problem


def _subset(value: Any, schema: dict[str, Any], where: str) -> str | None:
    if not isinstance(schema, dict):
        return None
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        if not any(_TYPES.get(t, lambda v: True)(value) for t in names):
            return f"{where}: expected {' or '.join(names)}, got {json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r} is not one of {schema['enum']!r}"
    if "const" in schema and value != schema["const"]:
        return f"{where}: must be {schema['const']!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where}: {value} is below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where}: {value} is above the maximum {schema['maximum']}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{where}: shorter than {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where}: longer than {schema['maxLength']} characters"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _subset(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                return f"missing required argument {key!r}" if where == "arguments" else \
                    f"{where}: missing required key {key!r}"
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                problem = _subset(item, props[key], f"{where}.{key}" if where != "arguments" else key)
                if problem:
                    return problem
            elif extra is False:
                return f"unexpected argument {key!r}" if where == "arguments" else \
                    f"{where}: unexpected key {key!r}"
            elif isinstance(extra, dict):
                problem = _subset(item, extra, f"{where}.{key}")
                if problem:
                    return problem
    return None


def apply_defaults(args: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments with each property's `default` filled in where it was omitted."""
    out = dict(args)
    for key, prop in (schema.get("properties") or {}).items():
        if key not in out and isinstance(prop, dict) and "default" in prop:
            out[key] = prop["default"]
    return out


def json_type(value: Any) -> str:
    """The JSON name of a Python value's type, for messages ("integer", "object", ...)."""
    for name in ("null", "boolean", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    if isinstance(value, int):
        return "integer"
    return "number" if isinstance(value, float) else type(value).__name__
