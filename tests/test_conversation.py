"""Conversations: a run continues a conversation (`[*result.messages, {"role": "user", ...}]`), each
turn one fenced run with its own log and budgets; the log records the messages it started from, so a
continued turn replays and reconciles; a whole conversation's budget is `limits.left_after(...)`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from loopfence import Agent, Limits, ScriptedModel, StopReason, arun, run, stream, tool
from loopfence.runlog import read_log, reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call


@tool(kind="read_only")
def weather(city: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "sky": "clear" if city == "Oslo" else "rain"}


def _agent(replies: list[Any], tmp_path: Path, **kw: Any) -> Agent:
    return Agent(model=ScriptedModel(replies), tools=[weather], system="Be brief.", log=tmp_path / "runs", **kw)


def test_a_second_turn_continues_from_the_first_and_its_log_replays_and_reconciles(tmp_path: Path) -> None:
    model = ScriptedModel([calls_reply(tool_call("weather", city="Oslo")), text_reply("Oslo: clear."),
                           calls_reply(tool_call("weather", city="Bergen")), text_reply("Bergen: rain.")])
    agent = Agent(model=model, tools=[weather], system="Be brief.", log=tmp_path / "runs")
    first = agent.run("Weather in Oslo?")
    second = agent.run([*first.messages, {"role": "user", "content": "And Bergen?"}])
    assert (first.final_answer, second.final_answer) == ("Oslo: clear.", "Bergen: rain.")
    # the second turn started from the whole first conversation (one system message, not two)
    assert list(second.messages[:len(first.messages)]) == list(first.messages)
    assert [m["role"] for m in second.messages].count("system") == 1
    assert second.messages[len(first.messages)] == {"role": "user", "content": "And Bergen?"}
    # its own run: its own log, ledger and steps
    assert first.log_path != second.log_path and second.ledger.model_requests == 2
    header = read_log(second.log_path).header
    assert header.version == 6 and header.task == "And Bergen?"
    assert header.messages == [*first.messages, {"role": "user", "content": "And Bergen?"}]
    report = replay(second.log_path)
    assert report.ok and report.same_stop, report.lines() if hasattr(report, "lines") else report
    assert reconcile(second.log_path).ok
    # a task's log records no messages (its header's system and task are its start)
    assert read_log(first.log_path).header.messages is None and replay(first.log_path).ok


def test_an_edited_opening_diverges_on_replay(tmp_path: Path) -> None:
    """The recorded messages are what replay starts from: change one and the first request differs."""
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "again"}]
    result = run(convo, model=ScriptedModel([text_reply("yes")]), log=tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["messages"][1]["content"] = "HELLO"
    (tmp_path / "b.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert result.final_answer == "yes" and replay(tmp_path / "a.jsonl").ok
    assert not replay(tmp_path / "b.jsonl").ok


def test_arun_and_stream_take_a_conversation(tmp_path: Path) -> None:
    convo = [{"role": "system", "content": "Own system."}, {"role": "user", "content": "hi"}]
    result = asyncio.run(arun(convo, model=ScriptedModel([text_reply("a")]), system="Ignored: the conversation has one."))
    assert result.messages[0] == {"role": "system", "content": "Own system."} and len(result.messages) == 3
    s = stream(convo, model=ScriptedModel([text_reply("b")]))
    events = [e.event for e in s]
    assert events[0] == "header" and events[-1] == "stop" and s.result is not None
    assert s.result.final_answer == "b"


@pytest.mark.parametrize("task, error, words", [
    ([], ValueError, "conversation is empty"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], ValueError,
     "messages[1]: a conversation ends with the user's message"),
    ([{"role": "wizard", "content": "hi"}], ValueError, "messages[0].role must be one of"),
    ([{"role": "user", "content": 3}], ValueError, "messages[0].content must be a string"),
    ([{"role": "tool", "content": "x"}, {"role": "user", "content": "hi"}], ValueError, "messages[0].tool_call_id"),
    (["hi"], TypeError, "messages[0] must be a dict"),
    ([{"role": "user", "content": "hi", "extra": object()}], TypeError, "messages[0] must be JSON"),
    ({"role": "user", "content": "hi"}, TypeError, "task must be a string or a conversation"),
])
def test_a_bad_conversation_is_refused_before_anything_runs(tmp_path: Path, task: Any, error: type,
                                                            words: str) -> None:
    model = ScriptedModel([text_reply("never")])
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        run(task, model=model, log=tmp_path / "x.jsonl")
    with pytest.raises(error):
        stream(task, model=model)
    assert not (tmp_path / "x.jsonl").exists()


def test_a_conversation_budget_is_the_limits_left_after_earlier_turns(tmp_path: Path) -> None:
    """Budgets are per run; `left_after` gives a whole conversation one: each turn runs with what the
    earlier turns left, and a spent budget stops the next turn at once, naming it."""
    whole = Limits(max_steps=3, max_tool_calls=10)
    agent = _agent([calls_reply(tool_call("weather", city="Oslo")), text_reply("clear"), text_reply("rain"),
                    text_reply("never sent")], tmp_path, limits=whole)
    turns = [agent.run("Oslo?")]
    assert whole.left_after(turns[0].ledger).max_steps == 1
    turns.append(agent.run([*turns[-1].messages, {"role": "user", "content": "Bergen?"}],
                           limits=whole.left_after(*(t.ledger for t in turns))))
    assert turns[-1].final_answer == "rain"
    left = whole.left_after(*(t.ledger for t in turns))
    assert (left.max_steps, left.max_tool_calls, left.max_tokens_per_request) == (0, 9, whole.max_tokens_per_request)
    third = agent.run([*turns[-1].messages, {"role": "user", "content": "Paris?"}], limits=left)
    assert third.stop.reason is StopReason.MAX_STEPS and third.ledger.model_requests == 0
    assert third.stop.data["limit"] == 0
    # without it, each turn has the whole budget again
    assert agent.run([*turns[-1].messages, {"role": "user", "content": "Paris?"}]).final_answer == "never sent"
