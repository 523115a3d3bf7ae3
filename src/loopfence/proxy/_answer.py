"""What the client gets: a chat.completion (or its stream), a stop in the shape that ends its loop,
or the error body of `--on-stop error`.

An `Answer` is kept per run (its latest request's answer, and a stopped run's stop) and rendered per
request: a retry of a streamed request gets the same answer as a stream, a later request of a stopped
run the same stop.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._json import loads
from .._messages import Reply
from .._stops import Stop, StopReason
from ..models._sse import SSEEvent
from ..models._stream import StreamEnd

__all__ = ["Answer", "Reader", "event_object", "chat_chunk", "stop_text", "inert", "WIRE_EXTRA", "RUN_HEADER", "STOP_HEADER", "STOP_MARKER", "ZERO_USAGE", "sse"]

RUN_HEADER = "X-Loopfence-Run"
STOP_HEADER = "X-Loopfence-Stop"
# Every stop's text starts with this, so that a program (or a person reading an agent's "final
# answer") can tell a stop from a model's answer: `text.startswith(STOP_MARKER)`.
STOP_MARKER = "[loopfence stop]"
ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
# In a reply's raw body and its answer's message: what another wire's reader kept of the upstream's reply
# beside the rules' reading (Anthropic's thinking blocks, signed), which goes back to the client as it came
WIRE_EXTRA = "x_loopfence_wire"


@dataclass(frozen=True)
class Reader:
    """How another wire reads one upstream reply: `json` (a response body -> Reply), `event` (an SSE
    event -> its chat.completion.chunk or None, with the state of one stream), and `extra` (what the
    answer carries back to the client beside the rules' reading, `WIRE_EXTRA`, or None)."""

    json: Callable[[Any], Reply]
    event: Callable[[SSEEvent, StreamEnd], dict[str, Any] | None]
    extra: Callable[[], dict[str, Any] | None]


def event_object(ev: SSEEvent, end: StreamEnd) -> dict[str, Any] | None:
    """One SSE event of another wire's stream as a JSON object; None for a blank one, or (`end.problem`
    set: the stream is over) for one that is not a JSON object."""
    if not ev.data.strip():
        return None
    try:
        obj = loads(ev.data)
    except ValueError as exc:
        end.problem = f"event {end.chunks + 1} is not valid JSON ({exc}): {ev.data[:80]!r}"
        return None
    if not isinstance(obj, dict):
        end.problem = f"event {end.chunks + 1} is not a JSON object: {ev.data[:80]!r}"
        return None
    return obj


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chat.completion.chunk (what another wire's reader gives the library's stream assembler)."""
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def stop_text(stop: Stop) -> str:
    """The stop in words, for the assistant message that ends the client's loop: the marker, reason,
    limit and value, detail; `inert`, so that no agent reads it as a call or an action."""
    limit, value = stop.data.get("limit"), stop.data.get("value")
    numbers = f" (limit {limit}, value {value})" if limit is not None else ""
    return inert(f"{STOP_MARKER} loopfence stopped this run: {stop.reason}{numbers}. {stop.detail}")


_CODE_TAG = re.compile(r"<(\s*/?\s*code)", re.IGNORECASE)
_TILDES = re.compile(r"~{3,}")
_INERT = str.maketrans({"{": "(", "}": ")", "`": "'"})


def inert(text: str) -> str:
    """`text` with nothing an agent parses as a call or an action: no JSON object (braces become
    parentheses: smolagents reads the first `{...}` as a tool call), no code fence (backticks become
    quotes, runs of tildes shorten), no `<code>` tag (its `<` becomes `‹`)."""
    return _CODE_TAG.sub(r"‹\1", _TILDES.sub("~~", text.translate(_INERT)))


_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(obj: Any) -> bytes:
    """One SSE event. The line breaks JSON leaves raw (U+0085, U+2028, U+2029; only ever inside its
    strings) go escaped: a client that splits the stream as `str.splitlines` does (httpx's
    `iter_lines`) would cut the event in two."""
    text = json.dumps(obj, ensure_ascii=False).translate(_BREAKS)
    return b"data: " + text.encode("utf-8", "surrogatepass") + b"\n\n"


@dataclass(frozen=True)
class Answer:
    """One answer. `message`: the assistant message the client gets (its tool calls the ones checked
    and released); `stop`: the fence's stop that this answer is (None: the model's own reply, a
    final answer included); `as_error`: `--on-stop error` (HTTP 400, OpenAI's error body)."""

    run_id: str
    ident: str  # the chat.completion id (the same for a retry)
    model: str
    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, Any] | None = None
    stop: Stop | None = None
    as_error: bool = False
    created: int = 0

    @classmethod
    def stopped(cls, run_id: str, ident: str, model: str, stop: Stop, as_error: bool) -> Answer:
        """The stop as a complete chat.completion: nothing was spent on it (zero usage)."""
        return cls(run_id, ident, model, {"role": "assistant", "content": stop_text(stop)}, "stop",
                   dict(ZERO_USAGE), stop, as_error, int(time.time()))

    def to_json(self) -> dict[str, Any]:
        """As the proxy's own notes keep it (`.proxy/<run id>.jsonl` in the log folder)."""
        return {"run_id": self.run_id, "ident": self.ident, "model": self.model, "message": self.message,
                "finish_reason": self.finish_reason, "usage": self.usage, "as_error": self.as_error,
                "created": self.created, "stop": None if self.stop is None else self.stop.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Answer:
        st = d.get("stop")
        stop = None if st is None else Stop(StopReason(st["reason"]), st["detail"], st.get("data") or {})
        return cls(d["run_id"], d["ident"], d["model"], d["message"], d["finish_reason"], d.get("usage"), stop,
                   bool(d.get("as_error")), int(d.get("created") or 0))

    @property
    def status(self) -> int:
        return 400 if self.stop is not None and self.as_error else 200

    def headers(self) -> dict[str, str]:
        out = {RUN_HEADER: self.run_id}
        if self.stop is not None:
            out[STOP_HEADER] = str(self.stop.reason)
        return out

    def body(self) -> dict[str, Any]:
        if self.status != 200:
            assert self.stop is not None
            return {"error": {"message": stop_text(self.stop), "type": "loopfence_stop",
                              "code": str(self.stop.reason), "param": None}}
        return {"id": self.ident, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": self.message, "logprobs": None,
                             "finish_reason": self.finish_reason}],
                "usage": self.usage or dict(ZERO_USAGE)}

    # -- the stream ------------------------------------------------------------------------------
    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": self.ident, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def stream_tail(self, sent: str, include_usage: bool) -> list[bytes]:
        """The chunks after the text already streamed (`sent`): the rest of the text, the released
        calls (whole, one chunk each), the finish reason, the usage when asked, [DONE]."""
        out = []
        content = self.message.get("content") or ""
        if self.stop is not None and sent:
            rest = "\n\n" + content
        else:
            rest = content[len(sent):] if content.startswith(sent) else content
        if not sent:
            out.append(sse(self.chunk({"role": "assistant", "content": ""})))
        if rest:
            out.append(sse(self.chunk({"content": rest})))
        for i, call in enumerate(self.message.get("tool_calls") or []):
            out.append(sse(self.chunk({"tool_calls": [{"index": i, **call}]})))
        out.append(sse(self.chunk({}, self.finish_reason)))
        if include_usage:
            usage = self.usage or dict(ZERO_USAGE)
            out.append(sse({"id": self.ident, "object": "chat.completion.chunk", "created": self.created,
                            "model": self.model, "choices": [], "usage": usage}))
        out.append(b"data: [DONE]\n\n")
        return out

    def error_stream(self) -> list[bytes]:
        """`--on-stop error` once text has streamed (the status is already 200): the error as an SSE event."""
        return [sse(self.body() if self.status != 200 else {"error": {"message": self.message.get("content"),
                                                                      "type": "loopfence_stop"}}),
                b"data: [DONE]\n\n"]


def is_final(stop: Stop) -> bool:
    return stop.reason is StopReason.FINAL_ANSWER
