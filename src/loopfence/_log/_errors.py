"""A run log that cannot be used, in words: `LogError` names the file and the line, and `problem` says
what a line's model (_log/_schema.py) refused ("reply event: field 'complete' must be a boolean")."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["LogError", "problem"]


class LogError(ValueError):
    """A run log that cannot be used: the message names the file and the line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}" if line > 0 else f"{path}: {message}")  # 0: not a line
        self.path = path
        self.line = line
        self.message = message


def problem(kind: str, exc: ValidationError) -> str:
    """The first thing wrong with a record, in words: "field 'ok' must be a boolean"."""
    err = exc.errors(include_url=False)[0]
    loc = [str(x) for x in err["loc"][1:]]  # [0] is the union's tag
    where = loc[0] + "".join(f"[{x}]" if x.isdigit() else f".{x}" for x in loc[1:]) if loc else "the line"
    typ, value = err["type"], err.get("input")
    if typ == "missing":
        return f"{kind} event: missing field {where!r}"
    if typ == "extra_forbidden":
        return f"{kind} event: unknown field {where!r}"
    if typ in ("enum", "literal_error"):
        name = "decision" if loc and loc[-1] in ("decision", "result") else loc[-1] if loc else "value"
        return f"{kind} event: unknown {name} {value!r} (field {where!r}; {err['msg'].lower()})"
    if typ in _TYPES:
        got = "a boolean" if isinstance(value, bool) else "null" if value is None else type(value).__name__
        return f"{kind} event: field {where!r} must be {_TYPES[typ]}, got {got}"
    return f"{kind} event: field {where!r}: {err['msg']}"


_TYPES = {"bool_type": "a boolean", "int_type": "an integer", "float_type": "a number",
          "string_type": "a string", "dict_type": "an object", "list_type": "an array",
          "model_type": "an object", "too_short": "[prompt, completion] integers",
          "too_long": "[prompt, completion] integers"}
