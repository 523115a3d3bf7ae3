"""Stream assembly: chat.completion.chunk deltas -> one `Reply`, tolerant of what servers send.

    assemble(chunks, done=False, problem="")  parsed chunk dicts -> Reply
    assemble_sse(text)                         a whole text/event-stream body -> Reply
    reply_from_response(obj)                   a non-streamed response object -> Reply (same rules)

Tool calls are keyed by `index` (the first index may be 1; order is first appearance), by `id`
where a server omits the index, and a delta with neither continues the current call. A repeated
id or name is not concatenated (`llm_versionllm_version` is the classic bug); an index reused
with a different id starts a new call. `arguments` null, missing or "" -> "{}"; arguments sent as
an object (or any other JSON value, for the contract to refuse) stay as sent; ids and names sent as
numbers are text; empty ids become `call_<position>` (stable under re-chunking; never another
call's id). A part of the reply of the wrong type (choices, a delta, tool_calls, a function) is an
endpoint error that names it, never a traceback.

The complete-object gate: a reply is complete only if the stream ended with [DONE] or a
finish_reason. Otherwise it is `Reply(complete=False, problem=...)` and the ring stops with
incomplete_stream. An error inside a stream (`event: error`, or a chunk carrying `error`) raises
the StopError that `_errors.error_stop` names; a stream that ends with [DONE] having carried no
choice at all is an endpoint error (empty choices). None of these yields a call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._json import loads
from .._messages import Reply, ReplyFormatError, ToolCall, Usage, call_ids, content_text
from .._stops import StopError, StopReason
from ._errors import error_stop
from ._sse import DONE, SSEEvent, parse_events

__all__ = ["assemble", "assemble_sse", "assemble_events", "reply_from_response", "chunks_from_events",
           "chunk_of", "chunk_texts", "StreamEnd"]


@dataclass(slots=True)
class StreamEnd:
    """How the event stream ended; filled while `chunks_from_events` runs."""

    done: bool = False  # saw [DONE]
    problem: str = ""  # why it ended early (transport error, bad chunk), when it did
    chunks: int = 0
    tools: tuple[str, ...] = ()  # tool names sent, to name a streamed tool_use_failed


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    index: int
    parts: list[str] = field(default_factory=list)
    obj: Any = None


def chunk_of(ev: SSEEvent, end: StreamEnd) -> dict[str, Any] | None:
    """One SSE event's parsed chunk, or None: a blank event, [DONE] (`end.done` set) or a chunk that
    is not a JSON object (`end.problem` set; the stream is over at either). An error raises StopError."""
    data = ev.data
    if data == DONE:
        end.done = True
        return None
    if ev.event == "error":
        try:
            body: Any = loads(data)
        except ValueError:
            body = data
        raise error_stop(None, body, tools=end.tools)
    if not data.strip():
        return None
    try:
        chunk = loads(data)
    except ValueError as exc:
        end.problem = f"chunk {end.chunks + 1} is not valid JSON ({exc.msg}): {data[:80]!r}"
        return None
    if type(chunk) is not dict:
        end.problem = f"chunk {end.chunks + 1} is not a JSON object: {data[:80]!r}"
        return None
    if chunk.get("error"):
        raise error_stop(None, chunk, tools=end.tools)
    end.chunks += 1
    return chunk


def chunks_from_events(events: Iterable[SSEEvent], end: StreamEnd) -> Iterator[dict[str, Any]]:
    """Parsed chunk dicts from SSE events; stops at [DONE]. Error events raise StopError."""
    for ev in events:
        chunk = chunk_of(ev, end)
        if end.done or end.problem:
            return
        if chunk is not None:
            yield chunk


def chunk_texts(chunk: dict[str, Any]) -> list[str]:
    """The answer text one chunk adds (what `assemble` joins into the reply's content), read
    leniently: a part of the wrong shape adds nothing here (assembling names it as a stop)."""
    choices = chunk.get("choices")
    if type(choices) is not list:
        return []
    out = []
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            delta = _delta(choice)
            if isinstance(delta, dict) and (text := _text_of(delta)):
                out.append(text)
    return out


def _delta(choice: dict[str, Any]) -> Any:
    delta = choice.get("delta")
    return choice.get("message") or {} if delta is None else delta


def _text_of(delta: dict[str, Any]) -> str:
    text = delta.get("content")
    return text if text and type(text) is str else ""


def assemble(chunks: Iterable[dict[str, Any]], *, done: bool = False, problem: str = "") -> Reply:
    """One Reply from parsed chunks. `done`: the stream ended with [DONE]; `problem`: why it ended
    early (set by the reader). Complete iff done or a finish_reason was seen."""
    return _finish(_gather(chunks), done, problem)


@dataclass(slots=True)
class _Parts:
    calls: list[_Call]
    content: list[str]
    finish: str | None
    usage: Any
    meta: dict[str, Any]
    n: int
    saw_choice: bool


def _gather(chunks: Iterable[dict[str, Any]]) -> _Parts:
    calls: list[_Call] = []
    by_index: dict[int, _Call] = {}
    by_id: dict[str, _Call] = {}
    content: list[str] = []
    finish: str | None = None
    usage: Any = None
    meta: dict[str, Any] = {}
    saw_choice = False
    n = 0
    for chunk in chunks:
        n += 1
        if not meta and chunk.get("id") is not None:
            meta = {"id": chunk.get("id"), "model": chunk.get("model")}
        u = chunk.get("usage")
        if u:
            usage = u
        choices = chunk.get("choices")
        if not choices:
            continue
        _shape(choices, list, "choices")
        for choice in choices:
            _shape(choice, dict, "choice")
            if choice.get("index", 0) != 0:
                continue
            saw_choice = True
            delta = _shape(_delta(choice), dict, "delta")
            if text := _text_of(delta):
                content.append(text)
            tcs = delta.get("tool_calls")
            if tcs:
                _shape(tcs, list, "tool_calls")
                for tc in tcs:
                    if tc is not None:  # a null entry holds no call
                        _shape(tc, dict, "tool_calls item")
                        _merge(tc, calls, by_index, by_id)
            elif delta.get("function_call"):
                fc = _shape(delta["function_call"], dict, "function_call")
                if fc.get("name") or fc.get("arguments"):
                    _merge({"index": -1, "function": fc}, calls, by_index, by_id)
            fr = choice.get("finish_reason")
            if fr:
                finish = fr
    return _Parts(calls, content, finish, usage, meta, n, saw_choice)


def _merge(tc: dict[str, Any], calls: list[_Call], by_index: dict[int, _Call],
           by_id: dict[str, _Call]) -> None:
    idx = tc.get("index")
    tid = _text(tc.get("id"))
    fn = _shape(tc.get("function") or {}, dict, "tool call's function")
    name = _text(fn.get("name"))
    call = None
    if type(idx) is int:
        call = by_index.get(idx)
        if call is not None and tid and call.id and tid != call.id:
            call = None  # an index reused for a different call
    elif tid:
        call = by_id.get(tid)
    elif calls:
        last = calls[-1]
        if not name or not last.name or name == last.name:
            call = last  # no index, no id: a continuation of the current call
    if call is None:
        call = _Call(tid, name, idx if type(idx) is int and idx >= 0 else len(calls))
        calls.append(call)
        name = ""
    if type(idx) is int:
        by_index[idx] = call
    if tid:
        if not call.id:
            call.id = tid
        by_id[tid] = call
    if name and name != call.name:
        call.name = call.name + name if call.name else name  # a name streamed in pieces
    args = fn.get("arguments")
    if type(args) is str:
        if args:
            call.parts.append(args)
    elif args is not None:  # an object (some servers), or a wrong type the contract refuses
        call.obj = args


def _shape(value: Any, kind: type, what: str) -> Any:
    """`value` if it is a `kind`; else the endpoint sent a malformed reply: a named stop."""
    if not isinstance(value, kind):
        raise StopError(StopReason.ENDPOINT_ERROR, f"the reply's {what} must be "
                        f"{'a list' if kind is list else 'an object'}, got {type(value).__name__}")
    return value


def _text(value: Any) -> str:
    """An id or a name as text (some servers send numbers); absent or null is ""."""
    return "" if value is None else value if type(value) is str else str(value)


def _finish(p: _Parts, done: bool, problem: str) -> Reply:
    calls, content, finish, usage, meta, n = p.calls, p.content, p.finish, p.usage, p.meta, p.n
    complete = done or finish is not None
    saw_choice = p.saw_choice
    if complete and not saw_choice:
        raise StopError(StopReason.ENDPOINT_ERROR, f"the stream ended ({n} chunks) without any choice "
                        "(empty choices)")
    if not complete and not problem:
        problem = "HTTP 200 with an empty event stream" if n == 0 else \
            f"the stream ended after {n} chunks without [DONE] or a finish_reason"
    out: list[ToolCall] = []
    for c, call_id in zip(calls, call_ids([c.id for c in calls])):
        if c.parts:
            args: Any = "".join(c.parts)
        else:
            args = c.obj if c.obj is not None else "{}"
        out.append(ToolCall(call_id, c.name, args, c.index))
    text = "".join(content) if content else None
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if out:
        message["tool_calls"] = [{**t.to_wire(), "index": t.index} for t in out]
    raw: dict[str, Any] = {"id": meta.get("id"), "object": "chat.completion", "model": meta.get("model"),
                           "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                           "stream": {"chunks": n, "done": done, "problem": problem or None}}
    if usage:
        raw["usage"] = usage
    try:
        usage_value = Usage.from_json(usage)
    except ReplyFormatError as exc:  # inf, NaN or a negative count: the endpoint's fault
        raise StopError(StopReason.ENDPOINT_ERROR, f"the response's {exc}") from None
    return Reply(text, tuple(out), finish, usage_value, raw, complete, "" if complete else problem)


def assemble_sse(text: str, *, tools: Iterable[str] = ()) -> Reply:
    """A whole text/event-stream body -> Reply (complete only with [DONE] or a finish_reason)."""
    return assemble_events(parse_events(text), StreamEnd(tools=tuple(tools)))


def assemble_events(events: Iterable[SSEEvent], end: StreamEnd | None = None, *,
                    cut: Callable[[int], str] | None = None) -> Reply:
    """SSE events -> Reply. A live reader passes its own `end` and either sets `end.problem` when
    the transport fails (the events simply stop; it is read after the last event), or, having read
    the events first, passes `cut`: why the transport failed after them, given the chunks used. It
    applies only where the events did not end the stream themselves ([DONE], a bad chunk)."""
    end = end or StreamEnd()
    parts = _gather(chunks_from_events(events, end))
    if cut is not None and not end.done and not end.problem:
        end.problem = cut(end.chunks)
    return _finish(parts, end.done, end.problem)


def reply_from_response(obj: Any) -> Reply:
    """A non-streamed chat.completions object -> Reply, with the stream's tolerances: each listed
    call is its own call (position = index), empty names/ids/arguments handled alike. Raises
    StopError(ENDPOINT_ERROR) for an error body, no choices, a choice without a message, or a part
    of the message of the wrong type. The Reply's `raw` (what the log keeps) is `obj` with its
    message as read, so `Reply.from_response(raw)` (replay, reconcile) rebuilds this same reply."""
    if not isinstance(obj, dict):
        raise StopError(StopReason.ENDPOINT_ERROR, f"the response is not a JSON object "
                        f"({type(obj).__name__})")
    if obj.get("error"):
        raise error_stop(None, obj)
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        raise StopError(StopReason.ENDPOINT_ERROR, "the response has no choices (empty choices)")
    choice = choices[0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise StopError(StopReason.ENDPOINT_ERROR, "the response's first choice has no message")
    delta = dict(msg)
    content = delta.get("content")
    if isinstance(content, list):  # content parts
        try:
            delta["content"] = content_text(content)
        except ReplyFormatError as exc:
            raise StopError(StopReason.ENDPOINT_ERROR, f"the response's {exc}") from None
    elif content is not None and not isinstance(content, str):
        raise StopError(StopReason.ENDPOINT_ERROR, f"the response's message content must be a string "
                        f"or null, got {type(content).__name__}")
    tcs = msg.get("tool_calls")
    if isinstance(tcs, list):
        delta["tool_calls"] = [dict(tc, index=i) if isinstance(tc, dict) else tc for i, tc in enumerate(tcs)]
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}],
             "usage": obj.get("usage")}
    reply = assemble([chunk], done=True)
    message = {k: v for k, v in msg.items() if k not in ("tool_calls", "function_call")}
    message["content"] = reply.content
    if reply.tool_calls:
        message["tool_calls"] = [{**t.to_wire(), "index": t.index} for t in reply.tool_calls]
    raw = {**obj, "choices": [{**choice, "message": message}, *choices[1:]]}
    return Reply(reply.content, reply.tool_calls, reply.finish_reason, reply.usage, raw)
