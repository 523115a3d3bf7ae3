"""Where the ring runs (_aio, _loop): an asyncio core. Every operation is awaited under one deadline;
sync adapters run on a bounded worker pool and the run goes on without them at the deadline; async
tools and models are cancelled; cancelling the awaiting task ends the run `cancelled` with a complete
log; run() works in a script, a thread and inside a running event loop; Ctrl-C ends the run named.

Timing: the assertions are about order and events (a tool still blocked when the run returned), not
about how many seconds passed, which a busy 2-core machine cannot promise."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import threading
import time

import pytest

from loopfence import Guard, Limits, RunLog, ScriptedModel, StopReason, run, tool
from loopfence._aio import MAX_THREADS, worker_threads
from loopfence import arun
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools._executor import Executor, time_left


def _events(log: RunLog, kind: str) -> list[dict]:
    return [e for e in log.events if e["event"] == kind]


def _read(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.fixture
def release():
    """Set it to let a blocked tool or model return; it is set at teardown whatever happens."""
    event = threading.Event()
    yield event
    event.set()


def _hang_tool(release: threading.Event):
    def hang() -> str:
        release.wait(30)  # far past any timeout here
        return "late"
    return tool(hang)


def _call_then_answer(name: str = "hang") -> ScriptedModel:
    return ScriptedModel([calls_reply(tool_call(name, "{}")), text_reply("ok")])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int, within_s: float = 5.0) -> bool:
    give_up = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < give_up:
        time.sleep(0.02)
    return not _alive(pid)


# -- tool deadlines ------------------------------------------------------------------------------
def test_a_hung_sync_tool_times_out_and_the_run_goes_on_without_it(release) -> None:
    def hang(n: int) -> str:
        if n == 0:
            release.wait(30)
        return f"done {n}"

    log = RunLog(None)
    replies = [calls_reply(tool_call("hang", n=0)), calls_reply(tool_call("hang", n=1)), text_reply("ok")]
    result = run("t", model=ScriptedModel(replies), tools=[tool(hang)], limits=Limits(tool_timeout_s=0.3), log=log)
    assert not release.is_set()  # the run returned while the first call was still blocked
    assert result.stop.reason is StopReason.FINAL_ANSWER
    first, second = (json.loads(e["content"]) if e["content"].startswith("{") else e["content"]
                     for e in _events(log, "result"))
    assert first["error"] == "timeout" and "may still be running" in first["message"]
    assert second == "done 1"
    assert result.ledger.tool_executions == 2


def test_the_abandoned_tool_returning_later_changes_nothing(release) -> None:
    returned = threading.Event()

    def hang() -> str:
        release.wait(30)
        returned.set()
        return "late"

    log = RunLog(None)
    result = run("t", model=_call_then_answer(), tools=[tool(hang)], limits=Limits(tool_timeout_s=0.2), log=log)
    n_events = len(log.events)
    release.set()
    assert returned.wait(5)
    time.sleep(0.2)
    assert len(log.events) == n_events and log.events[-1]["event"] == "stop"
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert [e["error"] for e in _events(log, "result")] == ["timeout"]


def test_a_short_timeout_is_not_held_up_by_a_long_one(release) -> None:
    long_run = threading.Thread(target=run, args=("t",), kwargs=dict(
        model=_call_then_answer(), tools=[_hang_tool(release)], limits=Limits(tool_timeout_s=30),
        log=RunLog(None)))
    long_run.start()
    result = run("t", model=_call_then_answer(), tools=[_hang_tool(release)],
                 limits=Limits(tool_timeout_s=0.2), log=RunLog(None))
    assert long_run.is_alive()  # the other run is still waiting on its 30 s timeout
    assert result.stop.reason is StopReason.FINAL_ANSWER
    release.set()
    long_run.join(10)
    assert not long_run.is_alive()


def test_the_run_clock_bounds_a_hung_tool(release) -> None:
    result = run("t", model=_call_then_answer(), tools=[_hang_tool(release)],
                 limits=Limits(tool_timeout_s=None, max_wall_seconds=0.5), log=RunLog(None))
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS
    assert not release.is_set()


def test_an_async_tools_return_value_is_what_the_model_sees() -> None:
    async def lookup(q: str) -> dict:
        await asyncio.sleep(0)
        return {"answer": q.upper(), "left": time_left() is not None}

    model = ScriptedModel([calls_reply(tool_call("lookup", q="abc")), text_reply("ok")])
    log = RunLog(None)
    result = run("t", model=model, tools=[tool(lookup)], log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert tool(lookup).isolation == "async"
    [res] = _events(log, "result")
    assert json.loads(res["content"]) == {"answer": "ABC", "left": True}
    assert "coroutine" not in json.dumps(model.requests[-1].messages)


def test_an_async_tool_past_its_timeout_is_cancelled_and_the_run_goes_on() -> None:
    seen: list[str] = []

    async def slow(n: int) -> str:
        try:
            await asyncio.sleep(30 if n == 0 else 0)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return f"done {n}"

    log = RunLog(None)
    replies = [calls_reply(tool_call("slow", n=0)), calls_reply(tool_call("slow", n=1)), text_reply("ok")]
    result = run("t", model=ScriptedModel(replies), tools=[tool(slow)], limits=Limits(tool_timeout_s=0.2), log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    first, second = (e["content"] for e in _events(log, "result"))
    assert json.loads(first)["error"] == "timeout" and "cancelled" in json.loads(first)["message"]
    assert second == "done 1"
    assert seen == ["cancelled"]


def test_an_async_tool_raising_timeout_error_itself_is_its_own_error() -> None:
    async def flaky() -> str:
        raise TimeoutError("upstream timed out")

    log = RunLog(None)
    run("t", model=_call_then_answer("flaky"), tools=[tool(flaky)], limits=Limits(tool_timeout_s=30), log=log)
    body = json.loads(_events(log, "result")[0]["content"])
    assert body["error"] == "timeout" and "upstream timed out" in body["message"]


def test_executor_outside_a_run_still_times_out(release) -> None:
    res = Executor().execute(_hang_tool(release), {}, 0.2)
    assert res.error == "timeout"
    assert not release.is_set()


@pytest.mark.parametrize("nested", ["executor", "run"])
def test_code_a_tool_calls_does_not_take_the_outer_tools_deadline(nested, release) -> None:
    """What a tool calls in turn (a tool run through an Executor, or a whole inner run, each with a
    30 s timeout) has deadlines of its own: the outer 0.5 s timeout still holds."""
    def inner_noop() -> str:
        return "inner"

    def outer() -> str:
        if nested == "executor":
            assert Executor().execute(tool(inner_noop), {}, 30).content == "inner"
        else:
            inner = run("inner", model=_call_then_answer("inner_noop"), tools=[tool(inner_noop)],
                        limits=Limits(tool_timeout_s=30), log=RunLog(None))
            assert inner.final_answer == "ok"
        release.wait(30)
        return "outer"

    log = RunLog(None)
    result = run("t", model=_call_then_answer("outer"), tools=[tool(outer)], limits=Limits(tool_timeout_s=0.5), log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert [e["error"] for e in _events(log, "result")] == ["timeout"]
    assert not release.is_set()


# -- model deadlines -----------------------------------------------------------------------------
def test_a_sync_model_past_max_wall_seconds_is_left_behind(release, tmp_path) -> None:
    returned = threading.Event()

    class Sleepy:
        def complete(self, request):
            release.wait(3)  # a model that takes 3 s
            returned.set()
            return ScriptedModel([text_reply("late")]).complete(request)

    path = tmp_path / "run.jsonl"
    result = run("t", model=Sleepy(), limits=Limits(max_wall_seconds=0.5), log=path)
    assert not returned.is_set()  # the run ended while the model was still sleeping
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS
    assert "went on without it" in result.stop.detail
    assert _read(path)[-1]["event"] == "stop" and reconcile(path).ok


def test_an_async_model_past_max_wall_seconds_is_cancelled(tmp_path) -> None:
    seen: list[str] = []

    class Sleepy:
        async def acomplete(self, request):
            try:
                await asyncio.sleep(3)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return ScriptedModel([text_reply("late")]).complete(request)

        def complete(self, request):
            raise AssertionError("the async form is used")

    path = tmp_path / "run.jsonl"
    result = asyncio.run(arun("t", model=Sleepy(), limits=Limits(max_wall_seconds=0.5), log=path))
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS
    assert seen == ["cancelled"]  # cancelled mid-sleep: the run did not wait the 3 s out
    assert reconcile(path).ok


def test_a_subclass_overriding_only_complete_keeps_its_override() -> None:
    calls: list[str] = []

    class Base:
        def complete(self, request):
            return ScriptedModel([text_reply("base")]).complete(request)

        async def acomplete(self, request):
            return self.complete(request)

    class Mine(Base):
        def complete(self, request):
            calls.append("mine")
            return ScriptedModel([text_reply("mine")]).complete(request)

    assert run("t", model=Mine(), log=RunLog(None)).final_answer == "mine" and calls == ["mine"]


# -- cancellation --------------------------------------------------------------------------------
def test_cancelling_the_awaiting_task_after_the_first_of_ten_slow_calls(tmp_path) -> None:
    ran: list[int] = []
    first_done = threading.Event()

    def slow(n: int) -> str:
        ran.append(n)
        if n == 0:
            first_done.set()
            return "first"
        time.sleep(1)
        return f"done {n}"

    replies = [calls_reply(*(tool_call("slow", n=i, id=f"c{i}") for i in range(10))), text_reply("ok")]
    path = tmp_path / "run.jsonl"

    async def main() -> None:
        task = asyncio.create_task(arun("t", model=ScriptedModel(replies), tools=[tool(slow)], log=path))
        while not first_done.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(ran) <= 2
    events = _read(path)
    assert events[-1]["event"] == "stop" and events[-1]["reason"] == "cancelled"
    results = [e for e in events if e["event"] == "result"]
    assert len(results) == 10  # every requested call has exactly one result
    assert results[0]["content"] == "first"
    assert all(r["error"] in ("outcome_unknown", "not_executed") for r in results[1:])
    assert sum(r["error"] == "outcome_unknown" for r in results) <= 1
    assert reconcile(path).ok


def test_cancelling_during_a_process_tool_kills_its_tree(tmp_path) -> None:
    pid_file = tmp_path / "pids"

    def stubborn() -> str:
        import subprocess

        child = subprocess.Popen(["sleep", "60"])  # a grandchild in the same group
        pid_file.write_text(f"{os.getpid()} {child.pid}")
        time.sleep(60)
        return "never"

    path = tmp_path / "run.jsonl"

    async def main() -> None:
        task = asyncio.create_task(arun("t", model=_call_then_answer("stubborn"),
                                        tools=[tool(stubborn, isolation="process")],
                                        limits=Limits(tool_timeout_s=None), log=path))
        while not pid_file.exists() or len(pid_file.read_text().split()) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    for pid in map(int, pid_file.read_text().split()):
        assert _gone(pid), f"process {pid} of the cancelled tool outlived the run"
    events = _read(path)
    assert events[-1]["reason"] == "cancelled"
    assert [e["error"] for e in events if e["event"] == "result"] == ["outcome_unknown"]
    assert reconcile(path).ok


def test_a_timeout_around_arun_ends_it_cancelled_and_raises_timeout_error(release, tmp_path) -> None:
    path = tmp_path / "run.jsonl"

    async def main() -> None:
        async with asyncio.timeout(0.3):
            await arun("t", model=_call_then_answer(), tools=[_hang_tool(release)],
                       limits=Limits(tool_timeout_s=None), log=path)

    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert _read(path)[-1]["reason"] == "cancelled" and reconcile(path).ok


def test_ctrl_c_during_a_model_call_ends_the_run_cancelled_with_a_complete_log(release) -> None:
    class Interrupting(ScriptedModel):
        def complete(self, request):
            os.kill(os.getpid(), signal.SIGINT)
            release.wait(30)  # the run ends long before this returns
            return super().complete(request)

    log = RunLog(None)
    result = run("t", model=Interrupting([text_reply("never")]), log=log)
    assert not release.is_set()
    assert result.stop.reason is StopReason.CANCELLED and "Ctrl-C" in result.stop.detail
    assert log.events[-1]["event"] == "stop" and log.events[-1]["reason"] == "cancelled"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_ctrl_c_before_a_call_starts_stops_before_it() -> None:
    """SIGINT while the ring waits on a decision before a call (a guard's awaitable verdict): the
    call it never started is not_executed."""
    from loopfence._guards import Guard

    class Pressing(Guard):
        def before_execution(self, s, c, reuse):  # noqa: ANN001, ANN201
            async def decide() -> None:
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.sleep(30)  # the Ctrl-C cancels this wait
            return decide()

    ran: list[str] = []

    def work() -> str:
        ran.append("x")
        return "x"

    log = RunLog(None)
    result = run("t", model=_call_then_answer("work"), tools=[tool(work)], guards=[Pressing()], log=log)
    assert result.stop.reason is StopReason.CANCELLED
    assert ran == []
    assert [e["error"] for e in _events(log, "result")] == ["not_executed"]


def test_keyboard_interrupt_raised_by_a_tool_cancels_the_run() -> None:
    def boom() -> str:
        raise KeyboardInterrupt

    log = RunLog(None)
    result = run("t", model=_call_then_answer("boom"), tools=[tool(boom)], log=log)
    assert result.stop.reason is StopReason.CANCELLED
    assert [e["error"] for e in _events(log, "result")] == ["outcome_unknown"]


def test_ctrl_c_during_a_process_tool_kills_the_child(tmp_path) -> None:
    pid_file = tmp_path / "pid"

    def stubborn() -> str:
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)
        return "never"

    def interrupt_when_started() -> None:
        give_up = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < give_up:
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    result = run("t", model=_call_then_answer("stubborn"), tools=[tool(stubborn, isolation="process")],
                 limits=Limits(tool_timeout_s=None), log=RunLog(None))
    assert result.stop.reason is StopReason.CANCELLED
    assert _gone(int(pid_file.read_text())), "the process tool outlived the cancelled run"


# -- where run() works ---------------------------------------------------------------------------
def test_run_inside_a_running_event_loop_returns_the_result() -> None:
    async def main():
        return run("t", model=_call_then_answer("noop"), tools=[tool(lambda: "x", name="noop")], log=RunLog(None))

    result = asyncio.run(main())
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.final_answer == "ok"


def test_a_heartbeat_on_the_loop_keeps_ticking_while_arun_runs(release) -> None:
    beats: list[str] = []
    tool_started = threading.Event()

    def slowish() -> str:
        tool_started.set()
        release.wait(0.5)
        return "done"

    async def main():
        stop = asyncio.Event()

        async def heartbeat():
            while not stop.is_set():
                beats.append("tick" if tool_started.is_set() and not release.is_set() else "other")
                await asyncio.sleep(0.01)

        beat = asyncio.create_task(heartbeat())
        result = await arun("t", model=_call_then_answer("slowish"), tools=[tool(slowish)], log=RunLog(None))
        stop.set()
        await beat
        return result

    result = asyncio.run(main())
    assert result.final_answer == "ok"
    assert beats.count("tick") >= 3  # the loop ran other tasks while the tool was running


def test_run_from_a_thread_works() -> None:
    box: dict = {}

    def go():
        box["r"] = run("t", model=ScriptedModel([text_reply("hi")]), log=RunLog(None))

    t = threading.Thread(target=go)
    t.start()
    t.join(30)
    assert box["r"].final_answer == "hi"


def test_worker_threads_are_bounded_and_reused() -> None:
    def noop(n: int) -> str:
        return str(n)

    for i in range(30):
        run("t", model=ScriptedModel([calls_reply(tool_call("noop", n=i)), text_reply("ok")]),
            tools=[tool(noop)], log=RunLog(None))
    before, threads = worker_threads(), _os_threads()
    for i in range(30):
        run("t", model=ScriptedModel([calls_reply(tool_call("noop", n=i)), text_reply("ok")]),
            tools=[tool(noop)], log=RunLog(None))
    assert worker_threads() == before <= MAX_THREADS  # idle workers took the new jobs
    give_up = time.monotonic() + 10  # a runner that handed over its result may still be returning
    while _os_threads() > threads and time.monotonic() < give_up:
        time.sleep(0.01)
    assert _os_threads() <= threads  # each run's runner thread ended with it


def _os_threads() -> int:
    """Every thread of this process, those started with _thread included."""
    return len(os.listdir("/proc/self/task"))


def test_a_sync_tool_runs_off_the_loop_under_run_and_arun_alike() -> None:
    """One way to run: run() drives arun() on a loop of its own on the caller's thread, and a sync
    tool goes to the worker pool under both, so the loop is never blocked by it."""
    seen: dict[str, int] = {}

    class Where(ScriptedModel):
        async def acomplete(self, request):
            seen.setdefault("ring", threading.get_ident())
            return self.complete(request)

    def where() -> str:
        seen["tool"] = threading.get_ident()
        return "x"

    run("t", model=Where([calls_reply(tool_call("where", "{}")), text_reply("ok")]), tools=[tool(where)],
        log=RunLog(None))
    assert seen["ring"] == threading.get_ident() != seen["tool"]
    seen.clear()
    asyncio.run(arun("t", model=Where([calls_reply(tool_call("where", "{}")), text_reply("ok")]),
                     tools=[tool(where)], log=RunLog(None)))
    assert seen["ring"] == threading.get_ident() != seen["tool"]


def test_a_sync_tool_may_run_its_own_event_loop() -> None:
    """On its worker no loop is running: asyncio.run() inside works."""
    async def fetch() -> str:
        await asyncio.sleep(0)
        return "fetched"

    def wrapper() -> str:
        return asyncio.run(fetch())

    log = RunLog(None)
    result = run("t", model=_call_then_answer("wrapper"), tools=[tool(wrapper)], log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert [e["content"] for e in _events(log, "result")] == ["fetched"]


def test_cpu_seconds_of_the_run_are_reported() -> None:
    def spin() -> str:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        return "spun"

    result = run("t", model=_call_then_answer("spin"), tools=[tool(spin)], log=RunLog(None))
    assert result.cpu_s is not None and result.cpu_s >= 0.05


def test_the_cpu_seconds_leave_out_what_the_run_awaited() -> None:
    """An inline async tool or a guard's decision that waits is not the run's CPU."""
    async def wait_inline() -> str:
        await asyncio.sleep(0.5)
        return "ok"

    class SlowPolicy(Guard):
        def before_execution(self, s, c, reuse):  # noqa: ANN001, ANN201
            async def ask() -> None:
                await asyncio.sleep(0.5)
            return ask()

    def ok() -> str:
        return "ok"

    for tools, guards, name in (([tool(wait_inline, isolation="inline")], [], "wait_inline"),
                                ([tool(ok)], [SlowPolicy()], "ok")):
        result = run("t", model=_call_then_answer(name), tools=tools, guards=guards, log=RunLog(None))
        assert result.final_answer == "ok"
        assert result.cpu_s is not None and result.cpu_s < 0.25, (name, result.cpu_s)  # 0.5 s of waiting


def test_a_sub_run_in_a_tool_the_run_went_on_without_finishes() -> None:
    """A sync tool cut at its timeout keeps running on its worker and starts a sub-run
    (asyncio.run(arun(...)) over a sync-only model) while the main run, which went on, is mid-step:
    both finish."""
    done = threading.Event()
    sub: dict[str, object] = {}

    class SyncOnly:
        def describe(self) -> dict:
            return {"kind": "sync-only"}

        def complete(self, request):  # noqa: ANN001, ANN201
            return ScriptedModel([text_reply("sub done")]).complete(request)

    def subagent(q: str) -> str:
        time.sleep(0.4)  # past tool_timeout_s: the main run goes on without it
        try:
            r = asyncio.run(arun("sub", model=SyncOnly()))
            sub["result"] = (r.stop.reason, r.final_answer)
        finally:
            done.set()
        return "x"

    class Busy(ScriptedModel):
        async def acomplete(self, request):  # noqa: ANN001, ANN201
            if request.step == 2:  # mid-step on the new runner until the sub-run is over
                end = time.monotonic() + 10  # a hang guard, not a bound on time
                while not done.wait(0) and time.monotonic() < end:
                    sum(range(1000))
            return await super().acomplete(request)

    result = run("main", model=Busy([calls_reply(tool_call("subagent", q="a")), text_reply("main done")]),
                 tools=[tool(subagent)], limits=Limits(tool_timeout_s=0.2), log=RunLog(None))
    assert result.final_answer == "main done"
    assert sub["result"] == (StopReason.FINAL_ANSWER, "sub done")


def test_the_callers_context_vars_reach_the_model_and_tools() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")
    seen: list[str] = []

    class Seeing(ScriptedModel):
        def complete(self, request):
            seen.append(request_id.get())
            return super().complete(request)

    def where() -> str:
        seen.append(request_id.get())
        return "x"

    request_id.set("req-42")
    run("t", model=Seeing([calls_reply(tool_call("where", "{}")), text_reply("ok")]), tools=[tool(where)],
        log=RunLog(None))
    assert seen == ["req-42", "req-42", "req-42"]
