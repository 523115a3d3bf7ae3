"""A Chat Completions body read from its bytes (issue 62, `proxy/_prefix.py`): a request whose bytes
begin with a known conversation's, through its last message, has only the rest parsed. Whatever was
read before, the body comes out as a whole parse gives it (values, their types, the order of its
fields), and the request reads as on a fresh proxy; a body this reading cannot follow is left to the
whole parse, whose errors the client gets as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence.proxy import _load, _prefix, _view
from loopfence.proxy._wire import BadRequest, parse

from test_proxy_reading import requests

STYLES = [  # how a client writes its body: separators, escapes, where `messages` sits among its fields
    {"separators": (",", ":"), "ensure_ascii": False},
    {"separators": (", ", ": "), "ensure_ascii": True},
    {"indent": 2, "ensure_ascii": False},
]
REST = st.dictionaries(st.sampled_from(["model", "temperature", "max_tokens", "user", "seed", "stop", "n"]),
                       st.one_of(st.integers(-5, 10 ** 30), st.floats(-2, 2), st.text(max_size=4),
                                 st.lists(st.text(max_size=2), max_size=2), st.booleans(), st.none()), max_size=4)


def _bytes(messages: list[Any], before: dict[str, Any], after: dict[str, Any], style: dict[str, Any]) -> bytes:
    body = {**before, "messages": messages, **{k: v for k, v in after.items() if k not in before}}
    return json.dumps(body, **style).encode()


def _shape(v: Any) -> Any:
    """`v` with every value's type beside it and an object's fields in their order (`1` is not `1.0`)."""
    if isinstance(v, dict):
        return dict, [(k, _shape(x)) for k, x in v.items()]
    if isinstance(v, list):
        return list, [_shape(x) for x in v]
    return type(v), v


def _same(a: Any, b: Any) -> bool:
    """Equal as values, types and the order of each object's fields."""
    return _shape(a) == _shape(b)


def _incoming(body: dict[str, Any], started: Any) -> tuple[Any, ...]:
    """The request as the wire's parse reads it, or what it says is wrong with it."""
    try:
        got = parse(body, started)
    except BadRequest as exc:
        return exc.message, exc.param
    return got.whole, got.conv, got.extends, got.opening, got.users, got.answers, got.model, got.params


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests(), st.lists(st.tuples(REST, REST, st.sampled_from(range(len(STYLES)))), min_size=1, max_size=3),
       st.sampled_from([1 << 14, 32 << 20]))
def test_a_body_read_from_its_bytes_is_the_whole_parse(monkeypatch: pytest.MonkeyPatch, seq: list[list[Any]],
                                                      shapes: list[Any], budget: int) -> None:
    """Each request of a sequence (conversations grown, cut, retried, branched; their other fields and
    how they are written changing from one request to the next) is read from the bytes known before
    it, and comes out as the whole parse: the body, and the request as a fresh proxy reads it."""
    monkeypatch.setattr(_view, "_MEMO", _view._Memo())
    monkeypatch.setattr(_view, "_KNOWN", _view._Known(budget))  # small: conversations are evicted mid-way
    for i, messages in enumerate(seq):
        before, after, style = shapes[i % len(shapes)]
        data = _bytes(messages, before, after, STYLES[style])
        known = _view.known_before(data)
        if known is not None:
            assert data.startswith(known.raw) and len(known.raw) < len(data)
        got = _prefix.parsed(data, known)
        if not messages:  # (no messages: the whole parse's, and the wire's check, say so)
            assert got is None
            continue
        assert got is not None
        whole = json.loads(data)
        assert _same(got[0], whole)
        assert _load.weigh(data, known.counts if known is not None else None) == _load.weigh(data)
        mine = _incoming(*got)
        with monkeypatch.context() as fresh:
            fresh.setattr(_view, "_MEMO", _view._Memo())
            fresh.setattr(_view, "_KNOWN", _view._Known())
            assert mine == _incoming(copy.deepcopy(whole), None)


def test_a_growing_conversation_parses_only_what_is_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request after the first finds the one before it by its bytes, and parses its new messages
    and the fields after them, not the history again."""
    monkeypatch.setattr(_view, "_KNOWN", _view._Known())
    scanned: list[int] = []
    real = _prefix.loads_at
    monkeypatch.setattr(_prefix, "loads_at", lambda s, i: (scanned.append(i), real(s, i))[1])
    messages: list[Any] = [{"role": "system", "content": "You fetch pages (a prefix test)." * 4},
                           {"role": "user", "content": "Fetch é and ß, then answer."}]
    for turn in range(12):
        data = _bytes(messages, {"model": "m"}, {"tools": [], "temperature": 0}, STYLES[0])
        known = _view.known_before(data)
        assert (known is None) == (turn == 0)
        scanned.clear()
        body, started = _prefix.parsed(data, known)  # type: ignore[misc]  (read: not None)
        assert _same(body, json.loads(data))
        assert len(scanned) == (3 + 2 if turn == 0 else 2)  # the model, its key and "messages"; each message
        parse(body, started)
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "get", "arguments": f'{{"n": {turn}}}'}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{turn}", "content": f"page {turn} ü"}]


def test_a_conversation_found_by_value_keeps_the_fields_in_this_body_s_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body read from the start may extend a known conversation equal in value but written with its
    fields in another order (another client's); the messages kept with these bytes are this body's, so
    the next request, read from them, has its fields in its own order, as a whole parse gives them."""
    monkeypatch.setattr(_view, "_KNOWN", _view._Known())
    text = "hi (a field order test) " + "x" * 80

    def send(body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        got = _prefix.parsed(data, _view.known_before(data))
        assert got is not None
        parse(*got)
        assert _same(got[0], json.loads(data))
        return got[0]

    send({"model": "a", "messages": [{"content": text, "role": "user"}]})
    send({"model": "b", "messages": [{"role": "user", "content": text}]})
    send({"model": "b", "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "yo"}]})


NOT_FOLLOWED = [  # bodies this reading leaves to the whole parse (which refuses or reads each as before)
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],}',  # a comma before the end
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]} x',  # text after the body
    b'{"messages": [{"role": "user", "content": "hi"}], "messages": [{"role": "user", "content": "2"}]}',
    b'\xef\xbb\xbf{"messages": [{"role": "user", "content": "hi"}]}',  # a byte order mark
    b'{"messages": [{"role": "user", "content": "\xff"}]}',  # not UTF-8
    b'{"messages": [{"role": "user", "content": NaN}]}',
    b'{"messages": []}', b'{"messages": "hi"}', b'{"model": "m"}', b"[1, 2]", b"",
    b'{"messages": [{"role": "user", "content": "hi"},]}',
    b'{"messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",  # the scanner's depth
    b'{"messages": [{"role": "user", "content": "hi", "n": ' + b"9" * 1001 + b"}]}",  # an integer too long
    b'{"messages": [{"role": "user", "content": "' + b"x" * _prefix.FRESH_BYTES + b'"}]}',  # new, and large
]


@pytest.mark.parametrize("data", NOT_FOLLOWED, ids=range(len(NOT_FOLLOWED)))
def test_a_body_it_cannot_follow_is_left_to_the_whole_parse(data: bytes) -> None:
    assert _prefix.parsed(data, None) is None


def test_a_known_conversation_s_next_body_it_cannot_follow_is_left_to_the_whole_parse(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_view, "_KNOWN", _view._Known())
    first = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a long task " * 10 + b'"}]'
    body, started = _prefix.parsed(first + b"}", None)  # type: ignore[misc]
    parse(body, started)
    for rest in (b"}}", b', "messages": []}', b",]}",
                 b', {"role": "user", "content": "\xc3"}]}'):
        data = first[:-1] + rest
        known = _view.known_before(data)
        assert known is not None
        assert _prefix.parsed(data, known) is None


def test_the_proxy_answers_a_bad_body_after_a_known_one_as_before(tmp_path: Path) -> None:
    """Through the proxy: a conversation's second request, broken after the bytes it shares with the
    first, is refused with the whole parse's message; the conversation then goes on."""
    from loopfence.testing import FakeServer, text_reply

    from _proxy_support import Proxy

    with FakeServer([text_reply("one"), text_reply("two")]) as upstream, \
            Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path / "logs"), stderr=tmp_path / "err") as proxy:
        def post(data: bytes) -> httpx.Response:
            return httpx.post(f"{proxy.base_url}/chat/completions", content=data, timeout=60,
                              headers={"content-type": "application/json"})

        first = b'{"model": "fake", "messages": [{"role": "user", "content": "' + b"Summarise the notes. " * 8 + b'"}'
        assert post(first + b"]}").json()["choices"][0]["message"]["content"] == "one"
        then = first + b', {"role": "assistant", "content": "one"}, {"role": "user", "content": "more"}'
        bad = post(then + b",]}")
        assert bad.status_code == 400, bad.text
        assert "not valid JSON" in bad.json()["error"]["message"]
        assert post(then + b"]}").json()["choices"][0]["message"]["content"] == "two"
