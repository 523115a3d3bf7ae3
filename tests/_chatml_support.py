"""Tool schemas for the reply-grammar tests: every schema feature the grammar writes, and one it
does not (which falls back to any JSON value)."""

from __future__ import annotations

from typing import Any

__all__ = ["RICH_TOOLS", "FALLBACK_TOOLS"]


def _fn(name: str, parameters: dict[str, Any], description: str = "A tool. More words.") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# every schema feature the grammar writes
RICH_TOOLS = [
    _fn("pick", {"type": "object", "additionalProperties": False, "required": ["mode", "tags"], "properties": {
        "mode": {"enum": ["fast", "slow", 3, None]}, "tags": {"type": "array", "items": {"type": "string"}},
        "limit": {"type": "integer"}, "ratio": {"type": "number"}, "dry": {"type": "boolean"},
        "nothing": {"type": "null"}, "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "maybe": {"type": ["string", "null"]}, "fixed": {"const": "v1"},
        "nested": {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}},
    }}),
    _fn("no_args", {"type": "object", "properties": {}, "additionalProperties": False}),
    _fn("all_optional", {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                                                          "c": {"type": "boolean"}}}),
    _fn("open_object", {"type": "object"}),
]
FALLBACK_TOOLS = [_fn("with_ref", {"type": "object", "required": ["r"], "properties": {"r": {"$ref": "#/$defs/x"}},
                                   "$defs": {"x": {"type": "string"}}})]
