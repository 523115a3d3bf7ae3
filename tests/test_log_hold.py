"""The ring writes its log in two writes a step (RunLog.hold): a reply or a result line goes out with
the next line, and the file is whole whenever the run waits on an operation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from loopfence import Limits, ScriptedModel, arun, run, tool
from loopfence._log._schema import LogEvent, parse_line
from loopfence.runlog import RunLog
from loopfence.testing import calls_reply, text_reply, tool_call

REPLIES = [calls_reply(tool_call("peek", i=0)), calls_reply(tool_call("peek", i=1), tool_call("peek", i=2)),
           text_reply("done")]


def _events(path: Path) -> list[str]:
    return [json.loads(x)["event"] for x in path.read_text(encoding="utf-8").splitlines()]


def _peeking(log: Path, seen: list[tuple[str, list[str]]], is_async: bool) -> tuple[ScriptedModel, object]:
    """A model and a tool that read the log file while the run waits on them."""

    class Peeking(ScriptedModel):
        async def acomplete(self, request):  # noqa: ANN001, ANN202
            seen.append(("model", _events(log)))
            return await super().acomplete(request)

    if is_async:
        async def peek(i: int) -> str:
            seen.append(("tool", _events(log)))
            return f"peeked {i}"
    else:
        def peek(i: int) -> str:
            seen.append(("tool", _events(log)))
            return f"peeked {i}"
    return Peeking(REPLIES), peek


@pytest.mark.parametrize("entry", ["run", "arun"])
def test_the_file_holds_every_line_written_so_far_whenever_the_run_waits(tmp_path: Path, entry: str) -> None:
    log = tmp_path / "run.jsonl"
    seen: list[tuple[str, list[str]]] = []
    model, peek = _peeking(log, seen, is_async=entry == "arun")
    args = dict(model=model, tools=[tool(peek, kind="side_effect")], log=log, limits=Limits())
    result = run("t", **args) if entry == "run" else asyncio.run(arun("t", **args))
    assert result.final_answer == "done"
    final = _events(log)
    assert final.count("reply") == 3 and final.count("result") == 3 and final[-1] == "stop"
    assert [who for who, _ in seen] == ["model", "tool", "model", "tool", "tool", "model"]
    for who, events in seen:
        assert events == final[:len(events)]  # a prefix of the finished log: nothing held back...
        assert events[-1] == ("request" if who == "model" else "call")  # ...up to the operation's own line
    # the second call of a reply waits with the first call's result in the file
    assert seen[4][1][-3:] == ["call", "result", "call"]


def _fields() -> dict[str, LogEvent]:
    """Real reply, result and request events, from a run kept in memory."""
    mem = RunLog(None)
    run("t", model=ScriptedModel([calls_reply(tool_call("peek", i=0)), text_reply("done")]),
        tools=[tool(lambda i: "ok", name="peek")], log=mem)
    return {e["event"]: parse_line(e) for e in mem.events}


def test_a_held_line_is_written_at_close_and_by_flush(tmp_path: Path) -> None:
    f = _fields()
    path = tmp_path / "log.jsonl"
    log = RunLog(path)
    log.hold = True
    log.write(f["reply"])
    assert path.read_text() == ""  # held
    log.flush()
    assert _events(path) == ["reply"]
    log.write(f["result"])
    log.write(f["request"])  # a line that is not held takes the held one with it
    assert _events(path) == ["reply", "result", "request"]
    log.write(f["result"])
    log.close()
    assert _events(path) == ["reply", "result", "request", "result"]


def test_a_failed_write_names_only_the_lines_really_written() -> None:
    from loopfence._log._writer import LogWriteError

    f = _fields()
    log = RunLog("/dev/full")
    log.hold = True
    log.write(f["reply"])  # held: nothing written yet
    with pytest.raises(LogWriteError) as err:
        log.write(f["request"])
    assert err.value.lines == 0 and "complete" not in str(err.value)
    with pytest.raises(LogWriteError):  # broken: every later write refuses, held or not
        log.write(f["request"])
    with pytest.raises(LogWriteError):
        log.write(f["result"])
    log.close()
