"""The answer contract (`answer=`): a final answer that fails it goes back to the model once with
the error, then passes (`result.output` typed) or stops `answer_rejected`; replay and reconcile
follow the recorded verdicts without the contract."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _local_support import SAMPLE_SYSTEM, SAMPLE_WORKSPACE, needs_local_model
from pydantic import BaseModel

from loopfence import (
    Agent,
    Limits,
    ScriptedModel,
    StopReason,
    Verdict,
    run,
    tool,
    workspace_tools,
)
from loopfence.cli import cli
from loopfence.runlog import read_log, reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call


class Weather(BaseModel):
    city: str
    celsius: float


GOOD = '{"city": "Oslo", "celsius": 3}'
NO_TEMP = '{"city": "Oslo"}'


def _answers(path: Path) -> list[dict[str, Any]]:
    return [e.record for e in read_log(path).events if e.event == "answer"]


def _replays_and_reconciles(path: Path) -> None:
    report = replay(path)
    assert report.ok and report.same_stop, report.divergence or report.past_end
    assert reconcile(path).ok, [(c.name, c.detail) for c in reconcile(path).failed]


def test_a_pydantic_answer_that_fails_once_gets_the_error_then_passes(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    agent = Agent(model=ScriptedModel([text_reply(NO_TEMP), text_reply(f"```json\n{GOOD}\n```")]), answer=Weather)
    result = agent.run("Weather in Oslo, as JSON", log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.verdict is Verdict.SHIP
    assert result.output == Weather(city="Oslo", celsius=3.0) and isinstance(result.output, Weather)
    assert result.ledger.model_requests == 2  # the retry is a step like any other
    feedback = result.messages[-2]
    assert feedback["role"] == "user" and "celsius: Field required" in feedback["content"]
    assert [(a["decision"], a.get("error")) for a in _answers(log)] == [
        ("rejected", "celsius: Field required"), ("accepted", None)]
    assert read_log(log).header.answer["kind"] == "model"
    _replays_and_reconciles(log)


def test_an_answer_that_fails_twice_stops_answer_rejected_and_replay_reaches_it(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    result = run("Weather?", model=ScriptedModel([text_reply("It is sunny."), text_reply(NO_TEMP)]),
                 answer=Weather, log=log)
    assert result.stop.reason is StopReason.ANSWER_REJECTED and result.verdict is Verdict.KILL
    assert result.stop.data == {"error": "celsius: Field required", "limit": 1, "value": 2}
    assert "celsius: Field required" in result.stop.detail
    assert result.final_answer is None and result.output is None
    assert [a["decision"] for a in _answers(log)] == ["rejected", "rejected"]
    assert "message" not in _answers(log)[-1]  # no retry left: nothing more was sent
    _replays_and_reconciles(log)  # without the contract: the verdicts are the log's
    assert cli(["replay", str(log)]) == 0
    assert "answer_rejected at step 2" in capsys.readouterr().err


@pytest.mark.parametrize("retries, requests", [(0, 1), (2, 3)])
def test_answer_retries_sets_how_many_times_an_answer_goes_back(retries: int, requests: int) -> None:
    result = run("Weather?", model=ScriptedModel([text_reply("no")] * 3 + [text_reply(GOOD)]),
                 answer=Weather, answer_retries=retries)
    assert result.stop.reason is StopReason.ANSWER_REJECTED and result.ledger.model_requests == requests
    assert result.stop.data["limit"] == retries and result.stop.data["value"] == retries + 1


def test_a_retry_counts_under_the_runs_budgets() -> None:
    result = run("Weather?", model=ScriptedModel([text_reply(NO_TEMP), text_reply(GOOD)]), answer=Weather,
                 limits={"max_steps": 1})
    assert result.stop.reason is StopReason.MAX_STEPS and result.ledger.model_requests == 1


def test_a_json_schema_answer_is_the_parsed_json(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    log = tmp_path / "run.jsonl"
    result = run("City?", model=ScriptedModel([text_reply('{"town": "Oslo"}'), text_reply('{"city": "Oslo"}')]),
                 answer=schema, log=log)
    assert result.output == {"city": "Oslo"} and result.final_answer == '{"city": "Oslo"}'
    assert "city" in _answers(log)[0]["error"]
    assert json.dumps(schema) in result.messages[-2]["content"]  # the shape asked for
    _replays_and_reconciles(log)


def test_without_a_contract_the_output_is_the_text_and_nothing_is_judged(tmp_path: Path) -> None:
    result = run("Hi", model=ScriptedModel([text_reply("Hello")]), log=tmp_path / "run.jsonl")
    assert result.output == "Hello" and _answers(tmp_path / "run.jsonl") == []
    assert read_log(tmp_path / "run.jsonl").header.answer is None


def _echo_guard(results: list[str]) -> Any:
    """A contract that rejects an answer that is the last tool result (or a part of it): the model
    passing a tool's output (here an error) off as its answer."""
    def not_an_echo(text: str) -> str | None:
        if not results:
            return None
        try:
            said, last = json.loads(text), json.loads(results[-1])
        except ValueError:
            return None if text.strip() != results[-1].strip() else "that is the tool's output, not an answer"
        if isinstance(said, dict) and isinstance(last, dict) and said and all(last.get(k) == v for k, v in said.items()):
            return "that is the last tool result repeated, not an answer to the task"
        return None
    return not_an_echo


def _tracking(results: list[str]) -> Any:
    return lambda e: results.append(e.content) if e.event == "result" else None


def test_a_callable_stops_a_model_that_echoes_a_tools_error(tmp_path: Path) -> None:
    @tool(kind="read_only")
    def read_file(path: str) -> dict[str, Any]:
        """Read a file."""
        return {"ok": False, "error": "missing_file", "path": path}

    echo = json.dumps({"ok": False, "error": "missing_file", "path": "notes.txt"})
    replies = [calls_reply(tool_call("read_file", path="notes.txt")), text_reply(echo), text_reply(echo)]
    seen: list[str] = []
    log = tmp_path / "run.jsonl"
    result = run("Read notes.txt", model=ScriptedModel(replies), tools=[read_file], log=log,
                 answer=_echo_guard(seen), on_event=_tracking(seen))
    assert result.stop.reason is StopReason.ANSWER_REJECTED and result.verdict is Verdict.KILL
    assert "last tool result repeated" in result.stop.data["error"]
    _replays_and_reconciles(log)
    # the same run with no contract ships the echo
    assert run("Read notes.txt", model=ScriptedModel(replies), tools=[read_file]).verdict is Verdict.SHIP


@pytest.mark.parametrize("settings, error, words", [
    ({"answer": 42}, TypeError, "answer= takes a pydantic model class"),
    ({"answer": int}, TypeError, "answer= takes a pydantic model class"),
    ({"answer": Weather, "answer_retries": -1}, ValueError, "answer_retries must be a whole number >= 0"),
    ({"answer": Weather, "answer_retries": True}, ValueError, "answer_retries"),
])
def test_a_bad_contract_is_refused_before_anything_runs(tmp_path: Path, settings: dict[str, Any], error: type,
                                                        words: str) -> None:
    model = ScriptedModel([text_reply("never")])
    with pytest.raises(error, match=words):
        Agent(model=model, **settings)
    with pytest.raises(error, match=words):
        run("x", model=model, log=tmp_path / "x.jsonl", **settings)
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("contract", [True, False])
@needs_local_model[0]
@needs_local_model[1]
def test_the_embedded_models_echo_of_a_tool_error_is_stopped(tmp_path: Path, contract: bool) -> None:
    """SmolLM2-135M, asked to read a file, answers with (most of) the tool's error JSON. Without a
    contract that ships; a callable rejecting the last tool result stops it (and the log replays)."""
    from loopfence.models._local import LocalModel

    shutil.copytree(SAMPLE_WORKSPACE, tmp_path / "ws")
    seen: list[str] = []
    log = tmp_path / "run.jsonl"
    extra: dict[str, Any] = {"answer": _echo_guard(seen)} if contract else {}
    result = run("Read notes.txt", model=LocalModel(), tools=workspace_tools(tmp_path / "ws"), system=SAMPLE_SYSTEM,
                 limits=Limits(max_steps=4), log=log, on_event=_tracking(seen), **extra)
    if not contract:
        assert result.verdict is Verdict.SHIP and _echo_guard(seen)(result.final_answer or "") is not None
        return
    assert result.stop.reason is StopReason.ANSWER_REJECTED, result.stop
    _replays_and_reconciles(log)


def test_a_resumed_run_plays_back_the_recorded_verdicts_then_judges_live(tmp_path: Path) -> None:
    """Cut after the first (rejected) answer: resume plays it back as recorded, and the live reply is
    judged by the recorded schema (a function's contract is passed again: `resume(answer=...)`)."""
    from loopfence.runlog import resume

    log = tmp_path / "run.jsonl"
    run("Weather?", model=ScriptedModel([text_reply(NO_TEMP), text_reply(NO_TEMP)]), answer=Weather, log=log)
    lines = log.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if '"event":"answer"' in line)
    log.write_text("\n".join(lines[:cut + 1]) + "\n")  # the run died after its first verdict
    outcome = resume(log, model=ScriptedModel([text_reply(GOOD)]), tools=[])
    assert outcome.result is not None and outcome.result.stop.reason is StopReason.FINAL_ANSWER
    assert outcome.result.output == {"city": "Oslo", "celsius": 3}
    assert [a["decision"] for a in _answers(log)] == ["rejected", "accepted"]
    assert reconcile(log).ok
