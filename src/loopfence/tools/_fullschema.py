"""The complete JSON Schema check, for schemas the subset in _jsonschema cannot judge.

`validate_schema` (the subset) calls `full_problem` after its own checks pass, but only for a schema
that uses a keyword the subset does not know (`anyOf`, `$ref`/`$defs`, `pattern`, `format`,
`exclusiveMinimum`, `minItems`, ...): for every other schema the subset's verdict is complete, and
it stays the fast path. The check is `jsonschema` (the draft the schema declares, 2020-12 by
default; `format` checked; `$ref`s resolved only within the schema, never fetched), compiled once
per schema. Without the `jsonschema` package installed (it comes with loopfence[mcp] and [test]),
the subset alone decides, as before.

Tools declared by schema (MCP tools, drill canned tools) and the tools replay rebuilds from a log
header all go through here, so a call refused live is refused again on replay.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

__all__ = ["SchemaInvalid", "compile_schema", "full_problem", "needs_full", "schema_problem", "SUBSET_KEYWORDS"]

SUBSET_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minimum", "maximum",
    "minLength", "maxLength",
    # annotations: they validate nothing
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding",
})
_CACHE_SIZE = 512


class SchemaInvalid(ValueError):
    """A schema that is not valid JSON Schema."""


def needs_full(schema: Any) -> bool:
    """True when `schema` (or a schema inside it) uses a keyword the subset does not check, or a
    form of one it does not (a list of `items`)."""
    if isinstance(schema, bool):
        return schema is False
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key not in SUBSET_KEYWORDS:
            return True
        if key == "properties" and isinstance(value, dict) and any(needs_full(v) for v in value.values()):
            return True
        if key in ("items", "additionalProperties") and (isinstance(value, list) or needs_full(value)):
            return True
    return False


def compile_schema(schema: Any) -> Any:
    """A compiled validator (SchemaInvalid when the schema itself is broken; ImportError without
    jsonschema)."""
    from jsonschema import Draft202012Validator, SchemaError
    from jsonschema.validators import validator_for
    from referencing import Registry

    if not isinstance(schema, (dict, bool)):
        raise SchemaInvalid(f"a schema must be an object, got {type(schema).__name__}")
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise SchemaInvalid(exc.message) from None
    return cls(schema, registry=Registry(), format_checker=cls.FORMAT_CHECKER)


def schema_problem(validator: Any, value: Any, where: str) -> str | None:
    """None when `value` fits, else one message naming where it does not (jsonschema's best match)."""
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    try:
        error = best_match(validator.iter_errors(value))
    except Unresolvable as exc:
        return f"{where}: the schema has a $ref that does not resolve: {exc}"
    if error is None:
        return None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"{where}{path}: {error.message}"


class _Validators:
    """Compiled validators by schema identity (the schema object is kept, so its id stays its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def get(self, schema: Any) -> Any:
        key = id(schema)
        with self._lock:
            hit = self._by_id.get(key)
            if hit is not None and hit[0] is schema:
                self._by_id.move_to_end(key)
                return hit[1]
        try:
            compiled: Any = compile_schema(schema)
        except SchemaInvalid as exc:
            compiled = exc
        with self._lock:
            self._by_id[key] = (schema, compiled)
            while len(self._by_id) > _CACHE_SIZE:
                self._by_id.popitem(last=False)
        return compiled


_VALIDATORS = _Validators()


def full_problem(value: Any, schema: Any, where: str = "arguments") -> str | None:
    """The complete check of `value` against `schema`; None when it fits or jsonschema is missing."""
    try:
        validator = _VALIDATORS.get(schema)
    except ImportError:
        return None
    if isinstance(validator, SchemaInvalid):
        return f"{where}: the schema is not valid JSON Schema ({validator}); nothing can fit it"
    return schema_problem(validator, value, where)
