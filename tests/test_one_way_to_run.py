"""One way to run (issue 32): `run()` is `arun()` on a loop of its own, blocking work goes to one
bounded pool, and the run's wall clock is one scope. The same behaviour through `run()` and `arun()`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from loopfence import Limits, RunLog, ScriptedModel, StopReason, run, tool
from loopfence import arun
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

SRC = str(Path(__file__).resolve().parent.parent / "src")


@pytest.fixture
def release():
    """Set it to let a blocked model or tool return; it is set at teardown whatever happens."""
    event = threading.Event()
    yield event
    event.set()


def _drive(how: str, **kwargs):
    """The run through run() or through arun() on asyncio.run."""
    return run("t", **kwargs) if how == "run" else asyncio.run(arun("t", **kwargs))


# -- the wall clock: one scope, whatever the model is ---------------------------------------------
def _sleepy(kind: str, release: threading.Event, returned: list[str]):
    class SyncSleepy:
        def complete(self, request):
            release.wait(3)  # a model that takes 3 s (released only after the test)
            returned.append("sync")
            return ScriptedModel([text_reply("late")]).complete(request)

    class AsyncSleepy:
        async def acomplete(self, request):
            await asyncio.sleep(3)
            returned.append("async")
            return ScriptedModel([text_reply("late")]).complete(request)

    return SyncSleepy() if kind == "sync" else AsyncSleepy()


@pytest.mark.parametrize("how", ["run", "arun"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_model_taking_3s_stops_max_wall_seconds_well_before(kind, how, release, tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    returned: list[str] = []
    result = _drive(how, model=_sleepy(kind, release, returned), limits=Limits(max_wall_seconds=0.5), log=path)
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS, result.stop
    assert result.final_answer is None
    assert returned == []  # the run ended while the model was still at work: it never waited it out
    assert reconcile(path).ok


# -- the tool timeout: a second scope inside it ---------------------------------------------------
@pytest.mark.parametrize("how", ["run", "arun"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_past_tool_timeout_s_gives_a_timeout_result_and_the_run_goes_on(kind, how, release) -> None:
    def slow_sync() -> str:
        release.wait(5)
        return "late"

    async def slow_async() -> str:
        await asyncio.sleep(5)
        return "late"

    fn = slow_sync if kind == "sync" else slow_async
    log = RunLog(None)
    model = ScriptedModel([calls_reply(tool_call(fn.__name__, "{}")), text_reply("went on")])
    result = _drive(how, model=model, tools=[tool(fn)], limits=Limits(tool_timeout_s=0.3), log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.final_answer == "went on"
    assert [e["error"] for e in log.events if e["event"] == "result"] == ["timeout"]


# -- Ctrl-C: SIGINT to `loopfence run` mid-tool --------------------------------------------------
TOOLS = textwrap.dedent("""
    import os, time
    from pathlib import Path

    def wait_here() -> str:
        \"\"\"Wait.\"\"\"
        Path(os.environ["MARK"]).write_text("started")
        time.sleep(60)
        return "never"
""")


def test_sigint_to_loopfence_run_mid_tool_ends_cancelled_with_a_complete_log(tmp_path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS)
    replies = [calls_reply(tool_call("wait_here", "{}")), text_reply("never")]
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    mark, log = tmp_path / "mark", tmp_path / "r.jsonl"
    env = {**os.environ, "MARK": str(mark), "PYTHONPATH": os.pathsep.join([SRC, str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-m", "loopfence", "run", "t", "--script", "s.jsonl", "--tools",
                             "mytools:wait_here", "--log", str(log)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        give_up = time.monotonic() + 30
        while not mark.exists() and time.monotonic() < give_up and proc.poll() is None:
            time.sleep(0.02)
        assert mark.exists(), proc.communicate(timeout=10)[0]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)  # the tool sleeps 60 s: the run does not wait for it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, out
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["event"] == "stop" and last["reason"] == "cancelled" and "Ctrl-C" in last["detail"]
    assert reconcile(log).ok


# -- run() inside a running event loop -----------------------------------------------------------
def test_run_inside_asyncio_run_returns_the_result_while_a_heartbeat_keeps_ticking(release) -> None:
    """run() called from a coroutine runs on a helper thread (never "event loop is already
    running"); called from a thread the loop hands it to, the loop's own tasks go on meanwhile."""
    tool_started = threading.Event()

    def slowish() -> str:
        tool_started.set()
        release.wait(0.5)
        return "done"

    def go() -> object:
        return run("t", model=ScriptedModel([calls_reply(tool_call("slowish", "{}")), text_reply("ok")]),
                   tools=[tool(slowish)], log=RunLog(None))

    async def main():
        beats: list[bool] = []
        stop = asyncio.Event()

        async def heartbeat():
            while not stop.is_set():
                beats.append(tool_started.is_set() and not release.is_set())
                await asyncio.sleep(0.01)

        beat = asyncio.create_task(heartbeat())
        direct = go()  # in the coroutine itself: blocks this loop while it runs, then returns
        tool_started.clear()
        beats.clear()
        handed = await asyncio.to_thread(go)  # on a thread of the loop's: the heartbeat ticks meanwhile
        stop.set()
        await beat
        return direct, handed, beats.count(True)

    direct, handed, ticks = asyncio.run(main())
    assert direct.final_answer == "ok" and handed.final_answer == "ok"
    assert ticks >= 3, ticks
