"""The client's side of the wire: a Chat Completions request checked field by field, and the digests
that tell which run it belongs to.

`parse(body)` turns the raw JSON body into an `Incoming` or raises `BadRequest` naming the field
(OpenAI's own error shape: `{"error": {"message", "type": "invalid_request_error", "param", "code"}}`),
before anything is forwarded. Its digests (`_view.digests`: each message reduced to its role, text
and calls) tell which run a request continues: the one whose latest request it extends.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

from .._json import MAX_DEPTH, Encoded, JsonLimitError, canonical_json, check_depth
from ._view import digests, marks, read_kept, reading

__all__ = ["BadRequest", "Incoming", "parse", "read_as", "tool_items", "turns", "checked_head", "kind", "MAX_MESSAGES", "MAX_TOOLS", "KNOWN_FIELDS"]

MAX_MESSAGES = 4096  # a conversation longer than this is refused (no agent loop gets near it)
MAX_TOOLS = 512
MAX_KNOWN_TOOLS = 64  # the tool arrays whose canonical JSON and written bytes are kept (`_KnownTools`)
KNOWN_TOOLS_BYTES = 16 << 20  # and what they may take together (their key, canonical JSON and bytes)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# Chat Completions fields (OpenAI's, and the sampling fields llama.cpp and vLLM servers take): anything
# else is refused, naming it, as OpenAI refuses an unrecognized argument.
KNOWN_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options",
    "temperature", "top_p", "n", "stop", "max_tokens", "max_completion_tokens", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "seed", "response_format",
    "metadata", "store", "service_tier", "reasoning_effort", "modalities", "prediction", "verbosity",
    "safety_identifier", "prompt_cache_key", "top_k", "min_p", "typical_p", "repeat_penalty",
    "repetition_penalty", "repeat_last_n", "cache_prompt", "grammar", "json_schema", "mirostat",
    "mirostat_tau", "mirostat_eta", "n_predict", "chat_template_kwargs", "extra_body",
})
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "typical_p",
            "repeat_penalty", "repetition_penalty")
_COUNTS = ("max_tokens", "max_completion_tokens", "seed", "top_logprobs", "top_k", "n_predict")


class BadRequest(ValueError):
    """A request refused before anything is forwarded: HTTP `status` (400, 413), the field (`param`)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": None}}


def salted(session: str, digest: str) -> str:
    """A digest scoped to a session (`Incoming.scoped`)."""
    return hashlib.sha256(f"{session}\n{digest}".encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Salted(Sequence[str]):
    """Digests scoped to a session, each salted when it is first read: a request is placed by its first
    cut or two (the run it continues), where a long conversation has hundreds. Equal to the tuple of
    them all salted."""

    __slots__ = ("session", "plain", "done")

    def __init__(self, session: str, plain: Sequence[str]) -> None:
        self.session, self.plain = session, tuple(plain)
        self.done: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.plain)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...

    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self.plain))))
        i = range(len(self.plain))[i]  # (an IndexError past either end; a negative index from the end)
        got = self.done.get(i)
        if got is None:
            got = self.done[i] = salted(self.session, self.plain[i])
        return got

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Salted({self.session!r}, {len(self.plain)} digests)"


@dataclass(frozen=True)
class Incoming:
    """One checked request: its messages and tools as sent, the other fields (`params`), whether it
    streams, and its digests: `whole` is the request's own (a retry has the same), `conv` and
    `extends` its normalised view's (`_view.digests`)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    params: dict[str, Any]
    stream: bool
    include_usage: bool
    model: str | None
    whole: str = ""
    conv: str = ""  # the digest of the request's normalised view (`_view.digests`)
    extends: Sequence[str] = ()  # the digests of its views cut before each assistant message, longest first
    scope: str | None = None  # the session its digests are scoped to (`scoped`)
    opening: str = ""  # the digest of its leading system messages (`_view.marks`)
    users: frozenset[str] = frozenset()  # the digests of its user messages' texts
    answers: tuple[str, ...] = ()  # the digests of its last assistant messages, newest first (`_view.marks`)
    # another wire than Chat Completions (`_anthropic`): its name, the request as sent (forwarded as
    # it is to an upstream of that wire, caps and note added), and the client headers that go with it
    wire: str | None = None
    body: dict[str, Any] | None = None
    forward: tuple[tuple[str, str], ...] = ()
    follows: str | None = None  # the earlier answer it continues by id (Responses' previous_response_id)
    # its messages' wire bytes as the conversation keeps them (`_json.Encoded`): each written once upstream
    parts: list[bytes | None] | None = dataclasses.field(default=None, compare=False, repr=False)

    def scoped(self, session: str) -> Incoming:
        """The request with every digest scoped to `session`: it retries and continues only the
        conversations of that session, and the same conversation in two sessions is two. Its cuts
        (`extends`: one per assistant message) are salted as they are read (`Salted`)."""
        return dataclasses.replace(self, whole=salted(session, self.whole),
                                   conv=" ".join(salted(session, d) for d in self.conv.split()),
                                   extends=Salted(session, self.extends), opening=salted(session, self.opening),
                                   scope=session)

    def last_assistant(self) -> int | None:
        """The index of the last assistant message, or None."""
        return next((i for i in range(len(self.messages) - 1, -1, -1)
                     if self.messages[i].get("role") == "assistant"), None)

    def since(self, index: int | None) -> list[dict[str, Any]]:
        """The messages after `index` (all of them for None)."""
        return self.messages[(index + 1) if index is not None else 0:]


class _KnownTools:
    """The tool arrays requests declared, by their exact value (marshal's bytes: `true` is not `1`, nor
    `30.0` `30`, as they are to `==`), each with its canonical JSON and its tools' bytes as written for
    the upstream (`_json.Encoded`, filled as they are written): an agent that sends the same tools each
    request (a coding agent's are tens of KB) has them depth-checked, canonicalised and written once.
    The last MAX_KNOWN_TOOLS, within KNOWN_TOOLS_BYTES, the least recently sent first out."""

    def __init__(self, size: int = MAX_KNOWN_TOOLS, budget: int = KNOWN_TOOLS_BYTES) -> None:
        self.size, self.budget, self.used = size, budget, 0
        self.kept: OrderedDict[bytes, tuple[str, list[bytes | None]]] = OrderedDict()
        self.weights: dict[bytes, int] = {}

    @staticmethod
    def key(tools: list[Any]) -> bytes | None:
        try:
            return marshal.dumps(tools)
        except ValueError:  # nested past marshal's depth: never kept (the depth check refuses it)
            return None

    def find(self, key: bytes | None) -> tuple[str, list[bytes | None]] | None:
        got = self.kept.get(key) if key is not None else None
        if got is not None:
            self.kept.move_to_end(key)  # type: ignore[arg-type]  (found: a key)
        return got

    def keep(self, key: bytes, tools: list[Any]) -> tuple[str, list[bytes | None]]:
        """The tools' canonical JSON and (empty) parts, kept for the next request that sends them."""
        canon = canonical_json(tools)
        got, weight = (canon, [None] * len(tools)), self.weight(key, canon)
        if weight <= self.budget:
            self.kept[key] = got
            self.weights[key] = weight
            self.used += weight
            while len(self.kept) > self.size or self.used > self.budget:
                old, _ = self.kept.popitem(last=False)
                self.used -= self.weights.pop(old)
        return got

    @staticmethod
    def weight(key: bytes, canon: str) -> int:
        """What an entry holds at most: its key, its canonical JSON as a str, and its tools' bytes once
        written (at most twice the canonical JSON's UTF-8: a lone surrogate's 3 bytes written as 6)."""
        return len(key) + sys.getsizeof(canon) + 2 * len(canon.encode("utf-8", "surrogatepass"))


_TOOLS = _KnownTools()


def parse(body: Any, started: Any = None) -> Incoming:
    """The request checked: BadRequest naming the first field that is wrong. `started`: its messages'
    reading begun (`_view.reading`), if the body was read from the bytes of a known one (`_prefix`)."""
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {kind(body)}")
    unknown = sorted(k for k in body if k not in KNOWN_FIELDS)
    if unknown:
        raise BadRequest(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    messages = turns(body.get("messages"), "messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest(f"tools must be an array, got {kind(tools)}", "tools")
    _check_tools(tools)
    key = _TOOLS.key(tools) if tools else None
    known = _TOOLS.find(key)  # the same tools as a request before: checked, canonical and written then
    if started is None:  # the known conversation it extends: only its new messages are checked and read
        started = reading(messages)
    going = started[1]
    try:  # its nesting: the rest of the body, and the messages not seen before (a message sits 2 levels in)
        check_depth({k: v for k, v in body.items() if k != "messages" and (known is None or k != "tools")})
        for m in messages[len(going.messages):]:
            check_depth(m, MAX_DEPTH - 2)
    except JsonLimitError as exc:
        raise BadRequest(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if key is not None and known is None:
        known = _TOOLS.keep(key, tools)
    going.checked = _check_messages(messages, len(going.messages), going.checked) if going.checked is not None \
        else _check_messages(messages)  # (one read from another wire was never checked as Chat Completions)
    _check_params(body)
    _check_choice(body.get("tool_choice"), {t["function"]["name"] for t in tools})
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest(f"stream_options must be an object, got {kind(options)}", "stream_options")
    params = {k: v for k, v in body.items() if k not in ("messages", "tools", "stream", "stream_options")}
    model = body.get("model")
    return read_as(None, body, messages, Encoded(tools, known[1]) if known is not None else tools, params,
                   bool(options and options.get("include_usage")), model if isinstance(model, str) else None,
                   started, known[0] if known is not None else None)


def checked_head(body: Any, *, model: bool = True, cap: str | None = None,
                 config: str | None = None) -> tuple[dict[str, Any], int | None]:
    """Another wire's request body checked as an object, with a non-empty string `model` (when the body
    names it), a boolean `stream`, and its token cap (`cap`, inside the `config` object if given) a
    positive integer: (the body, the cap or None)."""
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {kind(body)}")
    if model and (not isinstance(body.get("model"), str) or not body["model"]):
        raise BadRequest("model: a non-empty string is required", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest(f"stream must be a boolean, got {kind(body['stream'])}", "stream")
    holder = body
    if config is not None:
        holder = body.get(config) if body.get(config) is not None else {}
        if not isinstance(holder, dict):
            raise BadRequest(f"{config} must be an object, got {kind(holder)}", config)
    value = holder.get(cap) if cap is not None else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        where = f"{config}.{cap}" if config else str(cap)
        raise BadRequest(f"{where} must be a positive integer, got {value!r}"[:200], where)
    return body, value


def turns(value: Any, field: str, what: str = "", must: str = "a non-empty array") -> list[Any]:
    """A wire's conversation (`messages`, `contents`, `input`): a non-empty array of at most MAX_MESSAGES
    items, else BadRequest naming `field` (`what`: the items' name in the count; `must`: what it takes)."""
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{field} must be {must}", field)
    if len(value) > MAX_MESSAGES:
        raise BadRequest(f"too many {what or field}: {len(value)} (at most {MAX_MESSAGES})", field)
    return value


def tool_items(tools: Any, at: str = "tools.{}") -> list[tuple[str, dict[str, Any]]]:
    """Another wire's `tools`, checked as an array of at most MAX_TOOLS objects: (where each is, it)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest(f"tools must be an array, got {kind(tools)}", "tools")
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"too many tools: {len(tools)} (at most {MAX_TOOLS})", "tools")
    out = []
    for i, t in enumerate(tools):
        where = at.format(i)
        if not isinstance(t, dict):
            raise BadRequest(f"{where} must be an object, got {kind(t)}", where)
        out.append((where, t))
    return out


def read_as(wire: str | None, body: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]],
            params: dict[str, Any], include_usage: bool = False, model: str | None = None,
            started: Any = None, tools_canon: str | None = None) -> Incoming:
    """A request of `wire` (None: Chat Completions) read as Chat Completions (`messages`, `tools`,
    `params`), with its digests: the request's own (`whole`, the body but for how it streams) and
    its view's (`_view`). `started`: `_view.reading(messages)`, if already looked up; `tools_canon`:
    the canonical JSON of the body's `tools`, if known (`_KnownTools`)."""
    kept = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    if wire is None and "messages" in kept:  # the body's canonical JSON, hashed on from the known part's
        fields = [f"{canonical_json(k)}:{tools_canon if k == 'tools' and tools_canon else canonical_json(kept[k])}"
                  for k in sorted(kept) if k != "messages"]
        before = sum(k < "messages" for k in kept)
        head = "{" + "".join(f"{f}," for f in fields[:before]) + '"messages":'
        seen, parts = read_kept(messages, started, (head, "".join(f",{f}" for f in fields[before:]) + "}"))
        whole = seen.body
    else:  # another wire's body holds what its translation may leave out: all of it
        seen, parts = read_kept(messages, started)
        text = canonical_json([wire, kept] if wire is not None else kept)
        whole = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    conv, extends = digests(messages, seen)
    opening, users, answers = marks(seen)
    return Incoming(messages, tools, params, body.get("stream") is True, include_usage, model, whole, conv, extends,
                    opening=opening, users=users, answers=answers, wire=wire, body=None if wire is None else body,
                    parts=parts)


def kind(v: Any) -> str:
    """A JSON value's kind in words, for an error message ("an array", "null")."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def _check_params(body: dict[str, Any]) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model must be a string, got {kind(model)}", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest(f"stream must be a boolean, got {kind(body['stream'])}", "stream")
    for name in _NUMBERS:
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise BadRequest(f"{name} must be a number, got {kind(v)}", name)
    for name in _COUNTS:
        v = body.get(name)
        if v is None or (name == "n_predict" and v == -1):  # llama.cpp's -1, "no limit": capped like any other
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "seed" else 1):
            raise BadRequest(f"{name} must be a positive integer, got {v!r}"[:200], name)
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"n must be 1 (the fence follows one conversation), got {n!r}"[:200], "n")


def _check_choice(choice: Any, names: set[str]) -> None:
    """tool_choice: "none", "auto", "required", or a declared function by name."""
    if choice is None or choice in ("none", "auto", "required"):
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise BadRequest("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}", "tool_choice")
    if name not in names:
        raise BadRequest(f"tool_choice names the function {name!r}, which tools does not declare"[:300], "tool_choice")


def _check_tools(tools: list[Any]) -> None:
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"too many tools: {len(tools)} (at most {MAX_TOOLS})", "tools")
    seen: set[str] = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise BadRequest(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
        if name in seen:
            raise BadRequest(f"{where}.function.name {name!r} is declared twice", f"{where}.function.name")
        seen.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"{where}.function.parameters must be an object", f"{where}.function.parameters")


def _check_content(m: dict[str, Any], where: str, nullable: bool) -> None:
    content = m.get("content")
    if content is None and nullable:
        return
    if isinstance(content, str):
        return
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in content):
        return
    raise BadRequest(f"{where}.content must be a string or an array of content parts, got {kind(content)}",
                     f"{where}.content")


def _check_messages(messages: list[Any], start: int = 0, open_calls: set[str] | None = None) -> set[str]:
    """Each message from `start` checked (those before it were, in an earlier request: `open_calls`, the
    ids of the last assistant message's calls they left unanswered). What is left open at the end."""
    open_calls = set(open_calls or ())
    for i in range(start, len(messages)):
        m = messages[i]
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object, got {kind(m)}", where)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}"[:300],
                             f"{where}.role")
        if role == "assistant":
            open_calls = _check_calls(m, where)
            _check_content(m, where, nullable=True)
        elif role == "tool":
            _check_content(m, where, nullable=False)
            cid = m.get("tool_call_id")
            if not isinstance(cid, str):
                raise BadRequest(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
            if cid not in open_calls:
                raise BadRequest(f"{where}.tool_call_id {cid!r} answers no tool call of the assistant message "
                                 "before it (or answers it twice)"[:300], f"{where}.tool_call_id")
            open_calls.discard(cid)
        else:
            _check_content(m, where, nullable=False)
    return open_calls


def _check_calls(m: dict[str, Any], where: str) -> set[str]:
    calls = m.get("tool_calls")
    if calls is None:
        return set()
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls must be an array", f"{where}.tool_calls")
    ids: set[str] = set()
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(c.get("id"), str) or not c["id"]:
            raise BadRequest(f"{at} must have a string id and a function object", at)
        if not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", ""), str):
            raise BadRequest(f"{at}.function must have a string name and string arguments", f"{at}.function")
        if c["id"] in ids:
            raise BadRequest(f"{at}.id {c['id']!r} is used twice in one message"[:300], f"{at}.id")
        ids.add(c["id"])
    return ids
