"""Builders for chat.completions response objects (scripts, tests, drills)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["tool_call", "calls_reply", "text_reply", "text_chunks"]


def tool_call(name: str, arguments: Any = None, *, id: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """One wire tool call. `arguments` may be raw text (kept verbatim) or a dict; or pass kwargs."""
    if arguments is None:
        arguments = kwargs
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id or "", "type": "function", "function": {"name": name, "arguments": raw}}


def calls_reply(*calls: dict[str, Any], usage: tuple[int, int] | None = None,
                finish_reason: str = "tool_calls", content: str | None = None) -> dict[str, Any]:
    """A chat.completions response asking for `calls` (from `tool_call`; ids `call_0`, `call_1`, ... where
    none is given), with optional `usage` (prompt, completion) and `content`."""
    numbered = [dict(c, id=c.get("id") or f"call_{i}") for i, c in enumerate(calls)]
    return _response({"role": "assistant", "content": content, "tool_calls": numbered},
                     finish_reason, usage)


def text_reply(text: str | None, *, usage: tuple[int, int] | None = None,
               finish_reason: str = "stop") -> dict[str, Any]:
    """A chat.completions response with the text `text` (None: no content) and no tool calls."""
    return _response({"role": "assistant", "content": text}, finish_reason, usage)


def text_chunks(*pieces: str, usage: tuple[int, int] | None = None, finish_reason: str = "stop") -> dict[str, Any]:
    """A FakeServer reply form that streams the text `pieces`, one chunk each, in that chunking
    (then the finish_reason, then [DONE]): the answer is `"".join(pieces)`. Wrap it as
    `{"fault": "slow_stream", "delay_s": 0.05, **text_chunks(...)}` to space the chunks out."""
    base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": "scripted"}
    deltas = [{"role": "assistant", "content": ""}, *({"content": p} for p in pieces)]
    chunks: list[Any] = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
    if usage is not None:
        chunks.append({**base, "choices": [], "usage": _response({}, "", usage)["usage"]})
    return {"chunks": chunks, "done": True}


def _response(message: dict[str, Any], finish_reason: str, usage: tuple[int, int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "chatcmpl-scripted", "object": "chat.completion", "model": "scripted",
                           "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
    if usage is not None:
        out["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                        "total_tokens": usage[0] + usage[1]}
    return out
