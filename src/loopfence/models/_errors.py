"""Error bodies -> named stops. One mapping for HTTP error responses and error events in a stream.

    context overflow   llama.cpp  {"error": {"type": "exceed_context_size_error", "n_prompt_tokens", "n_ctx"}}
                       OpenAI     {"error": {"code": "context_length_exceeded", "message": "...maximum
                                  context length is N tokens. However, your messages resulted in M..."}}
                       vLLM       {"error": {"message": "...maximum context length is N...", "code": 400}}
                                  or the flat {"object": "error", "message": ..., "code": 400}
                       -> CONTEXT_OVERFLOW, data {limit, value, ...} (the numbers the server gave)
    tool_use_failed    Groq's HTTP 400 (or stream error event) carrying the model's own bad call in
                       `failed_generation`. We never execute what the server refused. It stops with
                       the contract violation it describes, judged against the tools we sent:
                       a call to a tool not sent -> UNKNOWN_TOOL; a call to a known tool whose
                       arguments the server rejected -> SCHEMA_MISMATCH; a generation that is not a
                       JSON call at all (e.g. "maybe" when a tool was required) -> INVALID_JSON.
                       data carries the failed generation and the server's message.
    anything else      -> ENDPOINT_ERROR with the HTTP status and the server's message.

Messages pass through `redact` so a key echoed by a server never reaches a log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from .._json import loads
from .._stops import StopError, StopReason

__all__ = ["error_stop", "error_message", "is_context_overflow"]

_LIMIT = [re.compile(p, re.I) for p in (
    r"maximum context length is (\d+)", r"context size \((\d+) tokens?\)",
    r"context (?:window|length) (?:of|is) (\d+)")]
_VALUE = [re.compile(p, re.I) for p in (
    r"resulted in (\d+) tokens", r"you requested (\d+) tokens", r"request \((\d+) tokens?\)",
    r"request has (\d+) input tokens")]
_OVERFLOW_WORDS = ("context_length_exceeded", "exceed_context_size", "maximum context length",
                   "exceeds the available context size", "context window", "context length exceeded")


def _identity(text: str) -> str:
    return text


def error_message(body: Any, limit: int = 300) -> str:
    """The human part of an error body (nested `error.message`, flat `message`, or text)."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        text = err["message"]
    elif isinstance(err, str):
        text = err
    elif isinstance(body, dict) and isinstance(body.get("message"), str):
        text = body["message"]
    elif isinstance(body, (dict, list)):
        text = json.dumps(body, ensure_ascii=False)
    else:
        text = str(body)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fields(body: Any) -> dict[str, Any]:
    """The error object's fields (the wrapped `error` object, or the flat body)."""
    if isinstance(body, dict):
        err = body.get("error")
        return err if isinstance(err, dict) else body
    return {}


def is_context_overflow(body: Any) -> bool:
    f = _fields(body)
    tags = " ".join(str(f.get(k, "")) for k in ("type", "code")) + " " + error_message(body, 2000)
    low = tags.lower()
    return any(w in low for w in _OVERFLOW_WORDS)


def _first_int(patterns: list[re.Pattern[str]], text: str) -> int | None:
    for p in patterns:
        if m := p.search(text):
            return int(m.group(1))
    return None


def _overflow(status: int | None, body: Any, redact: Callable[[str], str]) -> StopError:
    f = _fields(body)
    text = error_message(body, 2000)
    data: dict[str, Any] = {"status": status}
    limit = f.get("n_ctx") if isinstance(f.get("n_ctx"), int) else _first_int(_LIMIT, text)
    value = f.get("n_prompt_tokens") if isinstance(f.get("n_prompt_tokens"), int) else \
        _first_int(_VALUE, text)
    if m := re.search(r"(\d+) in the messages, (\d+) in the completion", text):
        data["prompt_tokens"], data["completion_tokens"] = int(m.group(1)), int(m.group(2))
    if m := re.search(r"has (\d+) input tokens plus (\d+)", text):
        data["prompt_tokens"], data["completion_tokens"] = int(m.group(1)), int(m.group(2))
        value = int(m.group(1)) + int(m.group(2))
    if value is None and "prompt_tokens" in data:
        value = data["prompt_tokens"] + data.get("completion_tokens", 0)
    data.update(limit=limit, value=value)
    if isinstance(f.get("n_prompt_tokens"), int):
        data["n_prompt_tokens"] = f["n_prompt_tokens"]
    if isinstance(f.get("n_ctx"), int):
        data["n_ctx"] = f["n_ctx"]
    numbers = f"{value if value is not None else '?'} tokens requested, context window " \
              f"{limit if limit is not None else '?'}"
    where = f"HTTP {status}" if status else "stream error"
    return StopError(StopReason.CONTEXT_OVERFLOW,
                     f"the endpoint refused the prompt ({where}): {numbers}: {redact(error_message(body))}",
                     **data)


def _tool_use_failed(status: int | None, body: Any, tools: Iterable[str],
                     redact: Callable[[str], str]) -> StopError:
    f = _fields(body)
    gen = f.get("failed_generation")
    message = redact(error_message(body))
    data: dict[str, Any] = {"status": status, "code": "tool_use_failed",
                            "failed_generation": redact(gen) if isinstance(gen, str) else gen,
                            "message": message}
    call: Any = None
    if isinstance(gen, str):
        try:
            call = loads(gen)
        except ValueError:
            call = None
    elif isinstance(gen, dict):
        call = gen
    if isinstance(call, list) and call and isinstance(call[0], dict):
        call = call[0]
    name = call.get("name") if isinstance(call, dict) else None
    if not isinstance(name, str) or not name:
        shown = (gen if isinstance(gen, str) else json.dumps(gen))[:120]
        return StopError(StopReason.INVALID_JSON, f"the endpoint could not read the model's output as a "
                         f"tool call (tool_use_failed): {shown!r}: {message}", **data)
    data["name"] = name
    known = list(tools)
    if name not in known:
        return StopError(StopReason.UNKNOWN_TOOL, f"unknown tool {name!r} (tool_use_failed; sent: "
                         f"{', '.join(known) or 'none'}): {message}", **data)
    return StopError(StopReason.SCHEMA_MISMATCH, f"{name}: the endpoint rejected the arguments "
                     f"(tool_use_failed): {message}", **data)


def error_stop(status: int | None, body: Any, *, tools: Iterable[str] = (),
               redact: Callable[[str], str] = _identity) -> StopError:
    """The named stop for an error response body (parsed JSON, or text) or a stream error event."""
    f = _fields(body)
    if f.get("code") == "tool_use_failed" or f.get("type") == "tool_use_failed":
        return _tool_use_failed(status, body, tools, redact)
    if is_context_overflow(body):
        return _overflow(status, body, redact)
    where = f"HTTP {status}" if status else "error event in the stream"
    code = f.get("code") if isinstance(f.get("code"), (str, int)) else None
    return StopError(StopReason.ENDPOINT_ERROR, f"{where}: {redact(error_message(body))}",
                     status=status, code=code)
