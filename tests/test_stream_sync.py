"""`for event in stream(...)`: the run's typed events from sync code, the same as `async for`."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import pytest

from loopfence import ScriptedModel, StopReason, stream, tool, workspace_tools
from loopfence.runlog import read_log, reconcile
from loopfence._log._schema import StopLine
from loopfence.testing import calls_reply, text_reply, tool_call

from _runlog_support import make_workspace


def _script() -> ScriptedModel:
    return ScriptedModel([calls_reply(tool_call("read_file", path="app/config.py")), text_reply("done")])


def test_sync_iteration_yields_the_same_events_as_async(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    s = stream("Read app/config.py", model=_script(), tools=workspace_tools(ws), log=tmp_path / "sync.jsonl")
    synced = list(s)
    assert s.result is not None and s.result.final_answer == "done"

    async def main() -> list:
        a = stream("Read app/config.py", model=_script(), tools=workspace_tools(ws), log=tmp_path / "async.jsonl")
        return [e async for e in a]

    awaited = asyncio.run(main())
    assert [e.event for e in synced] == [e.event for e in awaited] == [
        "header", "request", "reply", "call", "result", "request", "reply", "stop"]
    assert isinstance(synced[-1], StopLine) and synced[-1].reason == s.result.stop.reason
    read = read_log(tmp_path / "sync.jsonl").all_events
    assert [e.seq for e in synced] == [e.seq for e in read]
    # One shape: what the log reads back names each event as the live events do (`.event`).
    assert [e.event for e in read] == [e.event for e in synced]


def _forever(hold: threading.Event) -> tuple[ScriptedModel, list]:
    """A model that polls a tool for ever; the tool waits on `hold` after its first run."""
    ran: list[int] = []

    def poll(n: int) -> str:
        """Poll once."""
        ran.append(n)
        if len(ran) > 1:
            hold.wait(30)
        return f"pending {n}"

    model = ScriptedModel([calls_reply(tool_call("poll", n=i)) for i in range(1, 50)])
    return model, [tool(poll, kind="side_effect"), ran]


def test_leaving_the_loop_early_cancels_the_run_and_its_log_ends_with_the_stop(tmp_path: Path) -> None:
    hold = threading.Event()
    model, (poll, ran) = _forever(hold)
    log = tmp_path / "run.jsonl"
    s = stream("poll", model=model, tools=[poll], log=log)
    seen = []
    for e in s:
        seen.append(e.event)
        if e.event == "result":
            break  # after the first result: the run is cancelled, not left running
    hold.set()
    assert seen[-1] == "result"
    events = read_log(log).all_events
    assert events[-1].event == "stop" and events[-1].reason == StopReason.CANCELLED
    assert reconcile(log).ok
    with pytest.raises(RuntimeError, match="iterated once"):
        iter(s)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_ctrl_c_while_waiting_ends_the_run_cancelled_and_the_events_go_on_to_that_stop(tmp_path: Path) -> None:
    hold = threading.Event()
    model, (poll, ran) = _forever(hold)
    log = tmp_path / "run.jsonl"
    kinds = []
    for e in stream("poll", model=model, tools=[poll], log=log):
        kinds.append(e.event)
        if e.event == "call" and len(ran) >= 1 and kinds.count("call") == 2:  # the second poll is waiting
            threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            threading.Timer(0.4, hold.set).start()
    assert kinds[-1] == "stop"
    stop = read_log(log).all_events[-1]
    assert stop.reason == StopReason.CANCELLED
    assert len(ran) == 2  # nothing new started after the Ctrl-C
