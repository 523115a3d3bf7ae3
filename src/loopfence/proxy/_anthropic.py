"""The Anthropic Messages wire (`POST /v1/messages`): one translation both ways, no rule of its own.

- `parse(body)`: a Messages request checked field by field (Anthropic's error shape on a bad one)
  and read as Chat Completions: `system` (a string or text blocks) as a system message, `tool_use`
  blocks as an assistant's `tool_calls` (the same ids), `tool_result` blocks (inside user messages,
  `is_error` kept as a marker) as `tool` messages, `thinking` blocks left out of the view. The
  runs fence that `Incoming` as they fence any other; `body` is the request as sent.
- `outgoing`: that body, untouched but for `max_tokens` capped to the run's bound and the run's note
  appended to the last user message: what goes to an Anthropic upstream (`thinking`,
  `cache_control`, `metadata` and unknown fields pass as they came).
- `reader()`: the upstream's reply (a message, or its events) read as a chat.completion (chunks),
  so the library's client keeps its retries, bounds and complete-object gate: a stream cut inside a
  `tool_use` never reaches `message_delta`, and is `incomplete_stream`.
- `render` / `stream`: the `Answer` in the wire's shape; a stop is an assistant message with one text
  block and `stop_reason: "end_turn"`, in the same event sequence as a real answer. `error`: the wire's
  error body.
"""

from __future__ import annotations

import json
from typing import Any

from .._json import canonical_json
from .._messages import Reply
from ..models._sse import SSEEvent
from ..models._stream import StreamEnd, reply_from_response
from ..models._errors import error_stop
from ._answer import WIRE_EXTRA, Answer, Reader, chat_chunk, event_object, sse
from ._wire import BadRequest, Incoming, checked_head, read_as, tool_items, turns
from ._wire import kind as _kind

__all__ = ["NAME", "PATH", "auth", "relays", "ERROR_KINDS", "parse", "outgoing", "reader", "render", "stream_head", "stream_text",
           "stream_tail", "error", "text_of_event"]

NAME = "anthropic"
PATH = "/v1/messages"  # after the upstream's root
VERSION = "2023-06-01"  # the anthropic-version sent upstream when the client sends none
# an HTTP status -> the error type Anthropic's body names
ERROR_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               502: "api_error", 503: "overloaded_error"}
_STOP_REASONS = {"tool_use": "tool_calls", "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                 "pause_turn": "stop", "refusal": "stop"}
_FINISH = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}
_ROLES = ("user", "assistant", "system")  # Claude Code 2.1 sends system messages inside `messages` too
_THINKING = ("thinking", "redacted_thinking")


def error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_KINDS.get(status, "api_error"), "message": message}}


# ---------------------------------------------------------------------------- the request
def parse(body: Any) -> Incoming:
    """The request checked (BadRequest naming the field) and read as Chat Completions."""
    body, cap = checked_head(body, cap="max_tokens")
    raw = turns(body.get("messages"), "messages")
    tools = _tools(body.get("tools"))
    messages = _system(body.get("system")) + _messages(raw)
    choice = _choice(body.get("tool_choice"), {t["function"]["name"] for t in tools})
    params: dict[str, Any] = {"max_tokens": cap} if cap is not None else {}
    if choice is not None:
        params["tool_choice"] = choice
    return read_as(NAME, body, messages, tools, params, model=body["model"])


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if isinstance(system, list) and all(isinstance(b, dict) for b in system):
        text = "\n".join(b["text"] for b in system if b.get("type") == "text" and isinstance(b.get("text"), str))
        return [{"role": "system", "content": text}] if text else []
    raise BadRequest(f"system must be a string or an array of content blocks, got {_kind(system)}", "system")


def _tools(tools: Any) -> list[dict[str, Any]]:
    """The client tools as Chat Completions functions (server tools, with a `type` of their own and
    no `input_schema`, are outside the contract)."""
    out, seen = [], set()
    for where, t in tool_items(tools):
        name, schema = t.get("name"), t.get("input_schema")
        if t.get("type") not in (None, "custom") and schema is None:
            if not isinstance(name, str) or not name:
                continue  # a server tool (web search): the server runs it
            schema = {"type": "object", "additionalProperties": True}  # Anthropic-defined (bash_2025...): callable
        if not isinstance(name, str) or not name:
            raise BadRequest(f"{where}.name must be a non-empty string", f"{where}.name")
        if name in seen:
            raise BadRequest(f"{where}.name {name!r} is declared twice"[:300], f"{where}.name")
        if not isinstance(schema, dict):
            raise BadRequest(f"{where}.input_schema must be an object, got {_kind(schema)}", f"{where}.input_schema")
        seen.add(name)
        fn = {"name": name, "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _choice(choice: Any, names: set[str]) -> Any:
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        if choice["name"] not in names:
            raise BadRequest(f"tool_choice names the tool {choice['name']!r}, which tools does not declare"[:300],
                             "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest('tool_choice must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}',
                     "tool_choice")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content):
        return content
    raise BadRequest(f"{where}.content must be a string or an array of content blocks, got {_kind(content)}",
                     f"{where}.content")


def _result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(b["text"] if b.get("type") == "text" and isinstance(b.get("text"), str)
                         else canonical_json(b) for b in content if isinstance(b, dict))
    else:
        raise BadRequest(f"{where}.content must be a string or an array of blocks, got {_kind(content)}",
                         f"{where}.content")
    return f"[is_error] {text}" if block.get("is_error") is True else text


def _messages(raw: list[Any]) -> list[dict[str, Any]]:
    """The messages as Chat Completions: a user message's tool results first (as tool messages, in
    order), then its text; an assistant message's text and its tool_use blocks as tool_calls."""
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object, got {_kind(m)}", where)
        role = m.get("role")
        if role not in _ROLES:
            raise BadRequest(f"{where}.role must be user, assistant or system, got {role!r}"[:200], f"{where}.role")
        blocks = _blocks(m.get("content"), where)
        texts = [b["text"] for b in blocks if b["type"] == "text" and isinstance(b.get("text"), str)]
        if role == "system":
            out.append({"role": "system", "content": "\n".join(texts)})
            continue
        if role == "assistant":
            calls = []
            for j, b in enumerate(blocks):
                if b["type"] != "tool_use":
                    continue
                at = f"{where}.content.{j}"
                if not isinstance(b.get("id"), str) or not b["id"] or not isinstance(b.get("name"), str):
                    raise BadRequest(f"{at} (tool_use) must have a string id and name", at)
                calls.append({"id": b["id"], "type": "function",
                              "function": {"name": b["name"], "arguments": canonical_json(b.get("input") or {})}})
            message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            open_calls = {c["id"] for c in calls}
            continue
        for j, b in enumerate(blocks):
            if b["type"] != "tool_result":
                continue
            at = f"{where}.content.{j}"
            cid = b.get("tool_use_id")
            if not isinstance(cid, str) or cid not in open_calls:
                raise BadRequest(f"{at}.tool_use_id {cid!r} answers no tool_use of the assistant message before "
                                 "it (or answers it twice)"[:300], f"{at}.tool_use_id")
            open_calls.discard(cid)
            out.append({"role": "tool", "tool_call_id": cid, "content": _result_text(b, at)})
        if texts or not any(b["type"] == "tool_result" for b in blocks):
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def outgoing(incoming: Incoming, note: str | None, max_tokens: int | None) -> dict[str, Any]:
    """The request as sent, with `max_tokens` capped to the run's bound and the run's note appended
    (as a text block of the last user message): what goes to an Anthropic upstream."""
    body = dict(incoming.body or {})
    if max_tokens is not None:
        asked = body.get("max_tokens")
        body["max_tokens"] = min(asked, max_tokens) if isinstance(asked, int) else max_tokens
        thinking = body.get("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        if isinstance(budget, int) and budget >= body["max_tokens"]:  # the API wants max_tokens above it
            budget = max(1024, body["max_tokens"] - 1)
            body["thinking"] = {**thinking, "budget_tokens": budget}
            body["max_tokens"] = max(body["max_tokens"], budget + 1)
    if note:
        messages = list(body["messages"])
        last = messages[-1]
        if last.get("role") == "user":
            blocks = [{"type": "text", "text": last["content"]}] if isinstance(last.get("content"), str) \
                else list(last.get("content") or [])
            messages[-1] = {**last, "content": [*blocks, {"type": "text", "text": note}]}
        else:
            messages.append({"role": "user", "content": note})
        body["messages"] = messages
    return body


def auth(key: str) -> dict[str, str]:
    """The header an upstream of this wire takes its key in."""
    return {"x-api-key": key}


def path(incoming: Incoming) -> str:
    """The upstream's route for a request, after its root."""
    return PATH


def counted(tokens: int) -> dict[str, Any]:
    """An estimate of a request's tokens, as count_tokens answers."""
    return {"input_tokens": tokens}


def relays(body: dict[str, Any]) -> bool:
    """Whether the answer's text may stream as it comes: not with thinking on (its blocks come first)."""
    thinking = body.get("thinking")
    return not isinstance(thinking, dict) or thinking.get("type") in (None, "disabled")


# ---------------------------------------------------------------------------- the upstream's reply
def _usage(u: Any, prompt: int | None = None) -> dict[str, int] | None:
    if not isinstance(u, dict):
        return None
    p = sum(v for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            if isinstance(v := u.get(k), int))
    c = u.get("output_tokens") if isinstance(u.get("output_tokens"), int) else 0
    p = p or (prompt or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _reply_json(obj: Any, thinking: list[dict[str, Any]]) -> Reply:
    """A Messages response as the chat.completion the library reads; its thinking blocks into `thinking`."""
    if not isinstance(obj, dict) or obj.get("type") == "error" or not isinstance(obj.get("content"), list):
        if isinstance(obj, dict) and obj.get("error"):
            raise error_stop(None, obj)
        return reply_from_response(obj)  # names what is wrong (no choices)
    texts, calls = [], []
    thinking[:] = [b for b in obj["content"] if isinstance(b, dict) and b.get("type") in _THINKING]
    for b in obj["content"]:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif b.get("type") == "tool_use":
            given = b.get("input")  # an object; text that is not one goes as it is (the contract names it)
            args = given if isinstance(given, str) else canonical_json(given if given is not None else {})
            calls.append({"id": b.get("id") or "", "type": "function",
                          "function": {"name": b.get("name") or "", "arguments": args}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    chat: dict[str, Any] = {"id": obj.get("id"), "object": "chat.completion", "model": obj.get("model"),
                            "choices": [{"index": 0, "message": message,
                                         "finish_reason": _STOP_REASONS.get(str(obj.get("stop_reason")), "stop")}]}
    usage = _usage(obj.get("usage"))
    if usage is not None:
        chat["usage"] = usage
    return reply_from_response(chat)


def reader(incoming: Incoming | None = None) -> Reader:
    """A reader for one reply (see `Reader`)."""
    state: dict[str, Any] = {"prompt": 0, "blocks": {}}
    thinking: list[dict[str, Any]] = []

    def event(ev: SSEEvent, end: StreamEnd) -> dict[str, Any] | None:
        obj = event_object(ev, end)
        if obj is None:
            return None
        kind = obj.get("type") or ev.event
        if kind == "error" or obj.get("error"):
            raise error_stop(None, obj, tools=end.tools)
        end.chunks += 1
        if kind == "message_stop":
            end.done = True
            return None
        if kind == "message_start":
            thinking.clear()
            msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
            state["prompt"] = (_usage(msg.get("usage")) or {}).get("prompt_tokens", 0)
            return {"id": msg.get("id"), "model": msg.get("model"), "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        index = obj.get("index") if isinstance(obj.get("index"), int) else 0
        if kind == "content_block_start":
            block = obj.get("content_block") if isinstance(obj.get("content_block"), dict) else {}
            state["blocks"][index] = block.get("type")
            if block.get("type") in _THINKING:
                state["blocks"][index] = dict(block)
                thinking.append(state["blocks"][index])
                return None
            if block.get("type") == "tool_use":
                return chat_chunk({"tool_calls": [{"index": index, "id": block.get("id") or "", "type": "function",
                                                "function": {"name": block.get("name") or "", "arguments": ""}}]})
            if block.get("type") == "text" and block.get("text"):
                return chat_chunk({"content": block["text"]})
            return None
        if kind == "content_block_delta":
            delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                return chat_chunk({"content": delta["text"]})
            if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                return chat_chunk({"tool_calls": [{"index": index, "function": {"arguments": delta["partial_json"]}}]})
            block = state["blocks"].get(index)
            for key in ("thinking", "signature"):
                if isinstance(block, dict) and delta.get("type") == f"{key}_delta" and isinstance(delta.get(key), str):
                    block[key] = str(block.get(key) or "") + delta[key]
            return None
        if kind == "message_delta":
            delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            reason = delta.get("stop_reason")
            chunk = chat_chunk({}, _STOP_REASONS.get(str(reason), "stop") if reason else None)
            usage = _usage(obj.get("usage"), state["prompt"])
            if usage is not None:
                chunk["usage"] = usage
            return chunk
        return None  # ping, content_block_stop, thinking and signature deltas

    return Reader(lambda obj: _reply_json(obj, thinking), event, lambda: {"thinking": list(thinking)} if thinking else None)


def text_of_event(ev: SSEEvent) -> str:
    """The answer text one upstream event carries (a `text_delta`), for relaying as it arrives."""
    try:
        obj = json.loads(ev.data)
    except ValueError:
        return ""
    delta = obj.get("delta") if isinstance(obj, dict) else None
    if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
        return delta["text"]
    return ""


# ---------------------------------------------------------------------------- the answer
def _ident(answer: Answer) -> str:
    return "msg_lf" + answer.ident.removeprefix("chatcmpl-lf").removeprefix("chatcmpl")


def _usage_out(answer: Answer) -> dict[str, int]:
    u = answer.usage or {}
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    return {"input_tokens": p if isinstance(p, int) else 0, "output_tokens": c if isinstance(c, int) else 0}


def _content(answer: Answer) -> list[dict[str, Any]]:
    extra = answer.message.get(WIRE_EXTRA)
    out: list[dict[str, Any]] = list(extra.get("thinking") or []) if isinstance(extra, dict) else []
    text = answer.message.get("content")
    if text:
        out.append({"type": "text", "text": text})
    for c in answer.message.get("tool_calls") or []:
        try:
            args = json.loads(c["function"].get("arguments") or "{}")
        except ValueError:
            args = {}
        out.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": args})
    return out


def _stop_reason(answer: Answer) -> str:
    if answer.stop is not None:
        return "end_turn"
    return "tool_use" if answer.message.get("tool_calls") else _FINISH.get(answer.finish_reason, "end_turn")


def render(answer: Answer) -> tuple[int, dict[str, Any]]:
    """(status, body): the message, or in error mode a stop as Anthropic's error body (a 400: the
    SDKs do not retry it)."""
    if answer.status != 200:
        return answer.status, error(answer.status, str(answer.message.get("content") or ""))
    return 200, {"id": _ident(answer), "type": "message", "role": "assistant", "model": answer.model,
                 "content": _content(answer), "stop_reason": _stop_reason(answer), "stop_sequence": None,
                 "usage": _usage_out(answer)}


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\n".encode() + sse({"type": name, **obj})


def stream_head(answer: Answer) -> list[bytes]:
    """`message_start` (its id, model and time those of `answer`, which may be a placeholder)."""
    return [_event("message_start", {"message": {
        "id": _ident(answer), "type": "message", "role": "assistant", "model": answer.model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {**_usage_out(answer), "output_tokens": 0}}})]


def stream_text(text: str, first: bool, answer: Answer | None = None) -> list[bytes]:
    """A piece of the answer's text as it arrives; the first opens the text block (index 0)."""
    out = [_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})] if first else []
    return out + [_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})]


def stream_tail(answer: Answer, sent: str) -> list[bytes]:
    """What follows the text already streamed (`sent`): the rest of the text (a stop after streamed
    text follows it in the same block), each released call as a whole `tool_use` block, then
    `message_delta` with the stop reason and `message_stop`. In error mode once text has streamed
    (the status is already 200), the error as an `error` event."""
    if answer.status != 200:
        return [_event("error", {"error": error(answer.status, str(answer.message.get("content") or ""))["error"]})]
    out: list[bytes] = []
    content = answer.message.get("content") or ""
    if answer.stop is not None and sent:
        rest = "\n\n" + content
    else:
        rest = content[len(sent):] if content.startswith(sent) else content
    index = 0
    if sent:  # the text block streamed so far is block 0
        out += stream_text(rest, False) if rest else []
        out.append(_event("content_block_stop", {"index": 0}))
        index = 1
    for block in _content(answer):
        if block["type"] == "text" and not sent:
            out += [_event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}),
                    _event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": rest}})]
        elif block["type"] == "tool_use":
            out.append(_event("content_block_start", {"index": index, "content_block": {**block, "input": {}}}))
            out.append(_event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}}))
        elif block["type"] == "thinking" and not sent:
            out.append(_event("content_block_start", {"index": index, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            out.append(_event("content_block_delta", {"index": index, "delta": {
                "type": "thinking_delta", "thinking": block.get("thinking") or ""}}))
            out.append(_event("content_block_delta", {"index": index, "delta": {
                "type": "signature_delta", "signature": block.get("signature") or ""}}))
        elif block["type"] == "redacted_thinking" and not sent:
            out.append(_event("content_block_start", {"index": index, "content_block": block}))
        else:
            continue
        out.append(_event("content_block_stop", {"index": index}))
        index += 1
    out.append(_event("message_delta", {"delta": {"stop_reason": _stop_reason(answer), "stop_sequence": None},
                                        "usage": _usage_out(answer)}))
    out.append(_event("message_stop", {}))
    return out
