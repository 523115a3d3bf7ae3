"""MCP results and schemas, the fence's way.

- Arguments are checked against the tool's `inputSchema` before anything is sent, as for every
  tool declared by schema (tools/_jsonschema, and in full by jsonschema for any keyword beyond
  its subset: tools/_fullschema); the bound arguments (top-level defaults applied) make the
  canonical key.
- A result's content blocks become text (images, audio and binary resources as a one-line
  placeholder); the executor caps it with the same marker as every tool.
- `isError: true` becomes `{"ok": false, "error": "tool_error", ...}`, which the model can act on.
- A declared `outputSchema` is checked against `structuredContent` like a result model (a result
  that breaks it stops the run `schema_mismatch`, as for any tool's result model).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import BaseModel, RootModel, model_validator

from ..tools._fullschema import SchemaInvalid, compile_schema, schema_problem

__all__ = ["McpText", "output_model", "result_text", "success_text"]

_ABSENT = object()


class McpText(str):
    """A successful result's text, carrying the result's `structuredContent` for the output check."""

    structured: Any

    def __new__(cls, text: str, structured: Any = _ABSENT) -> McpText:
        self = super().__new__(cls, text)
        self.structured = structured
        return self


def result_text(content: Any) -> str:
    """The text of a result's content blocks, one after another."""
    parts = []
    for block in content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '?')}, {_decoded_size(block.data):,} bytes]")
        elif kind == "resource_link":
            about = " ".join(x for x in (getattr(block, "name", None), getattr(block, "description", None)) if x)
            parts.append(f"[resource link: {block.uri}" + (f" ({about})" if about else "") + "]")
        elif kind == "resource":
            res = block.resource
            if hasattr(res, "text"):
                parts.append(f"[resource {res.uri}]\n{res.text}")
            else:
                mime = getattr(res, "mime_type", None) or "application/octet-stream"
                parts.append(f"[resource {res.uri}: {mime}, {_decoded_size(res.blob):,} bytes]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    return "\n".join(parts)


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def success_text(result: Any) -> McpText:
    """A successful CallToolResult as the model sees it: its content's text, or its structured
    content as JSON when there is no content."""
    structured = result.structured_content if "structured_content" in result.model_fields_set or \
        result.structured_content is not None else _ABSENT
    text = result_text(result.content)
    if not text and structured is not _ABSENT:
        text = json.dumps(structured, ensure_ascii=False)
    return McpText(text, structured)


def _fits_fast(validator: Any, value: Any) -> bool:
    """The common case without building an error message; anything unusual goes the long way."""
    try:
        return bool(validator.is_valid(value))
    except Exception:  # noqa: BLE001 - e.g. a $ref that does not resolve: schema_problem names it
        return False


def output_model(tool_name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A result model checking an MCP result's structuredContent against the tool's outputSchema.
    Error results (dicts with ok false) are not checked: they carry no structured content."""
    try:
        validator = compile_schema(schema)
    except SchemaInvalid as exc:
        validator, broken = None, str(exc)

    class OutputSchema(RootModel[Any]):
        @model_validator(mode="after")
        def _fits(self) -> OutputSchema:
            value = self.root
            if not isinstance(value, McpText):
                return self
            if validator is None:
                raise ValueError(f"the server's outputSchema is not valid JSON Schema: {broken}")
            if value.structured is _ABSENT:
                raise ValueError("the tool declares an outputSchema but returned no structuredContent")
            problem = None if _fits_fast(validator, value.structured) else \
                schema_problem(validator, value.structured, "structuredContent")
            if problem:
                raise ValueError(problem)
            return self

    OutputSchema.__name__ = OutputSchema.__qualname__ = f"{tool_name}_outputSchema"
    return OutputSchema
