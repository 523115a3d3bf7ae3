"""Where the ring runs (_driver): tools on the ring's own thread, timeouts by one watchdog that hands
the run to a fresh thread, Ctrl-C thrown into the ring wherever it is, runner threads reused."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from loopfence import Limits, RunLog, ScriptedModel, StopReason, run, tool
from loopfence import _driver
from loopfence._driver import Op, Slot, interrupted, run_to_end
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools._executor import Executor


def _events(log: RunLog, kind: str) -> list[dict]:
    return [e for e in log.events if e["event"] == kind]


@pytest.fixture
def release():
    """Set it to let `hang` return; it is set at teardown whatever happens."""
    event = threading.Event()
    yield event
    event.set()


def _hang_tool(release: threading.Event):
    def hang() -> str:
        release.wait(30)  # far past any timeout here: only the watchdog can answer the ring
        return "late"
    return tool(hang)


def _hang_then_answer() -> ScriptedModel:
    return ScriptedModel([calls_reply(tool_call("hang", "{}")), text_reply("ok")])


def test_a_hung_tool_times_out_and_the_run_goes_on_without_it() -> None:
    release = threading.Event()
    threads: list[int] = []

    def hang(n: int) -> str:
        threads.append(threading.get_ident())
        if n == 0:
            release.wait(30)  # far past the timeout: only the watchdog can answer the ring
        return f"done {n}"

    log = RunLog(None)
    replies = [calls_reply(tool_call("hang", n=0)), calls_reply(tool_call("hang", n=1)), text_reply("ok")]
    started = time.monotonic()
    result = run("t", model=ScriptedModel(replies), tools=[tool(hang)],
                 limits=Limits(tool_timeout_s=0.3), log=log)
    waited = time.monotonic() - started
    release.set()
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert waited < 10  # the caller got control back long before the tool returned
    first, second = (json.loads(e["content"]) if e["content"].startswith("{") else e["content"]
                     for e in _events(log, "result"))
    assert first["error"] == "timeout" and "may still be running" in first["message"]
    assert second == "done 1"
    assert threads[0] != threads[1]  # the abandoned thread was not the one that went on
    assert result.ledger.tool_executions == 2


def test_the_abandoned_tool_returning_later_changes_nothing() -> None:
    release = threading.Event()
    returned = threading.Event()

    def hang() -> str:
        release.wait(30)
        returned.set()
        return "late"

    log = RunLog(None)
    result = run("t", model=ScriptedModel([calls_reply(tool_call("hang", "{}")), text_reply("ok")]),
                 tools=[tool(hang)], limits=Limits(tool_timeout_s=0.2), log=log)
    n_events = len(log.events)
    release.set()
    assert returned.wait(5)
    time.sleep(0.5)  # let the old thread try to claim the finished call
    assert len(log.events) == n_events and log.events[-1]["event"] == "stop"
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert [e["error"] for e in _events(log, "result")] == ["timeout"]


def test_a_short_timeout_is_not_held_up_by_a_long_one_already_armed(release) -> None:
    """The watchdog sleeps until the earliest deadline: a run armed with 30 s must not delay another
    run's 0.2 s timeout."""
    long_run = threading.Thread(target=run, args=("t",), kwargs=dict(
        model=_hang_then_answer(), tools=[_hang_tool(release)], limits=Limits(tool_timeout_s=30),
        log=RunLog(None)))
    long_run.start()
    time.sleep(0.2)  # the long deadline is armed first
    started = time.monotonic()
    result = run("t", model=_hang_then_answer(), tools=[_hang_tool(release)],
                 limits=Limits(tool_timeout_s=0.2), log=RunLog(None))
    assert time.monotonic() - started < 10
    assert result.stop.reason is StopReason.FINAL_ANSWER
    release.set()
    long_run.join(10)
    assert not long_run.is_alive()


def test_the_run_clock_bounds_a_hung_tool(release) -> None:
    result = run("t", model=_hang_then_answer(), tools=[_hang_tool(release)],
                 limits=Limits(tool_timeout_s=None, max_wall_seconds=0.5), log=RunLog(None))
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS


def test_ctrl_c_during_a_model_call_ends_the_run_cancelled_with_a_complete_log() -> None:
    class Interrupting(ScriptedModel):
        def complete(self, request):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the caller's thread takes over long before this returns
            return super().complete(request)

    log = RunLog(None)
    started = time.monotonic()
    result = run("t", model=Interrupting([text_reply("never")]), log=log)
    assert time.monotonic() - started < 4
    assert result.stop.reason is StopReason.CANCELLED
    assert log.events[-1]["event"] == "stop" and log.events[-1]["reason"] == "cancelled"


def test_ctrl_c_between_operations_is_thrown_in_at_the_next_one() -> None:
    """SIGINT while the ring is in its own logic (here a guard): nothing to take over, so the
    ring stops before its next operation; the call it never started is answered not_executed."""
    from loopfence._guards import Guard

    class Slow(Guard):
        def on_reply(self, s, calls) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            give_up = time.monotonic() + 30
            while not interrupted() and time.monotonic() < give_up:  # the caller has seen it
                time.sleep(0.01)

    ran: list[str] = []

    def work() -> str:
        ran.append("x")
        return "x"

    log = RunLog(None)
    result = run("t", model=ScriptedModel([calls_reply(tool_call("work", "{}")), text_reply("ok")]),
                 tools=[tool(work)], guards=[Slow()], log=log)
    assert result.stop.reason is StopReason.CANCELLED
    assert ran == []
    assert [e["error"] for e in _events(log, "result")] == ["not_executed"]


def test_runner_threads_are_reused(monkeypatch) -> None:
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self):
        started.append(self.name)
        real_start(self)

    def noop(n: int) -> str:
        return str(n)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for i in range(30):
        run("t", model=ScriptedModel([calls_reply(tool_call("noop", n=i)), text_reply("ok")]),
            tools=[tool(noop)], log=RunLog(None))
    assert started.count("loopfence-ring") <= 1, started  # one at most, if the pool was empty
    assert not [name for name in started if name in ("loopfence-tool", "loopfence-http")], started


def test_cpu_seconds_of_the_ring_are_reported() -> None:
    def spin() -> str:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        return "spun"

    result = run("t", model=ScriptedModel([calls_reply(tool_call("spin", "{}")), text_reply("ok")]),
                 tools=[tool(spin)], log=RunLog(None))
    assert result.cpu_s is not None and result.cpu_s >= 0.05


def test_executor_outside_a_run_still_times_out_by_hand_off(release) -> None:
    started = time.monotonic()
    res = Executor().execute(_hang_tool(release), {}, 0.2)
    assert time.monotonic() - started < 10
    assert res.error == "timeout"


def test_a_slot_is_claimed_exactly_once_under_contention() -> None:
    for _ in range(50):
        slot = Slot()
        wins: list[bool] = []
        go = threading.Barrier(4)

        def race() -> None:
            go.wait()
            wins.append(slot.claim())

        threads = [threading.Thread(target=race) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(wins) == [False, False, False, True]


def test_arming_outside_a_driven_run_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="outside a driven run"):
        Slot().arm(time.monotonic() + 1, lambda: None)


def test_an_error_escaping_the_ring_reaches_the_caller() -> None:
    class Boom(Op):
        def run(self):
            return 1

    def gen():
        got = yield Boom()
        raise SystemExit(f"got {got}")

    with pytest.raises(SystemExit, match="got 1"):
        run_to_end(gen())


@pytest.mark.parametrize("nested", ["executor", "run"])
def test_code_a_tool_calls_does_not_take_the_outer_tools_deadline(nested) -> None:
    """The slot of the call in flight is handed out once: what the tool calls in turn (a tool run
    through an Executor on the same thread, or a whole inner run, each with a 30 s timeout) cannot
    re-arm or disarm the outer 0.5 s timeout."""
    def inner_noop() -> str:
        return "inner"

    def outer() -> str:
        if nested == "executor":
            assert Executor().execute(tool(inner_noop), {}, 30).content == "inner"
        else:
            inner = run("inner", model=_hang_then_answer_with("inner_noop"), tools=[tool(inner_noop)],
                        limits=Limits(tool_timeout_s=30), log=RunLog(None))
            assert inner.final_answer == "ok"
        time.sleep(10)  # far past the 0.5 s timeout
        return "outer"

    log = RunLog(None)
    started = time.monotonic()
    result = run("t", model=_hang_then_answer_with("outer"), tools=[tool(outer)],
                 limits=Limits(tool_timeout_s=0.5), log=log)
    assert time.monotonic() - started < 6
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert [e["error"] for e in _events(log, "result")] == ["timeout"]


def _hang_then_answer_with(name: str) -> ScriptedModel:
    return ScriptedModel([calls_reply(tool_call(name, "{}")), text_reply("ok")])


def test_keyboard_interrupt_raised_by_a_timed_tool_cancels_the_run() -> None:
    def boom() -> str:
        raise KeyboardInterrupt

    log = RunLog(None)
    result = run("t", model=_hang_then_answer_with("boom"), tools=[tool(boom)], log=log)
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
    result = run("t", model=_hang_then_answer_with("stubborn"), tools=[tool(stubborn, isolation="process")],
                 limits=Limits(tool_timeout_s=None), log=RunLog(None))
    assert result.stop.reason is StopReason.CANCELLED
    pid = int(pid_file.read_text())
    give_up = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < give_up:
        time.sleep(0.02)
    assert not _alive(pid), f"the process tool {pid} outlived the cancelled run"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def test_the_callers_context_vars_reach_the_model_and_tools() -> None:
    import contextvars

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


def test_a_run_that_cannot_go_on_after_a_timeout_raises_and_the_watchdog_survives(monkeypatch, release):
    real_submit = _driver._submit

    def no_thread_for_the_rest(ctl, value, exc):
        if value is not None:  # the watchdog handing on the timeout result
            raise RuntimeError("can't start new thread")
        real_submit(ctl, value, exc)

    monkeypatch.setattr(_driver, "_submit", no_thread_for_the_rest)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        run("t", model=_hang_then_answer(), tools=[_hang_tool(release)], limits=Limits(tool_timeout_s=0.2),
            log=RunLog(None))
    monkeypatch.setattr(_driver, "_submit", real_submit)
    result = run("t", model=_hang_then_answer(), tools=[_hang_tool(release)],
                 limits=Limits(tool_timeout_s=0.2), log=RunLog(None))
    assert result.stop.reason is StopReason.FINAL_ANSWER  # the watchdog still answers timeouts
