"""The OpenAI Responses wire (`POST /v1/responses`: Codex, the Agents SDK's default model): one
translation both ways, no rule of its own (the Anthropic wire's module is its model).

- `parse(body)`: checked field by field (OpenAI's error shape) and read as Chat Completions:
  `instructions` and system/developer messages as system messages, `message` items by role,
  `function_call` items as an assistant's `tool_calls` (their `call_id`s), `function_call_output`
  items as tool results; `custom_tool_call` / `local_shell_call` items as calls of those tools (their
  input as `{"input": ...}`); `reasoning` items left out of the view (and passed on untouched).
  Function tools are checked against the contract; tools of other types are tolerated, declared with
  open parameters so that a call naming one is not `unknown_tool`.
- `outgoing`: the body as sent, `max_output_tokens` capped to the run's bound, the nudge appended as a
  user message: what goes to an upstream of the same wire.
- `reader()`: a response, or its events, read as a chat.completion (chunks); `response.completed` is
  the end (a stream without it is `incomplete_stream`). Reasoning items go back to the client as they
  came (`WIRE_EXTRA`: Codex resends its encrypted reasoning with `store: false`).
- `render` / `stream_*`: the answer as a response object or its events; a stop is a `message` item
  with one `output_text`, then `response.completed`. Error mode: OpenAI's error body, a 400.

`previous_response_id` (the conversation kept on the server) is not seen by the proxy: the request's
own `input` is all it reads (docs/proxy.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

from .._json import canonical_json
from .._messages import Reply
from ..models._openai import TOKEN_CAPS, cap_tokens
from ..models._errors import error_stop
from ..models._sse import SSEEvent
from ..models._stream import StreamEnd, reply_from_response
from ._answer import WIRE_EXTRA, Answer, Reader, chat_chunk, event_object, sse
from ._wire import BadRequest, Incoming, checked_head, read_as, tool_items, turns
from ._wire import kind as _kind

__all__ = ["NAME", "PATH", "answer_id", "auth", "parse", "outgoing", "reader", "relays", "render", "stream_head", "stream_text",
           "stream_tail", "error"]

NAME = "responses"
PATH = "/v1/responses"  # after the upstream's root (its base URL without /v1)
_OTHER_CALLS = {"custom_tool_call": "input", "local_shell_call": "action"}  # item type -> what it carries
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
_OPEN = {"type": "object", "additionalProperties": True}


def error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "param": None, "code": None}}


def auth(key: str) -> dict[str, str]:
    """The header an upstream of this wire takes its key in."""
    return {"Authorization": f"Bearer {key}"}


def path(incoming: Incoming) -> str:
    """The upstream's route for a request, after its root."""
    return PATH


def relays(body: dict[str, Any]) -> bool:
    """Whether the answer's text may stream as it comes: never here. The response's id, and its
    reasoning items, which come first, are known only once it is whole."""
    return False


# ---------------------------------------------------------------------------- the request
def parse(body: Any) -> Incoming:
    body, cap = checked_head(body, cap="max_output_tokens")
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    raw = turns(raw, "input", "input items", "a string or a non-empty array of items")
    tools = _tools(body.get("tools"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest(f"instructions must be a string, got {_kind(instructions)}", "instructions")
    follows = body.get("previous_response_id")
    if follows is not None and not isinstance(follows, str):
        raise BadRequest(f"previous_response_id must be a string, got {_kind(follows)}", "previous_response_id")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + _items(raw, follows is None)
    if not messages:
        raise BadRequest("input has no message, call or call output", "input")
    params: dict[str, Any] = {"max_tokens": cap} if isinstance(cap, int) else {}
    choice = body.get("tool_choice")
    if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function"):
        params["tool_choice"] = "required" if choice == "required" else \
            {"type": "function", "function": {"name": str(choice.get("name"))}}
    return dataclasses.replace(read_as(NAME, body, messages, tools, params, model=body["model"]), follows=follows)


def _tools(tools: Any) -> list[dict[str, Any]]:
    out, seen = [], set()
    for where, t in tool_items(tools, "tools[{}]"):
        name = t.get("name")
        if t.get("type") == "function":
            if not isinstance(name, str) or not name:
                raise BadRequest(f"{where}.name must be a non-empty string", f"{where}.name")
            params = t.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise BadRequest(f"{where}.parameters must be an object", f"{where}.parameters")
            fn: dict[str, Any] = {"name": name, "parameters": params or _OPEN}
        elif isinstance(name, str) and name or t.get("type") == "local_shell":
            name = name or "local_shell"  # another kind of tool: outside the contract, but callable
            fn = {"name": name, "parameters": _OPEN}
        else:
            continue  # web_search and the like: the server runs them
        if name in seen:
            raise BadRequest(f"{where}.name {name!r} is declared twice"[:300], f"{where}.name")
        seen.add(name)
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise BadRequest(f"{where}.content must be a string or an array of content parts, got {_kind(content)}",
                     f"{where}.content")


def _items(raw: list[Any], whole: bool = True) -> list[dict[str, Any]]:
    """The input items as Chat Completions messages; consecutive calls are one assistant message.
    `whole`: the input holds the conversation (no previous_response_id), so a call output must
    answer a call before it."""
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object, got {_kind(item)}", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"{where}.role must be user, assistant, system or developer, got {role!r}"[:200],
                                 f"{where}.role")
            out.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), where)})
        elif kind == "function_call" or kind in _OTHER_CALLS:
            cid, name = item.get("call_id"), item.get("name") or ("local_shell" if kind == "local_shell_call" else None)
            if not isinstance(cid, str) or not cid or not isinstance(name, str):
                raise BadRequest(f"{where} ({kind}) must have a string call_id and name", where)
            args = item.get("arguments") if kind == "function_call" else canonical_json(
                {"input": item.get(_OTHER_CALLS[kind])})
            if not isinstance(args, str):
                raise BadRequest(f"{where}.arguments must be a string", f"{where}.arguments")
            call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the text and the calls of one answer
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            open_calls.add(cid)
        elif kind in _OUTPUTS:
            cid = item.get("call_id")
            if not isinstance(cid, str) or (whole and cid not in open_calls):
                raise BadRequest(f"{where}.call_id {cid!r} answers no call before it (or answers it twice)"[:300],
                                 f"{where}.call_id")
            open_calls.discard(cid)
            output = item.get("output")
            text = output if isinstance(output, str) else canonical_json(output)
            out.append({"role": "tool", "tool_call_id": cid, "content": text})
        # reasoning and any other item: passed on as it came, outside the view
    return out


def outgoing(incoming: Incoming, note: str | None, max_tokens: int | None) -> dict[str, Any]:
    body = dict(incoming.body or {})
    if max_tokens is not None:  # (and the Chat Completions names, which servers of this wire may read too)
        cap_tokens(body, max_tokens, ("max_output_tokens", *TOKEN_CAPS), "max_output_tokens")
    if note:
        given = body.get("input")
        items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        body["input"] = [*items, {"type": "message", "role": "user", "content": note}]
    return body


# ---------------------------------------------------------------------------- the upstream's reply
def _usage(u: Any) -> dict[str, int] | None:
    if not isinstance(u, dict):
        return None
    p = u.get("input_tokens") if isinstance(u.get("input_tokens"), int) else 0
    c = u.get("output_tokens") if isinstance(u.get("output_tokens"), int) else 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish(resp: dict[str, Any], calls: bool) -> str:
    if resp.get("status") == "incomplete":
        return "length"
    return "tool_calls" if calls else "stop"


def _call_of(item: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    kind = item.get("type")
    args = item.get("arguments") if kind == "function_call" else canonical_json(
        {"input": item.get(_OTHER_CALLS.get(str(kind), "input"))})
    name = item.get("name") or ("local_shell" if kind == "local_shell_call" else "")
    call = {"id": item.get("call_id") or "", "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else canonical_json(args)}}
    return call if index is None else {"index": index, **call}


def _is_call(item: Any) -> bool:
    return isinstance(item, dict) and (item.get("type") == "function_call" or item.get("type") in _OTHER_CALLS)


def answer_id(answer: Answer) -> str:
    """The id the client gets for an answer (the upstream's own, for a request it answered: the id a
    later previous_response_id names, there and here)."""
    extra = answer.message.get(WIRE_EXTRA)
    given = extra.get("id") if isinstance(extra, dict) else None
    return given if isinstance(given, str) and given else "resp_" + answer.ident.removeprefix("chatcmpl-")


def _reply_json(obj: Any, kept: list[dict[str, Any]], meta: dict[str, Any]) -> Reply:
    if not isinstance(obj, dict) or not isinstance(obj.get("output"), list):
        if isinstance(obj, dict) and obj.get("error"):
            raise error_stop(None, obj)
        return reply_from_response(obj)  # names what is wrong
    texts, calls = [], []
    kept[:] = [it for it in obj["output"] if isinstance(it, dict) and it.get("type") == "reasoning"]
    meta["id"] = obj.get("id")
    meta["calls"] = {it.get("call_id"): it for it in obj["output"] if isinstance(it, dict) and it.get("type") in _OTHER_CALLS}
    for item in obj["output"]:
        if isinstance(item, dict) and item.get("type") == "message":
            texts += [p["text"] for p in item.get("content") or [] if isinstance(p, dict)
                      and p.get("type") == "output_text" and isinstance(p.get("text"), str)]
        elif _is_call(item):
            calls.append(_call_of(item))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    chat: dict[str, Any] = {"id": obj.get("id"), "object": "chat.completion", "model": obj.get("model"),
                            "choices": [{"index": 0, "message": message, "finish_reason": _finish(obj, bool(calls))}]}
    usage = _usage(obj.get("usage"))
    if usage is not None:
        chat["usage"] = usage
    return reply_from_response(chat)


def reader(incoming: Incoming | None = None) -> Reader:
    """A reader for one reply: its events as chat chunks (calls keyed by output index)."""
    kept: list[dict[str, Any]] = []
    calls: set[int] = set()
    meta: dict[str, Any] = {}

    def event(ev: SSEEvent, end: StreamEnd) -> dict[str, Any] | None:
        obj = event_object(ev, end)
        if obj is None:
            return None
        kind = obj.get("type") or ev.event
        if kind in ("error", "response.failed"):
            failed = obj.get("response") if isinstance(obj.get("response"), dict) else None
            raise error_stop(None, failed if failed is not None and failed.get("error") else obj, tools=end.tools)
        end.chunks += 1
        index = obj.get("output_index") if isinstance(obj.get("output_index"), int) else 0
        if kind == "response.created":
            resp = obj.get("response") if isinstance(obj.get("response"), dict) else {}
            kept.clear()
            meta["id"] = resp.get("id")
            return {"id": resp.get("id"), "model": resp.get("model"), "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        if kind == "response.output_item.added" and _is_call(obj.get("item")):
            calls.add(index)
            first = _call_of(obj["item"], index)
            first["function"]["arguments"] = ""
            return chat_chunk({"tool_calls": [first]})
        if kind == "response.function_call_arguments.delta" and isinstance(obj.get("delta"), str):
            return chat_chunk({"tool_calls": [{"index": index, "function": {"arguments": obj["delta"]}}]})
        if kind == "response.output_item.done" and isinstance(obj.get("item"), dict):
            item = obj["item"]
            if item.get("type") == "reasoning":
                kept.append(item)
            elif item.get("type") in _OTHER_CALLS:  # their input comes whole, here
                meta.setdefault("calls", {})[item.get("call_id")] = item
                return chat_chunk({"tool_calls": [{"index": index, "function": {
                    "arguments": _call_of(item)["function"]["arguments"]}}]})
            return None
        if kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
            return chat_chunk({"content": obj["delta"]})
        if kind in ("response.completed", "response.incomplete"):
            resp = obj.get("response") if isinstance(obj.get("response"), dict) else {}
            chunk = chat_chunk({}, _finish(resp, bool(calls)))
            usage = _usage(resp.get("usage"))
            if usage is not None:
                chunk["usage"] = usage
            return chunk  # its finish reason is the end (the reader stops at `end.done` before a chunk)
        return None

    def extra() -> dict[str, Any] | None:
        out: dict[str, Any] = {"reasoning": list(kept)} if kept else {}
        if isinstance(meta.get("id"), str):
            out["id"] = meta["id"]
        if meta.get("calls"):  # custom and local-shell calls go back in their own item type
            out["calls"] = dict(meta["calls"])
        return out or None

    return Reader(lambda obj: _reply_json(obj, kept, meta), event, extra)


# ---------------------------------------------------------------------------- the answer
def _ident(answer: Answer) -> str:
    return answer_id(answer)


def _output(answer: Answer) -> list[dict[str, Any]]:
    extra = answer.message.get(WIRE_EXTRA)
    out: list[dict[str, Any]] = list(extra.get("reasoning") or []) if isinstance(extra, dict) else []
    text = answer.message.get("content")
    if text:
        out.append({"type": "message", "id": _msg_id(answer), "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]})
    others = extra.get("calls") if isinstance(extra, dict) and isinstance(extra.get("calls"), dict) else {}
    for i, c in enumerate(answer.message.get("tool_calls") or []):
        if c["id"] in others:  # released as it came (a custom tool's input, a local-shell action)
            out.append({**others[c["id"]], "status": "completed"})
            continue
        out.append({"type": "function_call", "id": f"fc_{i}_{_ident(answer).removeprefix('resp_')}", "status": "completed",
                    "call_id": c["id"], "name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"})
    return out


def _response(answer: Answer, output: list[dict[str, Any]], status: str) -> dict[str, Any]:
    u = answer.usage or {}
    p, c = u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0
    return {"id": _ident(answer), "object": "response", "created_at": answer.created or int(time.time()),
            "status": status, "model": answer.model, "output": output, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
            "usage": {"input_tokens": p, "output_tokens": c, "total_tokens": p + c}}


def render(answer: Answer) -> tuple[int, dict[str, Any]]:
    if answer.status != 200:
        return answer.status, {"error": {"message": str(answer.message.get("content") or ""), "type": "loopfence_stop",
                                         "param": None, "code": str(answer.stop.reason) if answer.stop else None}}
    return 200, _response(answer, _output(answer), "completed")


_SEQUENCE = itertools.count()  # every event's `sequence_number`: increasing within each stream (and across)


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\n".encode() + sse({"type": name, "sequence_number": next(_SEQUENCE), **obj})


def stream_head(answer: Answer) -> list[bytes]:
    head = _response(answer, [], "in_progress")
    return [_event("response.created", {"response": head}), _event("response.in_progress", {"response": head})]


def _msg_id(answer: Answer) -> str:
    return f"msg_{_ident(answer).removeprefix('resp_')}"


def stream_text(text: str, first: bool, answer: Answer | None = None, index: int = 0) -> list[bytes]:
    """A piece of the answer's text; the first opens the message item (at output `index`)."""
    assert answer is not None
    mid = _msg_id(answer)
    out = []
    if first:
        out.append(_event("response.output_item.added", {"output_index": index, "item": {
            "type": "message", "id": mid, "status": "in_progress", "role": "assistant", "content": []}}))
        out.append(_event("response.content_part.added", {"item_id": mid, "output_index": index, "content_index": 0,
                                                          "part": {"type": "output_text", "text": "", "annotations": []}}))
    out.append(_event("response.output_text.delta", {"item_id": mid, "output_index": index, "content_index": 0,
                                                     "delta": text}))
    return out


def stream_tail(answer: Answer, sent: str) -> list[bytes]:
    if answer.status != 200:
        return [_event("error", {"code": str(answer.stop.reason) if answer.stop else None,
                                 "message": str(answer.message.get("content") or ""), "param": None})]
    content = answer.message.get("content") or ""
    if answer.stop is not None and sent:
        rest = "\n\n" + content
    else:
        rest = content[len(sent):] if content.startswith(sent) else content
    output = _output(answer)
    if sent:  # the message streamed so far is output item 0 and holds all its text: what follows keeps the order
        message = next(it for it in output if it["type"] == "message")
        message["content"][0]["text"] = sent + rest
        output = [message, *[it for it in output if it["type"] != "message"]]
    out: list[bytes] = []
    for index, item in enumerate(output):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out += stream_text(rest, not sent, answer, index) if rest or not sent else []
            done = {**item["content"][0], "text": text}
            out.append(_event("response.output_text.done", {"item_id": item["id"], "output_index": index,
                                                            "content_index": 0, "text": text}))
            out.append(_event("response.content_part.done", {"item_id": item["id"], "output_index": index,
                                                             "content_index": 0, "part": done}))
        elif item["type"] == "function_call":
            out.append(_event("response.output_item.added", {"output_index": index,
                                                              "item": {**item, "arguments": "", "status": "in_progress"}}))
            out.append(_event("response.function_call_arguments.delta", {
                "item_id": item["id"], "output_index": index, "delta": item["arguments"]}))
            out.append(_event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "arguments": item["arguments"]}))
        else:
            out.append(_event("response.output_item.added", {"output_index": index, "item": item}))
        out.append(_event("response.output_item.done", {"output_index": index, "item": item}))
    out.append(_event("response.completed", {"response": _response(answer, output, "completed")}))
    return out
