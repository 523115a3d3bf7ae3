"""Live text: `stream()` yields `TextDelta`s as the model writes, between the step's request and
reply events, and they concatenate to the reply's text, for any chunking (real HTTP to a loopback
FakeServer), and on the embedded model. Tool calls are not text; the log never holds a delta."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from _local_support import needs_local_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence import Agent, Limits, TextDelta, tool
from loopfence._log._schema import ReplyLine, RequestLine, StopLine
from loopfence.models import OpenAIModel
from loopfence.testing import FakeServer, calls_reply, text_chunks, tool_call


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _pieces(draw_text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(draw_text) + 1) for c in cuts} | {0, len(draw_text)})
    return [draw_text[a:b] for a, b in zip(points, points[1:])]


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60).filter(str.strip)


def _collect(events):
    """(deltas by step, reply text by step, the order of kinds) from a run's events."""
    deltas: dict[int, list[str]] = {}
    replies: dict[int, str | None] = {}
    order = []
    for ev in events:
        if isinstance(ev, TextDelta):
            deltas.setdefault(ev.step, []).append(ev.text)
            order.append(("delta", ev.step))
        elif isinstance(ev, ReplyLine):
            replies[ev.step] = ev.reply().content
            order.append(("reply", ev.step))
        elif isinstance(ev, RequestLine):
            order.append(("request", ev.step))
    return deltas, replies, order


def _check(deltas, replies, order, texts):
    for step, text in texts.items():
        assert "".join(deltas.get(step, [])) == text == (replies[step] or "")
    for i, (kind, step) in enumerate(order):  # each delta between its step's request and reply
        if kind == "delta":
            assert ("request", step) in order[:i] and ("reply", step) in order[i:]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_TEXT, cuts=st.lists(st.integers(0, 60), max_size=8), said=st.none() | _TEXT,
       sync=st.booleans())
def test_deltas_concatenate_to_the_answer_for_any_chunking(tmp_path: Path, answer: str, cuts: list[int],
                                                         said: str | None, sync: bool) -> None:
    pieces = _pieces(answer, cuts)
    first = calls_reply(tool_call("lookup", key="k"), content=said)  # streamed: its text, then a call
    with FakeServer([first, text_chunks(*pieces)]) as srv, OpenAIModel(srv.base_url, "fake", stream=True) as m:
        agent = Agent(model=m, tools=[lookup], limits=Limits(max_steps=4))
        if sync:
            s = agent.stream("look k up")
            events = list(s)
        else:
            async def take():
                return [ev async for ev in agent.stream("look k up")]
            events = asyncio.run(take())
    deltas, replies, order = _collect(events)
    assert isinstance(events[-1], StopLine) and events[-1].reason == "final_answer"
    _check(deltas, replies, order, {1: said or "", 2: answer})
    assert deltas[2] == [p for p in pieces if p]  # as sent, in order: one delta a chunk


def test_deltas_are_not_log_lines(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    with FakeServer([text_chunks("Hel", "lo")]) as srv, OpenAIModel(srv.base_url, "fake", stream=True) as m:
        events = list(Agent(model=m).stream("hi", log=str(log)))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo"]
    kinds = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert "text_delta" not in kinds and kinds.count("reply") == 1


def test_no_deltas_without_a_stream() -> None:
    """A model asked not to stream sends its reply whole: no deltas, the reply event has the text."""
    with FakeServer([text_chunks("Hel", "lo")]) as srv, OpenAIModel(srv.base_url, "fake") as m:
        events = list(Agent(model=m).stream("hi"))
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert [e.reply().content for e in events if isinstance(e, ReplyLine)] == ["Hello"]


@pytest.mark.parametrize("with_tools", [False, True], ids=["plain", "grammar"])
def test_embedded_model_deltas_concatenate_to_its_answer(tmp_path: Path, with_tools: bool) -> None:
    pytest.importorskip("llama_cpp")
    from loopfence.models import LocalModel
    from loopfence import workspace_tools

    tools = workspace_tools(tmp_path) if with_tools else []
    agent = Agent(model=LocalModel(), tools=tools, limits=Limits(max_steps=3))
    task = "What is the capital of France?" if with_tools else "Say hello to the user in one sentence."

    async def take():
        return [ev async for ev in agent.stream(task)]  # a sync model: its pieces cross from its worker thread
    deltas, replies, order = _collect(asyncio.run(take()))
    answered = {step: text for step, text in replies.items() if text}
    assert answered, replies
    _check(deltas, replies, order, answered)
    if not with_tools:
        assert max(len(d) for d in deltas.values()) > 1  # pieces as it writes, not one at the end


for _t in (test_embedded_model_deltas_concatenate_to_its_answer,):
    for _mark in needs_local_model:
        _mark(_t)
