"""The proxy reads a request's messages once (issue 62): a conversation's next request, which carries
all of it again, is read from where the last one left off (`_view._Known`), and each message already
read is taken from a memo (`_view._Memo`). Whatever was read before, a request reads exactly as it
would on a fresh proxy: its view, every digest, and what its check leaves open."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence._json import canonical_json
from loopfence.proxy import _view
from loopfence.proxy._wire import BadRequest, parse

ROLES = ["system", "user", "assistant", "tool", "developer"]


def _message(draw: Any, i: int) -> dict[str, Any]:
    role = draw(st.sampled_from(ROLES))
    text = draw(st.sampled_from(["", "hi", "hi  there", "Calling tools:\n[{'id': 'c0', 'type': 'function', "
                                 "'function': {'name': 'f', 'arguments': '{}'}}]", f"text {i}", "ok"]))
    m: dict[str, Any] = {"role": role}
    shape = draw(st.sampled_from(["str", "parts", "none", "absent"]))
    if shape == "str":
        m["content"] = text
    elif shape == "parts":
        m["content"] = [{"type": "text", "text": text}, {"type": "text", "text": "more"}]
    elif shape == "none":
        m["content"] = None
    if role == "assistant" and draw(st.booleans()):
        m["tool_calls"] = [{"id": f"c{i}-{k}", "type": "function",
                            "function": {"name": draw(st.sampled_from(["f", "g"])),
                                         "arguments": draw(st.sampled_from(['{"a": 1}', '{ "a":1 }', "{}", "bad"]))}}
                           for k in range(draw(st.integers(1, 2)))]
    if role == "tool":
        m["tool_call_id"] = draw(st.sampled_from(["c0-0", f"c{i}-0", "x"]))
    if draw(st.integers(0, 9)) == 0:
        m["name"] = "someone"
    return m


@st.composite
def requests(draw: Any) -> list[list[dict[str, Any]]]:
    """A sequence of requests: conversations that grow, branch, come again (retries), or start anew;
    each a fresh parse (new objects, as a request's body is)."""
    pool: list[list[dict[str, Any]]] = []
    out = []
    for step in range(draw(st.integers(1, 12))):
        base = draw(st.sampled_from(pool)) if pool and draw(st.integers(0, 3)) else []
        cut = draw(st.integers(0, len(base))) if base and draw(st.integers(0, 4)) == 0 else len(base)
        grown = base[:cut] + [_message(draw, step * 10 + k) for k in range(draw(st.integers(0 if base else 1, 4)))]
        pool.append(grown)
        out.append(copy.deepcopy(grown))
    return out


def _reference(messages: list[dict[str, Any]]) -> _view.Read:
    """The request read as the definition says, plainly: each message's view, consecutive ones of
    one role joined; each item digested; the view's two chains (with and without system messages)
    over the items' canonical JSON, and their cuts before each assistant item."""
    items: list[Any] = []
    for m in messages:
        it = _view.item_of(m)
        if items and items[-1][0] == it[0]:
            items[-1] = (it[0], f"{items[-1][1]} {it[1]}".strip(), items[-1][2] + it[2])
        else:
            items.append(it)
    whole, cuts = [], []
    for bare, kept in enumerate((items, [i for i in items if i[0] != "system"])):
        d = ""
        for n, item in enumerate(kept):
            if item[0] == "assistant" and d:
                cuts.append((-n, bare, d))
            d = hashlib.sha256(f"{d}\n{canonical_json(item)}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
        whole.append(d)
    return _view.Read(tuple(items), tuple(_view._digest(i) for i in items),
                      tuple(_view._digest(i[1]) if i[0] == "user" else "" for i in items),
                      tuple(canonical_json(m) for m in messages), " ".join(whole),
                      tuple(d for _, _, d in sorted(cuts)))


def _fresh(messages: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> _view.Read:
    with monkeypatch.context() as m:
        m.setattr(_view, "_MEMO", _view._Memo())
        m.setattr(_view, "_KNOWN", _view._Known())
        return _view.read(copy.deepcopy(messages))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests(), st.integers(1, 6))
def test_a_request_reads_as_on_a_fresh_proxy(monkeypatch: pytest.MonkeyPatch, seq: list[list[dict[str, Any]]],
                                             budget: int) -> None:
    monkeypatch.setattr(_view, "_MEMO", _view._Memo(budget * 40))  # small: entries are evicted mid-way
    monkeypatch.setattr(_view, "_KNOWN", _view._Known(budget * 60))
    for messages in seq:
        got = _view.read(messages)
        assert got == _fresh(messages, monkeypatch)
        assert got == _reference(messages)
        users = frozenset(d for it, d in zip(got.items, got.texts, strict=True) if it[0] == "user")
        assert _view.marks(got)[1] == users


def _chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": copy.deepcopy(messages)}


def test_a_known_conversation_checks_its_new_messages_against_what_it_left_open() -> None:
    """The check goes on from the known part: a tool result for a call the known part's last reply
    asked for passes; one answering nothing, or twice, is refused as on a fresh read."""
    start = [{"role": "user", "content": "go (a check test)"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "k1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    parse(_chat(start))
    parse(_chat([*start, {"role": "tool", "tool_call_id": "k1", "content": "ok"}]))
    with pytest.raises(BadRequest, match="answers no tool call"):
        parse(_chat([*start, {"role": "tool", "tool_call_id": "k9", "content": "ok"}]))
    with pytest.raises(BadRequest, match="answers no tool call"):
        parse(_chat([*start, {"role": "tool", "tool_call_id": "k1", "content": "ok"},
                     {"role": "tool", "tool_call_id": "k1", "content": "again"}]))


def test_a_known_conversation_still_has_its_new_messages_depth_checked() -> None:
    start = [{"role": "user", "content": "go (a depth test)"}, {"role": "assistant", "content": "ok"}]
    parse(_chat(start))
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    with pytest.raises(BadRequest, match="levels deep"):
        parse(_chat([*start, {"role": "user", "content": deep}]))


def test_a_long_integer_is_refused_wherever_it_is_new() -> None:
    """The body's fast parse leaves the integers' length to the wire's check: one past the limit in a
    new message of a known conversation, or in the rest of the body, is refused as the stdlib refused it."""
    from loopfence._json import loads

    start = [{"role": "user", "content": "go (an integer test)"}, {"role": "assistant", "content": "ok"}]
    parse(_chat(start))
    long = "9" * 1_001
    for body in ({"model": "m", "messages": start, "seed": "LONG"},
                 {"model": "m", "messages": [*start, {"role": "user", "content": [{"type": "text", "text": "x",
                                                                                   "n": "LONG"}]}]}):
        text = json.dumps(body).replace('"LONG"', long)
        with pytest.raises(BadRequest, match="an integer with 1,001 digits"):
            parse(loads(text, strict=True, deep=False))


def test_the_memos_stay_within_their_budgets() -> None:
    memo, known = _view._Memo(10_000), _view._Known(10_000)
    for i in range(300):
        m = {"role": "user", "content": f"{i} " + "x" * 500}
        memo.read(m, _view._key(m))
        reading = _view._Reading()
        reading.add(m)
        known.keep(reading, None)
        assert memo.chars <= 10_000 and known.chars <= 10_000
        assert memo.chars == sum(e.size for e in memo.kept.values())
    assert 0 < len(memo.kept) < 300 and 0 < len(known.kept) < 300


@settings(max_examples=150, deadline=None)
@given(requests(), st.lists(st.dictionaries(
    st.sampled_from(["temperature", "max_tokens", "tools", "user", "seed", "n", "zz", "a"]),
    st.one_of(st.integers(0, 5), st.floats(0, 2), st.text(max_size=3), st.lists(st.integers(0, 2)))), min_size=1,
    max_size=3))
def test_a_requests_own_digest_is_the_canonical_body_s(seq: list[list[dict[str, Any]]],
                                                       rests: list[dict[str, Any]]) -> None:
    """The digest that tells a retry (`whole`) is the one a canonical dump of the body gives (as
    before the reading was made incremental: replicas of two versions on one store agree), though it
    is hashed on from the known part's, and the rest of the body changes from one request to the next."""
    from loopfence.proxy._wire import read_as

    for i, messages in enumerate(seq):
        body = {"model": "m", "messages": messages, "stream": True, **rests[i % len(rests)]}
        kept = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        expected = hashlib.sha256(canonical_json(kept).encode("utf-8", "surrogatepass")).hexdigest()[:32]
        assert read_as(None, body, messages, [], {}).whole == expected


def test_a_run_of_one_role_is_joined_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """4,096 user messages in a row (a valid body): joined and digested once, not once per message
    (which hashed n^2/2 messages' text). Counted in characters digested, not timed."""
    digested = [0]
    plain = _view._digest

    def counting(value: Any) -> str:
        digested[0] += len(canonical_json(value))
        return plain(value)

    monkeypatch.setattr(_view, "_digest", counting)
    monkeypatch.setattr(_view, "_MEMO", _view._Memo())
    monkeypatch.setattr(_view, "_KNOWN", _view._Known())
    messages = [{"role": "user", "content": f"{i} " + "x" * 1000} for i in range(4096)]
    got = _view.read(messages)
    assert len(got.items) == 1 and got.items[0][1].startswith("0 x")
    assert digested[0] < 8 * sum(len(m["content"]) for m in messages), digested[0]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=8), st.lists(st.text("0123456789abcdef", min_size=32, max_size=32), max_size=12),
       st.lists(st.integers(-14, 14), max_size=6))
def test_a_sessions_cuts_are_salted_as_they_are_read(session: str, plain: list[str], reads: list[int]) -> None:
    """`Incoming.scoped` salts a request's cuts as they are read (a request is placed by its first one
    or two; a long conversation has hundreds): whatever is read of them, by index, slice or iteration,
    is what salting them all gives, and only what is read is salted."""
    from loopfence.proxy._wire import Salted, salted

    whole = tuple(salted(session, d) for d in plain)
    lazy = Salted(session, plain)
    for i in reads:
        if -len(whole) <= i < len(whole):
            assert lazy[i] == whole[i]
        else:
            with pytest.raises(IndexError):
                lazy[i]
    assert len(lazy.done) == len({i % len(whole) for i in reads if -len(whole) <= i < len(whole)})
    assert next(iter(lazy), None) == (whole[0] if whole else None)
    assert lazy[1:4] == whole[1:4] and lazy[::-2] == whole[::-2]
    assert lazy == whole and list(lazy) == list(whole) and len(lazy) == len(whole) and hash(lazy) == hash(whole)
    assert all(d in lazy for d in whole) and "0" * 32 not in Salted(session, [])
