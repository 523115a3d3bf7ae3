"""A conversation's messages are written for the upstream once (issue 62): a body holding an `Encoded`
array is written by joining the bytes its items were written as before (`_json.wire_body`), and the
proxy keeps those bytes with the conversation it has read (`_view._Reading.wires`). Whatever was kept,
the body is the one written without it; a message compared by its canonical JSON (a number written
`30.0` or `30`) is written anew each request, as it came."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from _proxy_support import ReplyServer
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence import _json
from loopfence._json import Encoded, wire_body
from loopfence.testing import calls_reply, text_reply, tool_call

_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12) | \
    st.sampled_from(["NaN", "Infinity", "é", "\ud800"])  # what sends a body to the stdlib's writer
_scalars = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | _text
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                       max_leaves=8)


def _typed(raw: bytes) -> Any:
    """The body read back with each number's type kept (30 and 30.0 differ)."""
    return json.loads(raw, parse_float=lambda s: ("float", float(s)))


def _written(body: dict[str, Any]) -> Any:
    """`_typed` of the body as `wire_body` writes it, or the refusal."""
    try:
        return _typed(wire_body(body))
    except ValueError as exc:  # NaN or an infinity: refused, as httpx's json= refuses it
        return ("refused", type(exc))


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, max_size=6), st.data(), st.dictionaries(_text, _values, max_size=3))
def test_a_body_with_kept_parts_is_the_body_written_whole(items: list[Any], data: Any, rest: dict[str, Any]) -> None:
    kept = data.draw(st.integers(0, len(items)))
    parts: list[bytes | None] = []
    for item in items[:kept]:  # some written for an earlier request, some not yet
        try:
            parts.append(wire_body(item) if data.draw(st.booleans()) else None)
        except ValueError:
            parts.append(None)
    plain = {**rest, "messages": items, "model": "m"}
    got = _written({**rest, "messages": Encoded(items, parts), "model": "m"})
    assert got == _written(plain)
    if isinstance(got, dict):  # written (not refused): the fields in their order, each kept item's bytes its own
        assert list(got) == list(plain)
        assert all(p is not None and _typed(p) == _typed(wire_body(i)) for p, i in zip(parts, items, strict=False))


def test_a_kept_part_is_joined_not_written_again() -> None:
    parts: list[bytes | None] = [b'{"kept":true}', None]
    out = wire_body({"messages": Encoded([{"role": "user", "content": "a"}, {"n": 2}, {"n": 3}], parts)})
    assert out == b'{"messages":[{"kept":true},{"n":2},{"n":3}]}'  # the first as kept, never written again
    assert parts == [b'{"kept":true}', b'{"n":2}']  # the second kept now; the third is past the parts: not kept
    odd = {"messages": Encoded([{"n": 1}], [None]), 1: 2}  # a key JSON writes as text: the body written whole
    assert wire_body(odd) == wire_body({"messages": [{"n": 1}], 1: 2})
    assert Encoded([1, 2]).parts == [] and wire_body({"a": Encoded([1, 2])}) == b'{"a":[1,2]}'  # nothing kept


def test_a_message_sent_as_its_kept_bytes_is_not_copied_for_the_wire() -> None:
    from loopfence._messages import Request
    from loopfence.models import OpenAIModel

    said = {"role": "assistant", "content": None, "tool_calls": []}  # goes as "" where it is written
    asked = [{"role": "user", "content": "a"}, said, dict(said), dict(said)]
    parts: list[bytes | None] = [b'{"kept":1}', b'{"kept":2}', None]  # the third written anew, the fourth past the parts
    body = OpenAIModel("http://127.0.0.1:9/v1", model="m").body(Request(Encoded(asked, parts), [], {}))
    sent = body["messages"]
    assert type(sent) is Encoded and sent.parts is parts
    assert sent[1] is said  # kept: sent as its bytes, never looked at (a long history is not copied each request)
    assert sent[2]["content"] == "" and sent[3]["content"] == "" and asked[2]["content"] is None
    assert wire_body(body).count(b'"content":""') == 2 and b'{"kept":2}' in wire_body(body)


class _Upstream(ReplyServer):
    """A call per request until the conversation has `calls` results, then an answer."""

    def __init__(self, calls: int) -> None:
        super().__init__(self._reply)
        self.calls = calls

    def _reply(self, body: dict[str, Any]) -> dict[str, Any]:
        done = sum(m.get("role") == "tool" for m in body["messages"])
        if done < self.calls:
            return calls_reply(tool_call("noop", {"i": done}, id=f"call_{done}"))
        return text_reply("done")


def _converse(tmp: Path, upstream: _Upstream, monkeypatch: pytest.MonkeyPatch,
              vary: Any = None) -> tuple[list[dict[str, Any]], list[int]]:
    """One conversation through an in-process proxy to its answer: the messages each request sent, and
    how many messages the proxy wrote for the upstream per request. `vary(messages, k)` edits the
    k-th request's history in place before it goes."""
    from loopfence.proxy import Proxy, Settings

    writes: list[int] = []
    real = _json.wire_body

    def counted(value: Any) -> bytes:
        if isinstance(value, dict) and "role" in value:
            writes[-1] += 1
        return real(value)

    monkeypatch.setattr(_json, "wire_body", counted)  # what `Encoded` writes item by item
    sent: list[list[dict[str, Any]]] = []

    async def go() -> None:
        proxy = Proxy(upstream.base_url, Settings(logs=tmp))
        transport = httpx.ASGITransport(app=proxy.app)
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "go", "n": 30.0}]}]
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1/v1", timeout=60) as client:
            for k in range(upstream.calls + 1):
                if vary is not None:
                    vary(messages, k)
                sent.append(json.loads(json.dumps(messages)))
                writes.append(0)
                got = await client.post("/chat/completions", json={"model": "m", "messages": messages, "tools": [
                    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]})
                got.raise_for_status()
                reply = got.json()["choices"][0]["message"]
                messages.append(reply)
                for c in reply.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"ok {c['id']} " * 50})
        await proxy.aclose()

    asyncio.run(go())
    return sent, writes


def test_each_message_is_written_once_and_the_upstream_gets_what_was_sent(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with _Upstream(4) as upstream:
        sent, writes = _converse(tmp_path, upstream, monkeypatch)
    assert len(upstream.requests) == len(sent) == 5
    for body, messages in zip(upstream.requests, sent, strict=True):
        assert body["messages"] == [{**m, "content": ""} if m["role"] == "assistant" and m.get("content") is None
                                    else m for m in messages]  # as sent (a null content goes as "")
    # the first request writes its one message; each next one writes its two new messages, and the user
    # message again: its number makes it one compared by canonical JSON, never taken from before
    assert writes == [1, 3, 3, 3, 3], writes


def test_a_message_the_client_sends_again_with_its_number_written_otherwise_goes_as_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def vary(messages: list[dict[str, Any]], k: int) -> None:
        messages[0]["content"][0]["n"] = 30 if k % 2 else 30.0  # the same number, as an int on odd requests

    with _Upstream(3) as upstream:
        _converse(tmp_path, upstream, monkeypatch, vary)
    got = [type(body["messages"][0]["content"][0]["n"]) for body in upstream.requests]
    assert got == [float, int, float, int]


def _tools(tag: str, minimum: Any) -> list[dict[str, Any]]:
    """The upstream's `noop` and two more, their names tagged (the proxy keeps tools across its runs)."""
    return [{"type": "function", "function": {"name": name, "description": f"does a thing ({tag}) " * 40, "parameters": {
        "type": "object", "properties": {"i": {"type": "integer", "minimum": minimum}}, "required": ["i"],
        "additionalProperties": False}}} for name in ("noop", f"{tag}_a", f"{tag}_b")]


def _tool_writes(tmp: Path, monkeypatch: pytest.MonkeyPatch, tools_of: Any) -> tuple[list[int], list[Any], list[Any]]:
    """A conversation of four requests through an in-process proxy, the k-th declaring `tools_of(k)`: how
    many tools the proxy wrote for the upstream per request, the tools sent, and the tools the upstream got."""
    from loopfence.proxy import Proxy, Settings

    writes: list[int] = []
    real = _json.wire_body

    def counted(value: Any) -> bytes:
        if isinstance(value, dict) and value.get("type") == "function":
            writes[-1] += 1
        return real(value)

    monkeypatch.setattr(_json, "wire_body", counted)
    sent: list[Any] = []

    async def go() -> None:
        proxy = Proxy(upstream.base_url, Settings(logs=tmp))
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app), base_url="http://127.0.0.1/v1",
                                     timeout=60) as client:
            for k in range(4):
                tools = tools_of(k)
                sent.append(json.loads(json.dumps(tools)))
                writes.append(0)
                got = await client.post("/chat/completions", json={"model": "m", "messages": messages, "tools": tools})
                got.raise_for_status()
                reply = got.json()["choices"][0]["message"]
                messages.append(reply)
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in reply["tool_calls"]]
        await proxy.aclose()

    with _Upstream(4) as upstream:
        asyncio.run(go())
        return writes, sent, [body["tools"] for body in upstream.requests]


def test_the_same_tools_each_request_are_written_once_and_go_as_sent(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    tools = _tools(f"once{uuid.uuid4().hex[:8]}", 0)
    writes, sent, got = _tool_writes(tmp_path, monkeypatch, lambda k: tools)
    assert got == sent and [_typed(json.dumps(g).encode()) for g in got] == [_typed(json.dumps(s).encode()) for s in sent]
    assert writes == [3, 0, 0, 0], writes  # the three tools written for the first request, then their bytes kept


def test_tools_the_same_to_equality_but_not_as_json_go_as_each_request_sent_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = f"typed{uuid.uuid4().hex[:8]}"
    values = [0, False, 0.0, 0]  # equal to Python's ==, three different JSON values
    writes, sent, got = _tool_writes(tmp_path, monkeypatch, lambda k: _tools(tag, values[k]))
    minimums = [[type(t["function"]["parameters"]["properties"]["i"]["minimum"]) for t in g] for g in got]
    assert minimums == [[int] * 3, [bool] * 3, [float] * 3, [int] * 3]  # never the bytes kept for an equal value
    assert writes == [3, 3, 3, 0], writes  # the fourth is the first's again: its bytes kept


@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=20), size=st.integers(1, 5),
       budget=st.integers(1, 8000))
@settings(max_examples=200)
def test_the_kept_tool_arrays_stay_within_their_count_and_bytes(texts: list[str], size: int, budget: int) -> None:
    import sys

    from loopfence.proxy._wire import _KnownTools

    known = _KnownTools(size, budget)
    for i, text in enumerate(texts):  # any text: wide characters and lone surrogates weigh more than they count
        tools = [{"type": "function", "function": {"name": f"t{i}", "description": text}}]
        key = known.key(tools)
        assert key is not None and known.find(key) is None
        canon, parts = known.keep(key, tools)
        assert canon == _json.canonical_json(tools) and parts == [None]
        wire_body({"tools": Encoded(tools, parts)})  # its bytes written, as the upstream body writes them
        assert len(key) + sys.getsizeof(canon) + sum(len(p or b"") for p in parts) <= known.weight(key, canon)
        assert known.used == sum(known.weights[k] for k in known.kept) <= budget and len(known.kept) <= size
        assert (known.find(key) is not None) == (known.weight(key, canon) <= budget)  # the newest kept if it fits
