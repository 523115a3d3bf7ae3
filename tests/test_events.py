"""Typed events: the published schema, retries as events, the live stream."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from loopfence import Limits, run, workspace_tools
from loopfence.cli import cli
from loopfence.models import OpenAIModel
from loopfence.runlog import read_log
from loopfence.testing import FakeServer, text_reply

from _runlog_support import config_script, make_workspace, read_lines, record

RATE_LIMITED = {"status": 429, "body": {}, "headers": {"retry-after-ms": "50"}}


def _schema(capsys: pytest.CaptureFixture[str]) -> dict:
    assert cli(["schema", "events"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.validators.validator_for(schema).check_schema(schema)
    return schema


def test_the_printed_schema_accepts_a_recorded_log_and_refuses_a_hand_edited_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = _schema(capsys)
    path = tmp_path / "run.jsonl"
    record(path, config_script(), workspace=make_workspace(tmp_path))
    lines = read_lines(path)
    assert lines[0]["version"] == 6 and {e["event"] for e in lines} >= {"header", "request", "reply", "call",
                                                                       "result", "stop"}
    for line in lines:
        jsonschema.validate(line, schema)
    result = next(e for e in lines if e["event"] == "result")
    for field, value in (("decision", "vaporized"), ("ok", "yes"), ("step", 1.5)):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**result, field: value}, schema)


def test_a_retried_429_is_a_retry_event_in_the_log_and_the_live_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("milk\n")
    log = tmp_path / "run.jsonl"
    with FakeServer([RATE_LIMITED, text_reply("all done")]) as srv:
        code = cli(["run", "Read notes.txt", "--base-url", srv.base_url, "--model", "fake",
                    "--workspace", str(tmp_path), "--log", str(log)])
        served = len(srv.requests)
    err = capsys.readouterr().err
    assert code == 0 and served == 2, err
    kinds = [e.event for e in read_log(log).events]
    assert kinds == ["request", "retry", "reply", "stop"]
    (retry,) = [e for e in read_lines(log) if e["event"] == "retry"]
    assert (retry["step"], retry["attempt"], retry["status"], retry["wait_s"]) == (1, 1, 429, 0.05)
    assert "429" in retry["reason"]
    assert "retry attempt 1 failed (HTTP 429), next in 0.05s" in err


def test_a_retried_request_replays_and_reconciles(tmp_path: Path) -> None:
    from loopfence.runlog import reconcile, replay

    log = tmp_path / "run.jsonl"
    with FakeServer([RATE_LIMITED, text_reply("all done")]) as srv, \
            OpenAIModel(srv.base_url, "fake") as model:
        result = run("t", model=model, tools=workspace_tools(tmp_path), limits=Limits(max_steps=3), log=log)
    assert result.stop.reason == "final_answer"
    report = replay(log)
    assert report.ok and report.divergence is None, report.lines()
    assert reconcile(log).ok


def test_the_stream_yields_typed_events_in_order_ending_with_the_stop(tmp_path: Path) -> None:
    import asyncio

    from loopfence import ScriptedModel, stream
    from loopfence._log._schema import CallLine, Decision, HeaderLine, ResultLine, StopLine
    from loopfence.testing import calls_reply, tool_call

    ws = make_workspace(tmp_path)
    model = ScriptedModel([calls_reply(tool_call("read_file", path="app/config.py")), text_reply("done")])

    async def main() -> tuple[list, object]:
        s = stream("Read app/config.py", model=model, tools=workspace_tools(ws), log=tmp_path / "s.jsonl")
        return [e async for e in s], s.result

    events, result = asyncio.run(main())
    assert [e.event for e in events] == ["header", "request", "reply", "call", "result", "request", "reply",
                                         "stop"]
    assert isinstance(events[0], HeaderLine) and isinstance(events[3], CallLine)
    assert isinstance(events[4], ResultLine) and events[4].decision is Decision.EXECUTED
    assert isinstance(events[-1], StopLine) and events[-1].reason == "final_answer"
    assert result.final_answer == "done" and result.stop.reason == events[-1].reason
    back = read_log(tmp_path / "s.jsonl").all_events  # read back: the same models, the same values
    assert [type(e) for e in back] == [type(e) for e in events]
    assert [e.model_dump() for e in back] == [e.model_dump() for e in events]


def test_on_event_sees_a_retry_as_it_happens(tmp_path: Path) -> None:
    from loopfence._log._schema import RetryLine

    seen: list = []
    with FakeServer([RATE_LIMITED, text_reply("all done")]) as srv, OpenAIModel(srv.base_url, "fake") as model:
        run("t", model=model, log=None, on_event=seen.append)
    assert [e.event for e in seen] == ["header", "request", "retry", "reply", "stop"]
    assert isinstance(seen[2], RetryLine) and seen[2].status == 429
