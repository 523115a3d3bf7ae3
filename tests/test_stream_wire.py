"""Every recorded chat.completions exchange in tests/data/wire/ yields the calls the provider sent.

Each file is replayed through a real loopback server (FakeServer) into the real client
(OpenAIModel), and also parsed offline (assemble_sse / reply_from_response): names, arguments,
count and order; parallel calls stay separate; errors end in the named stop.
"""

from __future__ import annotations

import json
import random

import pytest
from _wire_support import EXPECTED, TEXT, load_exchanges, sse_bodies, wire_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence import Request, StopReason
from loopfence._stops import StopError
from loopfence.models._openai import OpenAIModel, Timeouts
from loopfence.models._sse import iter_events, iter_lines
from loopfence.models._stream import StreamEnd, assemble, assemble_events, assemble_sse, reply_from_response
from loopfence.testing import FakeServer


def _calls(reply):
    return [(c.name, json.loads(c.raw_arguments)) for c in reply.tool_calls]


def _check(reply_or_stop, expected, where):
    if isinstance(expected, str) and expected.startswith("stop:"):
        assert isinstance(reply_or_stop, StopError), f"{where}: expected {expected}, got {reply_or_stop}"
        assert reply_or_stop.stop.reason is StopReason(expected[5:]), f"{where}: {reply_or_stop.stop}"
        return
    assert not isinstance(reply_or_stop, StopError), f"{where}: {reply_or_stop}"
    reply = reply_or_stop
    assert reply.complete, f"{where}: {reply.problem}"
    if expected == TEXT:
        assert reply.tool_calls == ()
        return
    assert _calls(reply) == expected, where
    ids = [c.id for c in reply.tool_calls]
    assert all(ids) and len(set(ids)) == len(ids), f"{where}: ids {ids}"


def _offline(ex):
    names = [t["function"]["name"] for t in ex.tools]
    try:
        if ex.streamed:
            return assemble_sse(ex.body, tools=names)
        if ex.status != 200:
            from loopfence.models._errors import error_stop
            return error_stop(ex.status, ex.body, tools=names)
        return reply_from_response(ex.body)
    except StopError as exc:
        return exc


def test_every_capture_file_is_covered():
    assert set(wire_files()) == set(EXPECTED)
    for name in wire_files():
        assert {e.n for e in load_exchanges(name)} == set(EXPECTED[name]), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_parses_offline_to_the_calls_sent(name):
    for ex in load_exchanges(name):
        _check(_offline(ex), EXPECTED[name][ex.n], f"{name}[{ex.n}]")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_replayed_over_http_gives_the_calls_sent(name):
    exchanges = load_exchanges(name)
    with FakeServer([ex.form() for ex in exchanges]) as srv:
        with OpenAIModel(srv.base_url, "replay", max_retries=0,
                         timeout=Timeouts(connect=2, read=2, write=2, pool=2)) as model:
            for ex in exchanges:
                model.stream = ex.streamed
                request = Request([{"role": "user", "content": "replay"}], list(ex.tools), {})
                try:
                    got = model.complete(request)
                except StopError as exc:
                    got = exc
                _check(got, EXPECTED[name][ex.n], f"{name}[{ex.n}] over HTTP")
        assert len(srv.requests) == len(exchanges)


def test_parallel_calls_stay_separate_with_their_own_ids():
    reply = assemble_sse(load_exchanges("openai-python__two_parallel_calls.sse")[0].body)
    assert [c.id for c in reply.tool_calls] == ["call_JMW1whyEaYG438VE1OIflxA2", "call_DNYTawLBoN8fj3KN6qU9N1Ou"]
    assert [c.index for c in reply.tool_calls] == [0, 1]


def test_repeated_name_and_id_are_not_concatenated():
    reply = assemble_sse(load_exchanges("simonw-llm__test_tools_streaming_variant_a.yaml")[0].body)
    (call,) = reply.tool_calls
    assert (call.id, call.name, call.arguments) == ("0", "llm_version", "{}")


def test_length_finish_is_complete_but_marked():
    reply = assemble_sse(load_exchanges("openai-python__4cc50a6135d2.sse")[0].body)
    assert reply.finish_reason == "length" and reply.content == '{"'
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (79, 1)


# -- re-chunking: the same calls whatever the boundaries ------------------------------------------
_BODIES = [b for b in sse_bodies() if not str(EXPECTED[b[0]][b[1]]).startswith("stop:")]


def _reference(body):
    return assemble_sse(body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(_BODIES) - 1), cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_any_byte_chunking_of_a_recorded_stream_assembles_the_same_calls(which, cuts):
    _, _, body = _BODIES[which]
    raw = body.encode()
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    ref = _reference(body)
    end = StreamEnd()
    got = assemble_events(iter_events(iter_lines(pieces)), end)
    assert [(c.id, c.name, c.arguments) for c in got.tool_calls] == \
        [(c.id, c.name, c.arguments) for c in ref.tool_calls]
    assert (got.content, got.finish_reason, got.complete) == (ref.content, ref.finish_reason, ref.complete)


def _rechunk(reply, rng: random.Random, repeat_head: bool, merge: bool):
    """New chunk dicts carrying the same calls: argument text cut at random points, calls
    interleaved, id/name optionally repeated in every delta, deltas optionally merged."""
    deltas = []
    for c in reply.tool_calls:
        text = c.raw_arguments
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 6)))) if len(text) > 1 else []
        frags = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        head = {"index": c.index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
        seq = [head]
        for f in frags:
            d = {"index": c.index, "function": {"arguments": f}}
            if repeat_head:
                d.update(id=c.id, type="function")
                d["function"]["name"] = c.name
            seq.append(d)
        deltas.append(seq)
    # interleave the calls' delta sequences, keeping each call's own order and its head first
    order = [i for i, seq in enumerate(deltas) for _ in seq]
    rng.shuffle(order)
    pos = [0] * len(deltas)
    stream = []
    for i in order:
        stream.append(deltas[i][pos[i]])
        pos[i] += 1
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    text = reply.content or ""
    for k in range(0, len(text), 5):
        chunks.append({"choices": [{"index": 0, "delta": {"content": text[k:k + 5]}}]})
    if merge:
        while stream:
            n = rng.randint(1, 3)
            chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": stream[:n]}}]})
            stream = stream[n:]
    else:
        chunks += [{"choices": [{"index": 0, "delta": {"tool_calls": [d]}}]} for d in stream]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason or "stop"}]})
    return chunks


@settings(max_examples=80, deadline=None)
@given(which=st.integers(0, len(_BODIES) - 1), seed=st.integers(0, 2**32 - 1), repeat_head=st.booleans(),
       merge=st.booleans())
def test_any_delta_rechunking_of_a_recorded_stream_assembles_the_same_calls(which, seed, repeat_head, merge):
    ref = _reference(_BODIES[which][2])
    got = assemble(_rechunk(ref, random.Random(seed), repeat_head, merge))
    key = sorted((c.index, c.id, c.name, c.raw_arguments) for c in ref.tool_calls)
    assert sorted((c.index, c.id, c.name, c.raw_arguments) for c in got.tool_calls) == key
    assert got.content == ref.content and got.complete
