"""The Anthropic Messages wire for the proxy's tests: an upstream that speaks it (the bench's scripts,
or any chat reply form, turned into a Messages response or its event stream), and a client loop over
raw HTTP that runs the tools for real and sends `tool_result` blocks back."""

from __future__ import annotations

import json
from typing import Any

import httpx

from _proxy_support import Ended, ReplyServer, ScriptServer, task

__all__ = ["OnWire", "to_messages", "events_text", "AnthropicScripts", "AnthropicReplies", "read_events", "converse",
           "post_messages"]


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if message.get("content"):
        out.append({"type": "text", "text": message["content"]})
    for c in message.get("tool_calls") or []:
        raw = c["function"].get("arguments") or "{}"
        try:
            args: Any = json.loads(raw)
        except ValueError:
            args = raw  # arguments that are not JSON: the block's input is that text
        out.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": args})
    return out


def to_messages(form: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion reply form as a Messages response."""
    choice = form["choices"][0]
    usage = form.get("usage") or {}
    reason = {"tool_calls": "tool_use", "length": "max_tokens"}.get(choice.get("finish_reason"), "end_turn")
    return {"id": "msg_up", "type": "message", "role": "assistant", "model": "fake", "content": _blocks(choice["message"]),
            "stop_reason": reason, "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)}}


def _event(name: str, obj: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **obj})}\n\n"


def events_text(msg: dict[str, Any], *, cut_in_tool_use: bool = False) -> str:
    """A Messages response as its event stream (each tool_use's input in two `input_json_delta`
    pieces); `cut_in_tool_use`: the stream ends inside the first tool_use's input."""
    out = [_event("message_start", {"message": {**msg, "content": [], "stop_reason": None,
                                                "usage": {"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 0}}})]
    for i, b in enumerate(msg["content"]):
        if b["type"] == "thinking":
            out.append(_event("content_block_start", {"index": i, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            out.append(_event("content_block_delta", {"index": i, "delta": {"type": "thinking_delta",
                                                                              "thinking": b["thinking"]}}))
            out.append(_event("content_block_delta", {"index": i, "delta": {"type": "signature_delta",
                                                                              "signature": b["signature"]}}))
        elif b["type"] == "text":
            out.append(_event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            out.append(_event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": b["text"]}}))
        else:
            raw = b["input"] if isinstance(b["input"], str) else json.dumps(b["input"])
            out.append(_event("content_block_start", {"index": i, "content_block": {**b, "input": {}}}))
            half = len(raw) // 2
            out.append(_event("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                              "partial_json": raw[:half]}}))
            if cut_in_tool_use:
                return "".join(out)
            out.append(_event("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                              "partial_json": raw[half:]}}))
        out.append(_event("content_block_stop", {"index": i}))
    out.append(_event("message_delta", {"delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                                        "usage": {"output_tokens": msg["usage"]["output_tokens"]}}))
    out.append(_event("message_stop", {}))
    return "".join(out)


def _as_wire(form: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    if "choices" not in form:
        return form  # an error or a raw form: as it is
    msg = to_messages(form)
    return {"sse": events_text(msg)} if body.get("stream") is True else {"status": 200, "body": msg}


def _chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the chat scripts read it: the task is the first user text, the turn the number
    of assistant messages."""
    messages = []
    for m in body.get("messages") or []:
        content = m.get("content")
        text = content if isinstance(content, str) else " ".join(
            b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")
        messages.append({"role": m.get("role"), "content": text})
    return {**body, "messages": messages}


class OnWire:
    """A FakeServer's replies served on another wire at `root` (POST ROUTE): each reply form through
    `as_wire(form, body)`; `chat_view`: the request given to the server's chat scripts as `as_chat`
    reads it. This one: the Anthropic wire."""

    ROUTE = "/v1/messages"
    SUFFIX = ""  # the root's path, as the wire's clients take it
    chat_view = False
    as_wire = staticmethod(lambda form, body: _as_wire(form, body))
    as_chat = staticmethod(lambda body: _chat_view(body))

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.SUFFIX}"  # type: ignore[attr-defined]

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        form = super()._next(self.as_chat(body) if self.chat_view else body, headers)  # type: ignore[misc]
        return self.as_wire(form, body)


class AnthropicScripts(OnWire, ScriptServer):
    """The bench's scripts (ScriptServer), on the Anthropic wire."""

    chat_view = True


class AnthropicReplies(OnWire, ReplyServer):
    """`reply(body)` (a chat reply form, or any FakeServer form), on the Anthropic wire."""


def read_events(text: str) -> dict[str, Any]:
    """A Messages event stream read back into the message it carries; `events`: their names in order."""
    msg: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    names = []
    for chunk in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "data" not in lines:
            continue
        data = json.loads(lines["data"])
        names.append(lines.get("event"))
        assert lines.get("event") == data.get("type"), chunk
        kind = data["type"]
        if kind == "message_start":
            msg = dict(data["message"])
        elif kind == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif kind == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[data["index"]]["text"] += delta["text"]
            elif delta["type"] in ("thinking_delta", "signature_delta"):
                key = delta["type"].removesuffix("_delta")
                blocks[data["index"]][key] += delta[key]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif kind == "message_delta":
            msg["stop_reason"] = data["delta"]["stop_reason"]
            msg["usage"] = {**msg.get("usage", {}), **data.get("usage", {})}
        elif kind == "error":
            msg["error"] = data["error"]
    for i, raw in partial.items():
        blocks[i]["input"] = json.loads(raw)
    msg["content"] = [blocks[i] for i in sorted(blocks)]
    msg["events"] = names
    return msg


def post_messages(root: str, body: dict[str, Any], **kw: Any) -> tuple[httpx.Response, dict[str, Any]]:
    """POST /v1/messages: the response and the message (read from its events when it streamed)."""
    r = httpx.post(f"{root}/v1/messages", json=body, timeout=60, **kw)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return r, read_events(r.text)
    return r, r.json()


def converse(root: str, name: str, ws: Any, *, tag: str = "", stream: bool = False, turns: int = 40) -> Ended:
    """The bench script `name` as a Messages client runs it: tools run for real, results sent back as
    `tool_result` blocks, until an answer (a reply with no tool_use)."""
    from loopfence import tool

    tools = [{"name": s["function"]["name"], "description": s["function"].get("description", ""),
              "input_schema": s["function"]["parameters"]} for s in (tool(fn).schema() for fn in ws.tools.values())]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task(name, tag)}]
    ended = Ended()
    for turn in range(turns):
        r, msg = post_messages(root, {"model": "fake", "max_tokens": 1024, "system": "Use the tools.",
                                      "messages": messages, "tools": tools, "stream": stream})
        assert r.status_code == 200, r.text
        ended.run, ended.stop, ended.turns = r.headers["x-loopfence-run"], r.headers.get("x-loopfence-stop"), turn + 1
        uses = [b for b in msg["content"] if b["type"] == "tool_use"]
        messages.append({"role": "assistant", "content": msg["content"]})
        if msg["stop_reason"] != "tool_use":
            assert not uses, msg
            ended.answer = "".join(b["text"] for b in msg["content"] if b["type"] == "text")
            return ended
        results = []
        for b in uses:
            out = ws.tools[b["name"]](**b["input"])
            results.append({"type": "tool_result", "tool_use_id": b["id"], "content": str(out)})
            ended.executions += 1
        messages.append({"role": "user", "content": results})
    raise AssertionError(f"{name}: no answer in {turns} turns")
