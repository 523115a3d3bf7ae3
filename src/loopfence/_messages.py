"""Typed replies: a chat.completions response parsed once, at the edge, into values.

`Reply.from_response(obj)` accepts the OpenAI response shape (and tolerates the usual server
variations); everything past it reads attributes, never `dict.get` chains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._json import canonical_json

__all__ = ["Usage", "ToolCall", "Reply", "Request", "ReplyFormatError", "call_ids", "content_text"]


class ReplyFormatError(ValueError):
    """The object is not a chat.completions response we can read."""


@dataclass(frozen=True, slots=True)
class Usage:
    """The token counts a reply's `usage` reports (None: the endpoint did not say)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> Usage | None:
        if not isinstance(data, dict):
            return None

        return cls(_count(data, "prompt_tokens"), _count(data, "completion_tokens"))


def _count(data: dict[str, Any], key: str) -> int | None:
    """A reported token count: a finite number >= 0, or None when absent or not a number.
    Infinity, NaN or a negative count is an error: it would crash or lower the budget."""
    v = data.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    if not math.isfinite(v) or v < 0:
        raise ReplyFormatError(f"usage {key} must be a finite number >= 0, got {v!r}")
    return int(v)


def content_text(parts: list[Any]) -> str:
    """Content parts joined: each object part's "text" (absent or null is ""), which must be a string."""
    out = []
    for i, p in enumerate(parts):
        if not isinstance(p, dict):
            continue
        text = p.get("text")
        if text is not None and not isinstance(text, str):
            raise ReplyFormatError(f"message content[{i}].text must be a string, got {type(text).__name__}")
        out.append(text or "")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One requested call as the model sent it. `arguments` is the raw text (or object) received."""

    id: str
    name: str
    arguments: Any  # str (the wire form), a dict (some servers), or None
    index: int = 0

    @property
    def raw_arguments(self) -> str:
        if self.arguments is None:
            return ""
        return self.arguments if isinstance(self.arguments, str) else canonical_json(self.arguments)

    def to_wire(self) -> dict[str, Any]:
        """No arguments go back as "{}": servers reject null and some reject ""."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.raw_arguments or "{}"}}


@dataclass(frozen=True, slots=True)
class Reply:
    """One assistant reply. `complete` is False when a stream ended early or broke."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    complete: bool = True
    problem: str = ""  # why it is incomplete, when it is

    def message(self) -> dict[str, Any]:
        """The assistant message as it goes back on the wire."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_wire() for c in self.tool_calls]
        return msg

    @classmethod
    def from_response(cls, obj: Any, *, complete: bool = True, problem: str = "") -> Reply:
        if not isinstance(obj, dict):
            raise ReplyFormatError(f"reply must be a JSON object, got {type(obj).__name__}")
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ReplyFormatError("reply has no choices")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise ReplyFormatError("reply choice has no message object")
        msg = choice["message"]
        content = msg.get("content")
        if isinstance(content, list):  # content parts
            content = content_text(content)
        if content is not None and not isinstance(content, str):
            raise ReplyFormatError("message content must be a string or null")
        calls = _parse_calls(msg)
        finish = choice.get("finish_reason") or None
        return cls(content, calls, finish, Usage.from_json(obj.get("usage")), obj, complete, problem)


def _parse_calls(msg: dict[str, Any]) -> tuple[ToolCall, ...]:
    raw_calls = msg.get("tool_calls") or []
    legacy = msg.get("function_call")
    if not raw_calls and isinstance(legacy, dict) and (legacy.get("name") or legacy.get("arguments")):
        raw_calls = [{"id": "", "function": legacy}]  # legacy single call; an empty one is no call
    if not isinstance(raw_calls, list):
        raise ReplyFormatError("tool_calls must be a list")
    for i, item in enumerate(raw_calls):
        if not isinstance(item, dict) or not isinstance(item.get("function"), dict):
            raise ReplyFormatError(f"tool_calls[{i}] has no function object")
    ids = call_ids(["" if item.get("id") is None else str(item["id"]) for item in raw_calls])
    out = []
    for i, (item, call_id) in enumerate(zip(raw_calls, ids)):
        fn = item["function"]
        name = fn.get("name")
        if not isinstance(name, str):
            name = "" if name is None else str(name)
        index = item.get("index", i)
        out.append(ToolCall(call_id, name, fn.get("arguments"), index if isinstance(index, int) else i))
    return tuple(out)


def call_ids(ids: list[str]) -> list[str]:
    """A reply's call ids with each empty one filled: `call_<position>`, or, where another call of
    the reply has that id, the first free `call_<position>_<n>` (the model must tell results apart)."""
    if all(ids):
        return ids
    taken = set(ids)
    out = []
    for pos, given in enumerate(ids):
        if not given:
            given, n = f"call_{pos}", 1
            while given in taken:
                given, n = f"call_{pos}_{n}", n + 1
            taken.add(given)
        out.append(given)
    return out


@dataclass(frozen=True, slots=True)
class Request:
    """What the ring sends: the conversation, the tool schemas, request parameters, a deadline,
    and the most tokens the reply may generate (`max_tokens`: the smaller of what is left of the
    run's max_completion_tokens, max_tokens_per_request and a `max_tokens` in params; None:
    unbounded). An adapter sends it as the endpoint's own cap, so the server stops a runaway
    generation; `params` stay what the user gave (what the run log records)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    params: dict[str, Any]
    deadline: float | None = None  # time.monotonic() value the request must not outlive
    step: int = 0
    max_tokens: int | None = None
    run_id: str | None = None  # the run's log header run_id: an HTTP adapter sends it (X-Loopfence-Run-Id)
