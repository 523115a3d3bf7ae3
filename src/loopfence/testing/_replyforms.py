"""Reply forms of the fake server: validation, loading, and rendering to an HTTP plan.

The forms are documented in `_fakeserver`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import JsonFileError, load_json_items

__all__ = ["FAULTS", "SHAPES", "FormError", "Plan", "validate_form", "load_forms", "overflow_body",
           "response_to_chunks", "render"]

FAULTS = ("slow_stream", "stall", "reset", "truncated", "missing_done", "empty_stream", "error_event",
          "close", "rate_limit", "server_error", "invalid_json", "overflow", "tool_use_failed",
          "empty_choices", "anonymous_call")
SHAPES = ("llama.cpp", "openai", "vllm", "vllm_flat")


class FormError(ValueError):
    """A reply form the fake server cannot serve; the message says why."""


# -- forms -------------------------------------------------------------------------------------
_FAULT_NUMBERS: dict[str, Any] = {"delay_s": (int, float), "at": (int, float), "after": int,
                                  "n_prompt_tokens": int, "n_ctx": int}  # a fault's numeric settings


def validate_form(form: Any) -> None:
    if not isinstance(form, dict):
        raise FormError(f"a reply form must be a JSON object, got {type(form).__name__}")
    if "fault" in form:
        if form["fault"] not in FAULTS:
            raise FormError(f"unknown fault {form['fault']!r} (known: {', '.join(FAULTS)})")
        if form["fault"] == "overflow" and form.get("shape", "llama.cpp") not in SHAPES:
            raise FormError(f"unknown overflow shape {form.get('shape')!r} (known: {', '.join(SHAPES)})")
        for name, kind in _FAULT_NUMBERS.items():
            value = form.get(name)
            if name in form and (isinstance(value, bool) or not isinstance(value, kind) or value < 0):
                raise FormError(f"fault {form['fault']}: {name!r} must be "
                                f"{'an integer' if kind is int else 'a number'} >= 0, got {value!r}")
        if isinstance(form.get("reply"), dict):
            validate_form(form["reply"])
        return
    if "status" in form:
        if not isinstance(form["status"], int) or not 100 <= form["status"] <= 599:
            raise FormError(f"status must be an HTTP status code, got {form['status']!r}")
        return
    if "chunks" in form:
        if not isinstance(form["chunks"], list):
            raise FormError("chunks must be a list of chunk objects (or raw strings)")
        return
    if "sse" in form:
        if not isinstance(form["sse"], str):
            raise FormError("sse must be a string (the raw event-stream body)")
        return
    if "choices" in form:
        return
    raise FormError("unknown reply form: expected a response object (with choices), chunks, sse, "
                    "status or fault")


def load_forms(path: str | Path) -> list[dict[str, Any]]:
    """Reply forms from a JSON array or JSONL file. Errors name the file and line."""
    try:
        return load_json_items(path, validate_form, "script")
    except JsonFileError as exc:
        raise FormError(str(exc)) from None


def overflow_body(shape: str = "llama.cpp", n_prompt_tokens: int = 5000, n_ctx: int = 4096) -> dict[str, Any]:
    """A context-overflow error body as each server family sends it (HTTP 400)."""
    if shape == "llama.cpp":
        return {"error": {"code": 400, "message": f"request ({n_prompt_tokens} tokens) exceeds the available "
                          f"context size ({n_ctx} tokens), try increasing it",
                          "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx}}
    if shape == "openai":
        return {"error": {"message": f"This model's maximum context length is {n_ctx} tokens. However, your "
                          f"messages resulted in {n_prompt_tokens} tokens. Please reduce the length of the "
                          "messages.", "type": "invalid_request_error", "param": "messages",
                          "code": "context_length_exceeded"}}
    msg = (f"This model's maximum context length is {n_ctx} tokens. However, you requested "
           f"{n_prompt_tokens} tokens ({n_prompt_tokens - 100} in the messages, 100 in the completion). "
           "Please reduce the length of the messages or completion.")
    flat = {"object": "error", "message": msg, "type": "BadRequestError", "param": None, "code": 400}
    if shape == "vllm_flat":
        return flat
    if shape == "vllm":
        return {"error": {k: v for k, v in flat.items() if k != "object"}}
    raise FormError(f"unknown overflow shape {shape!r} (known: {', '.join(SHAPES)})")


def response_to_chunks(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A response object as the chunks a streaming server would send (arguments in two fragments)."""
    base = {"id": obj.get("id", "chatcmpl-fake"), "object": "chat.completion.chunk",
            "model": obj.get("model", "fake")}

    def chunk(delta: dict[str, Any], finish: Any = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    choices = obj.get("choices") or []
    if not choices:
        return [{**base, "choices": []}]
    choice = choices[0]
    msg = choice.get("message") or {}
    out = [chunk({"role": "assistant", "content": None})]
    if msg.get("content"):
        text = msg["content"]
        out += [chunk({"content": text[: len(text) // 2]}), chunk({"content": text[len(text) // 2:]})]
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") or {}
        head: dict[str, Any] = {"index": i, "type": "function", "function": {"name": fn.get("name"), "arguments": ""}}
        if tc.get("id"):
            head["id"] = tc["id"]
        out.append(chunk({"tool_calls": [head]}))
        args = fn.get("arguments")
        if isinstance(args, str):
            for piece in (args[: len(args) // 2], args[len(args) // 2:]):
                if piece:
                    out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        elif args is not None:
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args}}]}))
    out.append(chunk({}, choice.get("finish_reason")))
    if obj.get("usage"):
        out.append({**base, "choices": [], "usage": obj["usage"]})
    return out


# -- rendering ---------------------------------------------------------------------------------
@dataclass
class Plan:
    """What one request gets: status, headers, body parts, and how to send them."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[bytes] = field(default_factory=list)
    stream: bool = False  # SSE: chunked transfer encoding, connection closed after
    delay_s: float = 0.0  # before each part
    stall_s: float = 0.0  # before the headers
    reset_after: int | None = None  # parts sent before a TCP reset
    truncate_at: float | None = None  # fraction of the body sent under a full Content-Length
    close: bool = False  # no response at all


def _event(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return ("data: " + text.replace("\n", "\ndata: ") + "\n\n").encode()


def _sse(chunks: Sequence[Any], done: bool = True) -> Plan:
    parts = [_event(c) for c in chunks] + ([b"data: [DONE]\n\n"] if done else [])
    return Plan(headers={"Content-Type": "text/event-stream"}, parts=parts, stream=True)


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Plan:
    body = obj if isinstance(obj, bytes) else (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode())
    ctype = "application/json" if not isinstance(obj, str) or status >= 400 else "text/plain"
    return Plan(status, {"Content-Type": ctype, **(headers or {})}, [body])


def _inner(form: dict[str, Any], streaming: bool) -> Plan:
    if isinstance(form.get("reply"), dict):
        return render(form["reply"], streaming)
    if "chunks" in form:
        return _sse(form["chunks"], form.get("done", True))
    if "sse" in form:
        return Plan(headers={"Content-Type": "text/event-stream"}, parts=_split_sse(form["sse"]), stream=True)
    return render({"choices": [{"index": 0, "message": {"role": "assistant", "content": "late reply"},
                                 "finish_reason": "stop"}]}, streaming)


def _split_sse(text: str) -> list[bytes]:
    pieces = text.split("\n\n")
    parts = [(p + "\n\n").encode() for p in pieces[:-1]]
    return parts + ([pieces[-1].encode()] if pieces[-1] else [])


def render(form: dict[str, Any], streaming: bool) -> Plan:
    fault = form.get("fault")
    if fault is None:
        if "status" in form:
            body = form.get("body", {"error": {"message": f"HTTP {form['status']}", "code": form["status"]}})
            return _json(body, form["status"], {str(k): str(v) for k, v in (form.get("headers") or {}).items()})
        if "chunks" in form or "sse" in form:
            return _inner(form, streaming)
        return _sse(response_to_chunks(form)) if streaming else _json(form)
    if fault in ("slow_stream", "stall", "reset", "truncated"):
        plan = _inner(form, streaming)
        if fault == "slow_stream":
            plan.delay_s = float(form.get("delay_s", 0.2))
        elif fault == "stall":
            plan.stall_s = float(form.get("delay_s", 1.0))
        elif fault == "reset":
            plan.reset_after = int(form.get("after", max(1, len(plan.parts) // 2)))
        else:
            plan.truncate_at = float(form.get("at", 0.5))
        return plan
    if fault == "missing_done":
        return _sse(form.get("chunks", []), done=False)
    if fault == "empty_stream":
        return Plan(headers={"Content-Type": "text/event-stream"}, parts=[], stream=True)
    if fault == "error_event":
        body = form.get("body", {"error": {"message": "internal error while generating", "code": 500}})
        plan = _sse(form.get("chunks", []), done=False)
        plan.parts.append(b"event: error\n" + _event(body))
        return plan
    if fault == "close":
        return Plan(close=True)
    if fault == "rate_limit":
        ra = form.get("retry_after", 1)
        body = form.get("body", {"error": {"message": "Rate limit reached, please try again later.",
                                           "type": "requests", "code": "rate_limit_exceeded"}})
        return _json(body, 429, {"Retry-After": str(ra)})
    if fault == "server_error":
        status = int(form.get("status", 500))
        return _json(form.get("body", {"error": {"message": "internal server error", "code": status}}), status)
    if fault == "invalid_json":
        return Plan(200, {"Content-Type": "application/json"}, [str(form.get("body", '{"choices": [')).encode()])
    if fault == "overflow":
        return _json(overflow_body(form.get("shape", "llama.cpp"), int(form.get("n_prompt_tokens", 5000)),
                                   int(form.get("n_ctx", 4096))), 400)
    if fault == "tool_use_failed":
        return _json({"error": {"code": "tool_use_failed", "type": "invalid_request_error",
                                "message": form.get("message", "Tool call validation failed"),
                                "failed_generation": form.get("failed_generation", "")}}, 400)
    if fault == "empty_choices":
        obj = {"id": "chatcmpl-fake", "object": "chat.completion", "model": "fake", "choices": []}
        return _sse(response_to_chunks(obj)) if streaming else _json(obj)
    return _anonymous(form, streaming)


def _anonymous(form: dict[str, Any], streaming: bool) -> Plan:
    name = form.get("name", "list_dir")
    args = form.get("arguments", {})
    raw = args if isinstance(args, str) else json.dumps(args)
    if not streaming:
        return _json({"id": "chatcmpl-fake", "object": "chat.completion", "model": "fake", "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
             "tool_calls": [{"type": "function", "function": {"name": name, "arguments": raw}}]}}]})
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake"}
    deltas: list[dict[str, Any]] = [{"tool_calls": [{"type": "function", "function": {"name": name, "arguments": ""}}]}]
    deltas += [{"tool_calls": [{"function": {"arguments": p}}]} for p in (raw[: len(raw) // 2], raw[len(raw) // 2:]) if p]
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return _sse(chunks)
