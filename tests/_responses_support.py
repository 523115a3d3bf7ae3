"""The OpenAI Responses wire for the proxy's tests: an upstream that speaks it (any chat reply form
turned into a response or its events), and a client loop over raw HTTP that runs the tools for real
and sends `function_call_output` items back (the whole input each turn, as Codex does)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from _anthropic_support import OnWire, _chat_view
from _proxy_support import Ended, ReplyServer, ScriptServer, task

__all__ = ["to_response", "response_events", "ResponsesScripts", "ResponsesReplies", "read_response", "converse",
           "post_responses"]


def to_response(form: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion reply form as a Responses response object."""
    message = form["choices"][0]["message"]
    usage = form.get("usage") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": "msg_up", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for i, c in enumerate(message.get("tool_calls") or []):
        output.append({"type": "function_call", "id": f"fc_up{i}", "call_id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"].get("arguments") or "{}", "status": "completed"})
    return {"id": "resp_up", "object": "response", "status": "completed", "model": "fake", "output": output,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)}}


def _event(name: str, obj: dict[str, Any], n: list[int]) -> str:
    n[0] += 1
    return f"event: {name}\ndata: {json.dumps({'type': name, 'sequence_number': n[0], **obj})}\n\n"


def response_events(resp: dict[str, Any], *, cut_in_call: bool = False) -> str:
    """A response as its event stream (each call's arguments in two deltas); `cut_in_call`: the
    stream ends inside the first function call's arguments."""
    n = [0]
    out = [_event("response.created", {"response": {**resp, "status": "in_progress", "output": []}}, n)]
    for i, item in enumerate(resp["output"]):
        if item["type"] == "message":
            out.append(_event("response.output_item.added", {"output_index": i, "item": {**item, "content": []}}, n))
            out.append(_event("response.output_text.delta", {"output_index": i, "item_id": item["id"], "content_index": 0,
                                                             "delta": item["content"][0]["text"]}, n))
        else:
            out.append(_event("response.output_item.added", {"output_index": i, "item": {**item, "arguments": ""}}, n))
            half = len(item["arguments"]) // 2
            out.append(_event("response.function_call_arguments.delta", {"output_index": i, "item_id": item["id"],
                                                                         "delta": item["arguments"][:half]}, n))
            if cut_in_call:
                return "".join(out)
            out.append(_event("response.function_call_arguments.delta", {"output_index": i, "item_id": item["id"],
                                                                         "delta": item["arguments"][half:]}, n))
        out.append(_event("response.output_item.done", {"output_index": i, "item": item}, n))
    out.append(_event("response.completed", {"response": resp}, n))
    return "".join(out)


def _as_wire(form: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    if "choices" not in form:
        return form
    resp = to_response(form)
    return {"sse": response_events(resp)} if body.get("stream") is True else {"status": 200, "body": resp}


def _as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the chat scripts read it: its input's messages (the task first), a turn per call
    answered."""
    messages: list[dict[str, Any]] = []
    for item in body.get("input") or []:
        kind = item.get("type", "message")
        role = {"function_call": "assistant", "function_call_output": "tool"}.get(kind, item.get("role"))
        if kind not in ("message", "function_call", "function_call_output"):
            continue
        if role == "assistant" and messages and messages[-1]["role"] == "assistant":
            continue  # an answer's text and its calls are one turn
        messages.append({"role": role, "content": item.get("content") or ""})
    return _chat_view({**body, "messages": messages})


class _OnResponses(OnWire):
    ROUTE = "/v1/responses"
    SUFFIX = "/v1"
    as_wire = staticmethod(lambda form, body: _as_wire(form, body))
    as_chat = staticmethod(lambda body: _as_chat(body))


class ResponsesScripts(_OnResponses, ScriptServer):
    """The bench's scripts (ScriptServer), on the Responses wire."""

    chat_view = True


class ResponsesReplies(_OnResponses, ReplyServer):
    """`reply(body)` (a chat reply form, or any FakeServer form), on the Responses wire."""


def read_response(text: str) -> dict[str, Any]:
    """The response a Responses event stream ends with (`response.completed`), its events' names in `events`."""
    names, final = [], {}
    for chunk in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "data" not in lines:
            continue
        data = json.loads(lines["data"])
        assert lines.get("event") == data.get("type"), chunk
        names.append(data["type"])
        if data["type"] == "response.completed":
            final = data["response"]
        elif data["type"] == "error":
            final = {"error": data}
    return {**final, "events": names}


def post_responses(base: str, body: dict[str, Any], **kw: Any) -> tuple[httpx.Response, dict[str, Any]]:
    r = httpx.post(f"{base}/responses", json=body, timeout=60, **kw)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return r, read_response(r.text)
    return r, r.json()


def converse(base: str, name: str, ws: Any, *, tag: str = "", stream: bool = False, turns: int = 40) -> Ended:
    """The bench script `name` as a Responses client runs it (store false: the whole input each turn)."""
    from loopfence import tool

    tools = [{"type": "function", "name": s["function"]["name"], "description": s["function"].get("description", ""),
              "parameters": s["function"]["parameters"]} for s in (tool(fn).schema() for fn in ws.tools.values())]
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": task(name, tag)}]
    ended = Ended()
    for turn in range(turns):
        r, resp = post_responses(base, {"model": "fake", "instructions": "Use the tools.", "input": items,
                                        "tools": tools, "stream": stream, "store": False})
        assert r.status_code == 200, r.text
        ended.run, ended.stop, ended.turns = r.headers["x-loopfence-run"], r.headers.get("x-loopfence-stop"), turn + 1
        calls = [it for it in resp["output"] if it["type"] == "function_call"]
        items += [it for it in resp["output"]]
        if not calls:
            ended.answer = "".join(p["text"] for it in resp["output"] if it["type"] == "message" for p in it["content"])
            return ended
        for c in calls:
            out = ws.tools[c["name"]](**json.loads(c["arguments"]))
            items.append({"type": "function_call_output", "call_id": c["call_id"], "output": str(out)})
            ended.executions += 1
    raise AssertionError(f"{name}: no answer in {turns} turns")
