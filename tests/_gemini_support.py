"""The Gemini wire for the proxy's tests: an upstream that speaks it (any chat reply form turned into a
GenerateContentResponse, or its chunks), and a client loop over raw HTTP that runs the tools for real
and sends `functionResponse` parts back (no call ids, as Gemini CLI's model gives none)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from _anthropic_support import OnWire
from _proxy_support import Ended, ReplyServer, ScriptServer, task

__all__ = ["to_gemini", "gemini_chunks", "GeminiScripts", "GeminiReplies", "read_chunks", "converse", "post_gemini"]


def to_gemini(form: dict[str, Any]) -> dict[str, Any]:
    message = form["choices"][0]["message"]
    usage = form.get("usage") or {}
    parts: list[dict[str, Any]] = [{"text": message["content"]}] if message.get("content") else []
    for c in message.get("tool_calls") or []:
        raw = c["function"].get("arguments") or "{}"
        try:
            args: Any = json.loads(raw)
        except ValueError:
            args = raw
        parts.append({"functionCall": {"name": c["function"]["name"], "args": args}})
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": usage.get("prompt_tokens", 0),
                              "candidatesTokenCount": usage.get("completion_tokens", 0)},
            "modelVersion": "fake", "responseId": "up-1"}


def gemini_chunks(resp: dict[str, Any], *, cut: bool = False) -> str:
    """A response as its SSE chunks: the text, then the calls and the finish; `cut`: no last chunk."""
    parts = resp["candidates"][0]["content"]["parts"]
    texts = [p for p in parts if "text" in p]
    rest = [p for p in parts if "text" not in p]
    chunks = [{"candidates": [{"content": {"role": "model", "parts": [p]}, "index": 0}]} for p in texts]
    if not cut:
        chunks.append({**resp, "candidates": [{**resp["candidates"][0], "content": {"role": "model", "parts": rest}}]})
    elif rest:
        chunks.append({"candidates": [{"content": {"role": "model", "parts": rest[:1]}, "index": 0}]})  # no finish
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)


def _as_wire(form: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    if "choices" not in form:
        return form
    resp = to_gemini(form)
    return {"sse": gemini_chunks(resp)} if body.get("_stream") else {"status": 200, "body": resp}


def _as_chat(body: dict[str, Any]) -> dict[str, Any]:
    messages = []
    for c in body.get("contents") or []:
        text = " ".join(p.get("text", "") for p in c.get("parts") or [] if isinstance(p, dict))
        messages.append({"role": "assistant" if c.get("role") == "model" else "user", "content": text})
    return {**body, "messages": messages}


class _OnGemini(OnWire):
    ROUTE = "Content"  # generateContent and streamGenerateContent (the query names the stream)
    as_wire = staticmethod(lambda form, body: _as_wire(form, body))
    as_chat = staticmethod(lambda body: _as_chat(body))

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return super()._next({**body, "_stream": "event-stream" in headers.get("accept", "")}, headers)


class GeminiScripts(_OnGemini, ScriptServer):
    chat_view = True


class GeminiReplies(_OnGemini, ReplyServer):
    pass


def read_chunks(text: str) -> dict[str, Any]:
    """A Gemini SSE stream joined into one response: the parts in order, the last finish and usage."""
    parts, last = [], {}
    for chunk in text.split("\n\n"):
        if chunk.startswith("data: "):
            data = json.loads(chunk[6:])
            if "error" in data:
                return data
            last = data
            for p in data["candidates"][0]["content"]["parts"]:
                if "text" in p and parts and "text" in parts[-1]:
                    parts[-1] = {"text": parts[-1]["text"] + p["text"]}
                else:
                    parts.append(p)
    return {**last, "candidates": [{**last["candidates"][0], "content": {"role": "model", "parts": parts}}]}


def post_gemini(root: str, body: dict[str, Any], *, stream: bool = False, model: str = "fake",
                **kw: Any) -> tuple[httpx.Response, dict[str, Any]]:
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    r = httpx.post(f"{root}/v1beta/models/{model}:{method}", json=body, timeout=60, **kw)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return r, read_chunks(r.text)
    return r, r.json()


def converse(root: str, name: str, ws: Any, *, tag: str = "", stream: bool = False, turns: int = 40) -> Ended:
    from loopfence import tool

    decls = [{"name": s["function"]["name"], "description": s["function"].get("description", ""),
              "parameters": s["function"]["parameters"]} for s in (tool(fn).schema() for fn in ws.tools.values())]
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": task(name, tag)}]}]
    ended = Ended()
    for turn in range(turns):
        r, resp = post_gemini(root, {"contents": contents, "systemInstruction": {"parts": [{"text": "Use the tools."}]},
                                     "tools": [{"functionDeclarations": decls}]}, stream=stream)
        assert r.status_code == 200, r.text
        ended.run, ended.stop, ended.turns = r.headers["x-loopfence-run"], r.headers.get("x-loopfence-stop"), turn + 1
        parts = resp["candidates"][0]["content"]["parts"]
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        contents.append({"role": "model", "parts": parts})
        if not calls:
            ended.answer = "".join(p.get("text", "") for p in parts)
            return ended
        answers = []
        for c in calls:
            out = ws.tools[c["name"]](**c["args"])
            answers.append({"functionResponse": {"name": c["name"], "response": {"output": str(out)}}})
            ended.executions += 1
        contents.append({"role": "user", "parts": answers})
    raise AssertionError(f"{name}: no answer in {turns} turns")
