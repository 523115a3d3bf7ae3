"""The Gemini wire (`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`): one
translation both ways, no rule of its own (the Anthropic and Responses modules are its models).

- `parse(body, model, stream)`: `contents[].parts[]` read as Chat Completions: `systemInstruction` as
  a system message, `text` parts by role (`model` is the assistant), `functionCall` parts as the
  assistant's calls, `functionResponse` parts as their results. A call is known by its position,
  `call_<model turn>_<position>`, the same whenever the conversation is read again (whatever id the
  upstream or the client gives it); a result answers the call its id names, else the oldest open call
  of its name. `thought` parts stay out of
  the view. Function declarations are checked against the contract; other tools (`googleSearch`,
  code execution) are the server's.
- `outgoing`: the body as sent, `generationConfig.maxOutputTokens` capped, the nudge appended as a
  user content: what goes to an upstream of the same wire.
- `reader(incoming)`: a response, or its chunks, read as a chat.completion (chunks); a stream is whole
  at a `finishReason`. The upstream's parts go back to the client as they came (`thoughtSignature`
  and unknown fields kept: `WIRE_EXTRA`).
- `render` / `stream_*`: a candidate; a stop is one text part with `finishReason: "STOP"`. Error
  mode: Google's error body.
"""

from __future__ import annotations

from typing import Any

from .._json import canonical_json, loads
from .._messages import Reply
from ..models._errors import error_stop
from ..models._openai import cap_tokens
from ..models._sse import SSEEvent
from ..models._stream import StreamEnd, reply_from_response
from ._answer import WIRE_EXTRA, Answer, Reader, chat_chunk, event_object, sse
from ._wire import BadRequest, Incoming, checked_head, read_as, tool_items, turns
from ._wire import kind as _kind

__all__ = ["NAME", "auth", "parse", "outgoing", "reader", "relays", "path", "render", "stream_head", "stream_text",
           "stream_tail", "error"]

NAME = "gemini"
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE"}
_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
_ID = "x_loopfence_call"  # on a kept functionCall part: the id the rules know it by (never sent)


def error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}


def auth(key: str) -> dict[str, str]:
    return {"x-goog-api-key": key}


def counted(tokens: int) -> dict[str, Any]:
    """An estimate of a request's tokens, as countTokens answers."""
    return {"totalTokens": tokens}


def relays(body: dict[str, Any]) -> bool:
    """Text streams as it comes (a Gemini stream is chunks of one candidate: the calls come last)."""
    return True


def path(incoming: Incoming) -> str:
    """The upstream's route for the request, after its root."""
    method = "streamGenerateContent?alt=sse" if incoming.stream else "generateContent"
    return f"/v1beta/models/{incoming.model}:{method}"


# ---------------------------------------------------------------------------- the request
def parse(body: Any, model: str = "", stream: bool = False) -> Incoming:
    body, cap = checked_head(body, model=False, cap="maxOutputTokens", config="generationConfig")
    contents = turns(body.get("contents"), "contents")
    tools = _tools(body.get("tools"))
    messages = _system(body.get("systemInstruction")) + _contents(contents)
    params: dict[str, Any] = {"max_tokens": cap} if isinstance(cap, int) else {}
    mode = (((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
            if isinstance(body.get("toolConfig"), dict) else None)
    if mode == "ANY":
        params["tool_choice"] = "required"
    incoming = read_as(NAME, {**body, "stream": stream, "x_model": model}, messages, tools, params, model=model)
    return incoming


def _system(instruction: Any) -> list[dict[str, Any]]:
    if instruction is None:
        return []
    if isinstance(instruction, str):
        return [{"role": "system", "content": instruction}]
    if isinstance(instruction, dict) and isinstance(instruction.get("parts"), list):
        text = "\n".join(p["text"] for p in instruction["parts"] if isinstance(p, dict) and isinstance(p.get("text"), str))
        return [{"role": "system", "content": text}] if text else []
    raise BadRequest(f"systemInstruction must be a content ({{\"parts\": [...]}}), got {_kind(instruction)}",
                     "systemInstruction")


def _tools(tools: Any) -> list[dict[str, Any]]:
    out, seen = [], set()
    for where, t in tool_items(tools, "tools[{}]"):
        decls = t.get("functionDeclarations", t.get("function_declarations"))
        if decls is None:
            continue  # googleSearch, codeExecution: the server's own
        if not isinstance(decls, list):
            raise BadRequest(f"{where}.functionDeclarations must be an array", f"{where}.functionDeclarations")
        for j, d in enumerate(decls):
            at = f"{where}.functionDeclarations[{j}]"
            name = d.get("name") if isinstance(d, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"{at}.name must be a non-empty string", f"{at}.name")
            if name in seen:
                raise BadRequest(f"{at}.name {name!r} is declared twice"[:300], f"{at}.name")
            seen.add(name)
            schema = d.get("parametersJsonSchema", d.get("parameters"))
            fn: dict[str, Any] = {"name": name, "parameters": _lowered(schema) if isinstance(schema, dict)
                                  else {"type": "object", "properties": {}}}
            if isinstance(d.get("description"), str):
                fn["description"] = d["description"]
            out.append({"type": "function", "function": fn})
    return out


def _lowered(schema: Any) -> Any:
    """Gemini's OpenAPI-style schema (`"type": "OBJECT"`) as JSON Schema (`"type": "object"`)."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lowered(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lowered(v) for v in schema]
    return schema


def _contents(contents: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    open_calls: dict[str, list[str]] = {}  # name -> the open calls' ids, oldest first
    given_ids: dict[str, str] = {}  # an id the upstream or the client gave a call -> the id the rules know it by
    model_turn = 0
    for i, c in enumerate(contents):
        where = f"contents[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("parts"), list):
            raise BadRequest(f"{where} must be a content with an array of parts", where)
        role = c.get("role", "user")
        if role not in ("user", "model", "function"):
            raise BadRequest(f"{where}.role must be user or model, got {role!r}"[:200], f"{where}.role")
        parts = [p for p in c["parts"] if isinstance(p, dict)]
        texts = [p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
        if role == "model":
            calls = []
            for j, p in enumerate(q for q in parts if isinstance(q.get("functionCall"), dict)):
                fc = p["functionCall"]
                if not isinstance(fc.get("name"), str):
                    raise BadRequest(f"{where}: a functionCall must have a string name", where)
                cid = f"call_{model_turn}_{j}"  # by position: whatever ids the client adds, the same each time
                if isinstance(fc.get("id"), str) and fc["id"]:
                    given_ids[fc["id"]] = cid
                calls.append({"id": cid, "type": "function",
                              "function": {"name": fc["name"], "arguments": canonical_json(fc.get("args") or {})}})
                open_calls.setdefault(fc["name"], []).append(cid)
            message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            model_turn += 1
            continue
        for p in parts:
            fr = p.get("functionResponse")
            if not isinstance(fr, dict):
                continue
            name, cid = fr.get("name"), given_ids.get(str(fr.get("id")))
            waiting = open_calls.get(name, []) if isinstance(name, str) else []
            if cid not in waiting:  # no id, or one of no call: the oldest open call of its name
                cid = waiting[0] if waiting else None
            if cid is None:
                raise BadRequest(f"{where}: a functionResponse ({name!r}) answers no open functionCall"[:300], where)
            waiting.remove(cid)
            response = fr.get("response")
            out.append({"role": "tool", "tool_call_id": cid,
                        "content": response if isinstance(response, str) else canonical_json(response)})
        if texts or not any(isinstance(p.get("functionResponse"), dict) for p in parts):
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


TOKEN_FIELDS = ("maxOutputTokens", "max_output_tokens")  # generationConfig's reply length, by either name


def outgoing(incoming: Incoming, note: str | None, max_tokens: int | None) -> dict[str, Any]:
    body = {k: v for k, v in (incoming.body or {}).items() if k not in ("stream", "x_model")}
    if max_tokens is not None:  # the API reads a field by its JSON name or its proto name: both capped
        for holder in ("generationConfig", "generation_config"):
            if holder in body or holder == "generationConfig":
                config = dict(body.get(holder) or {})
                cap_tokens(config, max_tokens, TOKEN_FIELDS, "maxOutputTokens")
                body[holder] = config
    if note:
        body["contents"] = [*body["contents"], {"role": "user", "parts": [{"text": note}]}]
    return body


# ---------------------------------------------------------------------------- the upstream's reply
def _model_turns(incoming: Incoming | None) -> int:
    contents = (incoming.body or {}).get("contents") if incoming is not None else None
    return sum(1 for c in contents or [] if isinstance(c, dict) and c.get("role") == "model")


def _arguments(args: Any) -> str:
    """A call's args as arguments text: an object as canonical JSON; text that is not one as it is
    (the contract names it: invalid JSON)."""
    return args if isinstance(args, str) else canonical_json(args if args is not None else {})


def _usage(u: Any) -> dict[str, int] | None:
    if not isinstance(u, dict):
        return None
    p = u.get("promptTokenCount") if isinstance(u.get("promptTokenCount"), int) else 0
    c = sum(v for k in ("candidatesTokenCount", "thoughtsTokenCount") if isinstance(v := u.get(k), int))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def reader(incoming: Incoming | None = None) -> Reader:
    """A reader for one reply: each chunk's parts as chat deltas (calls numbered as `parse` numbers them)."""
    turn = _model_turns(incoming)
    kept: list[dict[str, Any]] = []  # the upstream's parts, as they came
    state = {"calls": 0}

    def deltas(obj: dict[str, Any]) -> tuple[dict[str, Any], str | None, dict[str, int] | None]:
        if obj.get("error"):
            raise error_stop(None, obj)
        cands = obj.get("candidates")
        cand = cands[0] if isinstance(cands, list) and cands and isinstance(cands[0], dict) else {}
        parts = (cand.get("content") or {}).get("parts") if isinstance(cand.get("content"), dict) else None
        delta: dict[str, Any] = {}
        for p in parts if isinstance(parts, list) else []:
            if not isinstance(p, dict):
                continue
            kept.append(p)
            if isinstance(p.get("text"), str) and not p.get("thought"):
                delta["content"] = delta.get("content", "") + p["text"]
            elif isinstance(p.get("functionCall"), dict):
                fc = p["functionCall"]
                j = state["calls"]
                state["calls"] += 1
                cid = f"call_{turn}_{j}"  # by position, as `parse` reads it back
                kept[-1] = {**p, _ID: cid}  # which call it is: the answer gives back the released ones only
                delta.setdefault("tool_calls", []).append({"index": j, "id": cid, "type": "function", "function": {
                    "name": str(fc.get("name") or ""), "arguments": _arguments(fc.get("args"))}})
        reason = cand.get("finishReason")
        finish = None
        if isinstance(reason, str) and reason:
            finish = "tool_calls" if state["calls"] else _FINISH.get(reason, "stop")
        return delta, finish, _usage(obj.get("usageMetadata"))

    def as_json(obj: Any) -> Reply:
        if not isinstance(obj, dict) or not isinstance(obj.get("candidates"), list):
            if isinstance(obj, dict) and obj.get("error"):
                raise error_stop(None, obj)
            return reply_from_response(obj)
        kept.clear()
        state["calls"] = 0
        delta, finish, usage = deltas(obj)
        message = {"role": "assistant", "content": delta.get("content"),
                   **({"tool_calls": [{k: v for k, v in c.items() if k != "index"} for c in delta["tool_calls"]]}
                      if delta.get("tool_calls") else {})}
        chat: dict[str, Any] = {"id": obj.get("responseId"), "object": "chat.completion", "model": obj.get("modelVersion"),
                                "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}]}
        if usage is not None:
            chat["usage"] = usage
        return reply_from_response(chat)

    def event(ev: SSEEvent, end: StreamEnd) -> dict[str, Any] | None:
        obj = event_object(ev, end)
        if obj is None:
            return None
        end.chunks += 1
        delta, finish, usage = deltas(obj)
        chunk = chat_chunk(delta, finish)
        if end.chunks == 1:
            chunk.update(id=obj.get("responseId"), model=obj.get("modelVersion"))
        if usage is not None and finish is not None:
            chunk["usage"] = usage
        return chunk

    return Reader(as_json, event, lambda: {"parts": list(kept)} if kept else None)


# ---------------------------------------------------------------------------- the answer
def _parts(answer: Answer) -> list[dict[str, Any]]:
    """The answer's parts: the upstream's own where it gave them (signatures kept), else made here."""
    extra = answer.message.get(WIRE_EXTRA)
    given = extra.get("parts") if isinstance(extra, dict) and isinstance(extra.get("parts"), list) else None
    calls = answer.message.get("tool_calls") or []
    text = answer.message.get("content")
    if given is not None and answer.stop is None:
        released = {c["id"] for c in calls}
        # its text and thoughts as they came; of its calls, the ones released
        return [{k: v for k, v in p.items() if k != _ID} for p in given if _ID not in p or p[_ID] in released]
    out: list[dict[str, Any]] = [{"text": text}] if text else []
    for c in calls:
        args = loads(c["function"].get("arguments") or "{}")
        out.append({"functionCall": {"name": c["function"]["name"], "args": args}})
    return out


def _candidate(answer: Answer, parts: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
    u = answer.usage or {}
    p, c = u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        cand["finishReason"] = finish
    return {"candidates": [cand], "usageMetadata": {"promptTokenCount": p, "candidatesTokenCount": c,
                                                    "totalTokenCount": p + c},
            "modelVersion": answer.model, "responseId": answer.ident}


def _finish(answer: Answer) -> str:
    return "MAX_TOKENS" if answer.finish_reason == "length" and answer.stop is None else "STOP"


def render(answer: Answer) -> tuple[int, dict[str, Any]]:
    if answer.status != 200:
        return answer.status, error(answer.status, str(answer.message.get("content") or ""))
    return 200, _candidate(answer, _parts(answer), _finish(answer))


def stream_head(answer: Answer) -> list[bytes]:
    return []  # a Gemini stream has no head: each chunk is a response


def stream_text(text: str, first: bool, answer: Answer | None = None) -> list[bytes]:
    assert answer is not None
    return [sse(_candidate(answer, [{"text": text}], None))]


def stream_tail(answer: Answer, sent: str) -> list[bytes]:
    if answer.status != 200:
        return [sse(error(answer.status, str(answer.message.get("content") or "")))]
    if not sent:  # nothing streamed yet: the whole answer in one chunk
        return [sse(_candidate(answer, _parts(answer), _finish(answer)))]
    content = answer.message.get("content") or ""
    if answer.stop is not None:
        parts: list[dict[str, Any]] = [{"text": "\n\n" + content}]
    else:
        rest = content[len(sent):] if content.startswith(sent) else content
        parts = [*([{"text": rest}] if rest else []),
                 *(p for p in _parts(answer) if not (isinstance(p.get("text"), str) and not p.get("thought")))]
    return [sse(_candidate(answer, parts, _finish(answer)))]
