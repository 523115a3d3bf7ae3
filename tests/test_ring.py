"""Issue 2 must-shows: the seeds' fixtures through the real ring, and every stop in the vocabulary."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from loopfence import Limits, Policy, ScriptedModel, StopReason, Verdict, run, tool, workspace_tools
from loopfence._stops import StopError
from loopfence.testing import calls_reply, text_reply, tool_call


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "app").mkdir(parents=True)
    (root / "app" / "config.py").write_text("DEBUG = True\n")
    (root / "src").mkdir()
    return root


def _go(ws: Path, replies, tools=None, **kw):
    log = ws.parent / "run.jsonl"
    model = ScriptedModel(replies)
    result = run("task", model=model, tools=tools if tools is not None else workspace_tools(ws),
                 log=log, **kw)
    events = read_log(log)
    assert events[-1]["event"] == "stop" and events[-1]["reason"] == str(result.stop.reason)
    return result, events, model


SEED_000 = [calls_reply(tool_call("read_file", '{"path":"src/missing.ts"}')),
            calls_reply(tool_call("read_file", '{"path":"src/missing.ts"}')),
            calls_reply(tool_call("read_file", '{ "path": "src/missing.ts" }'))]


def test_seed_000_defaults_stop_no_progress_on_turn_2(ws):
    result, events, _ = _go(ws, SEED_000)
    assert result.stop.reason is StopReason.NO_PROGRESS
    assert result.ledger.model_requests == 2
    assert result.ledger.tool_executions == 1
    assert result.ledger.reused == 1


def test_seed_000_without_no_progress_stops_repeated_call_on_third_request(ws):
    result, events, _ = _go(ws, SEED_000, limits=Limits(no_progress=False))
    assert result.stop.reason is StopReason.REPEATED_CALL
    assert result.ledger.model_requests == 3
    assert result.ledger.tool_executions == 1
    executed = [e for e in events if e["event"] == "result" and e["decision"] == "executed"]
    assert len(executed) == 1


SEED_001 = [calls_reply(tool_call("read_file", '{"path":"app/config.py"}')),
            calls_reply(tool_call("read_file", '{"path":"app/config.py","encoding":"utf-8"}'),
                        tool_call("read_file", '{"encoding":"utf-8","path":"app/config.py"}'))]


def test_seed_001_exactly_one_execution_then_no_progress(ws):
    calls = []

    def read_file(path: str, encoding: str = "utf-8") -> str:
        calls.append((path, encoding))
        return (ws / path).read_text(encoding=encoding)

    result, _, _ = _go(ws, SEED_001, tools=[tool(read_file, kind="read_only")])
    assert calls == [("app/config.py", "utf-8")]
    assert result.stop.reason is StopReason.NO_PROGRESS
    assert result.ledger.model_requests == 2
    assert result.ledger.tool_calls == 3 and result.ledger.reused == 2


def test_a_reply_with_three_fresh_calls_counts_three_executions(ws):
    (ws / "b.txt").write_text("b")
    (ws / "c.txt").write_text("c")
    reply = calls_reply(tool_call("read_file", path="app/config.py"), tool_call("read_file", path="b.txt"),
                        tool_call("read_file", path="c.txt"))
    result, _, _ = _go(ws, [reply, text_reply("done")])
    assert result.ledger.tool_executions == 3
    assert result.stop.reason is StopReason.FINAL_ANSWER


class RunTestsResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    stdout: str
    exit_code: int


def _run_tests_tool(extra: bool = False, counter: list | None = None):
    def run_tests(cmd: str) -> dict:
        if counter is not None:
            counter.append(cmd)
        out = {"ok": True, "stdout": f"1 passed ({cmd})", "exit_code": 0}
        if extra:
            out["hint"] = "retry"
        return out

    return tool(run_tests, result_model=RunTestsResult)


def test_seed_002_retry_storm_stops_repeated_call(ws):
    counter: list = []
    storm = [calls_reply(tool_call("run_tests", cmd="pytest -q"))]
    result, _, _ = _go(ws, storm, tools=[_run_tests_tool(counter=counter)], limits=Limits(max_repeats=2))
    assert result.stop.reason is StopReason.REPEATED_CALL
    assert len(counter) == 1  # the second request stopped before it ran again


def test_seed_002_extra_result_key_is_schema_mismatch(ws):
    replies = [calls_reply(tool_call("run_tests", cmd="pytest -q")), text_reply("diff")]
    result, _, _ = _go(ws, replies, tools=[_run_tests_tool(extra=True)])
    assert result.stop.reason is StopReason.SCHEMA_MISMATCH
    assert "hint" in result.stop.detail
    assert result.verdict is Verdict.KILL


def test_seed_002_fresh_arguments_stop_at_max_steps(ws):
    replies = [calls_reply(tool_call("run_tests", cmd=f"pytest -q {n}")) for n in range(10)]
    result, _, model = _go(ws, replies, tools=[_run_tests_tool()], limits=Limits(max_steps=4))
    assert result.stop.reason is StopReason.MAX_STEPS
    assert result.ledger.model_requests == 4 and model.served == 4


def test_seed_002_call_then_answer_ships(ws):
    replies = [calls_reply(tool_call("run_tests", cmd="pytest -q")), text_reply("--- a/x.py\n+++ b/x.py\n")]
    result, _, _ = _go(ws, replies, tools=[_run_tests_tool()])
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.verdict is Verdict.SHIP
    assert result.final_answer.startswith("--- a/x.py")


def test_seed_002_empty_answer_kills(ws):
    result, _, _ = _go(ws, [text_reply("   ")])
    assert result.stop.reason is StopReason.EMPTY_ANSWER and result.verdict is Verdict.KILL


def test_budget_precondition_max_tool_calls_two_of_three_execute(ws):
    ran: list = []

    def ping(n: int) -> str:
        ran.append(n)
        return f"pong {n}"

    reply = calls_reply(*(tool_call("ping", n=i) for i in range(3)))
    result, events, _ = _go(ws, [reply], tools=[tool(ping)], limits=Limits(max_tool_calls=2))
    assert ran == [0, 1]
    assert result.stop.reason is StopReason.MAX_TOOL_CALLS
    assert result.ledger.tool_executions == 2 and result.ledger.refused == 1
    results = [e for e in events if e["event"] == "result"]
    assert len(results) == 3  # the refused call still gets exactly one result


def test_budget_precondition_prompt_tokens_request_never_sent(ws):
    result, events, model = _go(ws, [text_reply("hi")], limits=Limits(max_prompt_tokens=10))
    assert result.stop.reason is StopReason.MAX_PROMPT_TOKENS
    assert model.served == 0
    assert not [e for e in events if e["event"] == "request"]
    assert "max_prompt_tokens=10" in result.stop.detail


def test_prompt_budget_counts_reported_usage_before_the_next_request(ws):
    replies = [calls_reply(tool_call("read_file", path="app/config.py"), usage=(900, 10)), text_reply("x")]
    result, _, model = _go(ws, replies, limits=Limits(max_prompt_tokens=1000))
    assert result.stop.reason is StopReason.MAX_PROMPT_TOKENS
    assert model.served == 1


def test_completion_budget_reserves_max_tokens(ws):
    result, _, model = _go(ws, [text_reply("hi")], params={"max_tokens": 500},
                           limits=Limits(max_completion_tokens=400))
    assert result.stop.reason is StopReason.MAX_COMPLETION_TOKENS
    assert model.served == 0


def test_completion_budget_cumulative(ws):
    replies = [calls_reply(tool_call("read_file", path=f"f{i}"), usage=(10, 300)) for i in range(5)]
    result, _, model = _go(ws, replies, limits=Limits(max_completion_tokens=700))
    assert result.stop.reason is StopReason.MAX_COMPLETION_TOKENS
    assert result.ledger.completion_tokens == 900 and model.served == 3


def test_wall_clock_cuts_a_slow_tool_and_stops(ws):
    def slow(n: int) -> str:
        time.sleep(0.3)
        return f"done {n}"

    replies = [calls_reply(tool_call("slow", n=i)) for i in range(50)]
    result, _, _ = _go(ws, replies, tools=[tool(slow)], limits=Limits(max_wall_seconds=0.5))
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS
    assert result.ledger.tool_executions <= 3


def test_tool_timeout_never_longer_than_what_is_left(ws):
    def sleepy() -> str:
        time.sleep(5)
        return "late"

    start = time.monotonic()
    result, events, _ = _go(ws, [calls_reply(tool_call("sleepy", "{}"))], tools=[tool(sleepy)],
                            limits=Limits(max_wall_seconds=0.4, tool_timeout_s=30))
    assert time.monotonic() - start < 3
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS
    res = next(e for e in events if e["event"] == "result")
    assert res["error"] == "timeout" and not res["ok"]


def test_repeated_result_streak_stops(ws):
    def ok_forever(n: int = 0) -> str:
        return "ok"

    replies = [calls_reply(tool_call("ok_forever", n=i)) for i in range(20)]
    result, _, _ = _go(ws, replies, tools=[tool(ok_forever)])
    assert result.stop.reason is StopReason.REPEATED_RESULT
    assert result.ledger.tool_executions == 6  # max_identical_results=5: the sixth in a row stops


def test_poll_tools_are_exempt_from_repetition(ws):
    states = iter(["running"] * 7 + ["done"])

    def poll_job(job: str) -> str:
        return next(states)

    replies = [calls_reply(tool_call("poll_job", job="j1")) for _ in range(8)] + [text_reply("job done")]
    result, _, _ = _go(ws, replies, tools=[tool(poll_job, kind="poll")])
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert result.ledger.tool_executions == 8


def test_unknown_tool_fails_closed(ws):
    reply = calls_reply(tool_call("read_file", path="app/config.py"), tool_call("readFile", path="a"))
    result, events, _ = _go(ws, [reply])
    assert result.stop.reason is StopReason.UNKNOWN_TOOL
    assert result.ledger.tool_executions == 0  # a reply with any violation runs none of its calls
    decisions = {e["name"]: e["decision"] for e in events if e["event"] == "result"}
    assert decisions == {"readFile": "rejected", "read_file": "refused"}


def test_invalid_json_arguments(ws):
    result, _, _ = _go(ws, [calls_reply(tool_call("read_file", '{"path": "src/'))])
    assert result.stop.reason is StopReason.INVALID_JSON


@pytest.mark.parametrize("raw", ['["a.py"]', '{"path": 3}', '{"path": "a", "mode": "x"}', '{}'])
def test_schema_violations(ws, raw):
    result, _, _ = _go(ws, [calls_reply(tool_call("read_file", raw))])
    assert result.stop.reason is StopReason.SCHEMA_MISMATCH


def test_truncated_reply_is_incomplete_even_without_calls(ws):
    result, _, _ = _go(ws, [text_reply("The answer is", finish_reason="length")])
    assert result.stop.reason is StopReason.INCOMPLETE_STREAM
    assert result.final_answer is None and result.partial_text == "The answer is"


@pytest.mark.parametrize("reason", ["length", "content_filter"])
def test_a_call_in_a_cut_or_filtered_reply_never_runs(ws, reason):
    result, _, _ = _go(ws, [calls_reply(tool_call("read_file", path="app/config.py"), finish_reason=reason)])
    assert result.stop.reason is StopReason.INCOMPLETE_STREAM and reason in result.stop.detail
    assert result.ledger.tool_executions == 0


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_completion_tokens_equal_to_the_requested_cap_count_as_truncated(ws, param):
    reply = calls_reply(tool_call("read_file", path="app/config.py"), usage=(50, 64))
    result, _, _ = _go(ws, [reply], params={param: 64})
    assert result.stop.reason is StopReason.INCOMPLETE_STREAM
    assert result.ledger.tool_executions == 0


def test_feedback_policy_tells_the_model_then_stops_on_the_streak(ws):
    bad = calls_reply(tool_call("read_file", '{"path": '))
    result, events, _ = _go(ws, [bad], policy=Policy(on_bad_call="feedback", max_bad_calls=2))
    assert result.stop.reason is StopReason.INVALID_JSON
    assert result.ledger.model_requests == 2
    first = json.loads(next(e for e in events if e["event"] == "result")["content"])
    assert first["error"] == "invalid_json" and first["ok"] is False


def test_feedback_policy_recovers_with_a_fixed_call(ws):
    replies = [calls_reply(tool_call("read_file", '{"path": 3}')),
               calls_reply(tool_call("read_file", path="app/config.py")), text_reply("DEBUG is on")]
    result, _, _ = _go(ws, replies, policy=Policy(on_bad_call="feedback"))
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert result.ledger.rejected == 1 and result.ledger.tool_executions == 1


def test_errors_inside_tools_become_results(ws):
    def boom() -> str:
        raise RuntimeError("disk on fire")

    replies = [calls_reply(tool_call("boom", "{}")), text_reply("handled")]
    result, events, _ = _go(ws, replies, tools=[tool(boom)])
    assert result.stop.reason is StopReason.FINAL_ANSWER
    content = json.loads(next(e for e in events if e["event"] == "result")["content"])
    assert content["ok"] is False and "disk on fire" in content["message"]


def test_context_window_stops_before_sending(ws):
    result, _, model = _go(ws, [text_reply("hi")], limits=Limits(context_window=5))
    assert result.stop.reason is StopReason.CONTEXT_OVERFLOW and model.served == 0


class _Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def complete(self, request):
        raise self.exc

    def describe(self):
        return {"kind": "raising"}


@pytest.mark.parametrize("exc,reason", [
    (StopError(StopReason.ENDPOINT_ERROR, "HTTP 500"), StopReason.ENDPOINT_ERROR),
    (StopError(StopReason.CONTEXT_OVERFLOW, "n_prompt_tokens=40000 n_ctx=32768"), StopReason.CONTEXT_OVERFLOW),
    (KeyboardInterrupt(), StopReason.CANCELLED),
    (RuntimeError("adapter bug"), StopReason.ENDPOINT_ERROR),
])
def test_model_failures_end_named_with_a_complete_log(tmp_path, exc, reason):
    log = tmp_path / "run.jsonl"
    result = run("task", model=_Raising(exc), tools=[], log=log)
    assert result.stop.reason is reason
    assert read_log(log)[-1]["reason"] == str(reason)


def test_cancel_during_a_tool_leaves_a_complete_log(ws):
    def interrupt() -> str:  # a real Ctrl-C: SIGINT to this process while the tool runs
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
        return "not reached"

    result, events, _ = _go(ws, [calls_reply(tool_call("interrupt", "{}"), tool_call("interrupt", "{}"))],
                            tools=[tool(interrupt)])
    assert result.stop.reason is StopReason.CANCELLED
    results = [e for e in events if e["event"] == "result"]
    assert len(results) == 2  # each requested call has exactly one result


def test_a_custom_guard_stops_with_its_own_named_reason_before_the_request(ws):
    """A guard's `self.stop(...)`: reason StopReason.GUARD, the guard's name, limit and value in the
    data; checked before the request it would pay for (no fourth request is sent)."""
    from loopfence import Guard

    class ThreeRequests(Guard):
        name = "three-requests"

        def before_request(self, s):
            n = s.ledger.model_requests
            return self.stop(f"{n} requests made", limit=3, value=n + 1) if n >= 3 else None

    replies = [calls_reply(tool_call("read_file", path=f"f{i}.txt")) for i in range(6)]
    result, events, model = _go(ws, replies, guards=[ThreeRequests()])
    assert result.stop.reason is StopReason.GUARD and result.verdict is Verdict.KILL
    assert result.stop.data == {"guard": "three-requests", "limit": 3, "value": 4}
    assert result.ledger.model_requests == 3
    assert [e["event"] for e in events].count("request") == 3


def test_every_stop_reason_is_covered_here():
    """Guard against a vocabulary entry that no test in this file produces."""
    src = Path(__file__).read_text()
    # Only a fenced framework ends a run at its own limit (never the ring alone): those tests cover it.
    elsewhere = {StopReason.FRAMEWORK_LIMIT: "_integration_support.py",
                 StopReason.ANSWER_REJECTED: "test_answer_contract.py"}  # only with an answer contract
    missing = [r.name for r in StopReason if r not in elsewhere and f"StopReason.{r.name}" not in src]
    assert not missing, missing
    for reason, name in elsewhere.items():
        assert f"StopReason.{reason.name}" in (Path(__file__).parent / name).read_text(), (reason, name)


def test_a_repeated_long_read_is_reused_under_default_compaction(ws):
    """The model saw the first result whole when it asked again: reuse it, even if elided since."""
    ran: list = []

    def read_page(path: str) -> str:
        ran.append(path)
        return "x" * 1000

    replies = [calls_reply(tool_call("read_page", path="a.txt"))]
    result, _, _ = _go(ws, replies, tools=[tool(read_page, kind="read_only")])
    assert result.stop.reason is StopReason.NO_PROGRESS
    assert ran == ["a.txt"] and result.ledger.reused == 1


def test_ctrl_c_while_a_side_effect_runs_is_outcome_unknown_not_not_run(ws):
    """The intent was logged and the tool acted: the log must not say it did not run."""
    from loopfence.runlog import reconcile

    def write_then_wait() -> str:
        (ws / "effect.txt").write_text("done")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
        return "not reached"

    result, events, _ = _go(ws, [calls_reply(tool_call("write_then_wait", "{}"))], tools=[tool(write_then_wait)])
    assert result.stop.reason is StopReason.CANCELLED
    assert (ws / "effect.txt").exists()
    res = [e for e in events if e["event"] == "result"]
    assert len(res) == 1 and res[0]["decision"] == "executed" and res[0]["error"] == "outcome_unknown"
    assert len([e for e in events if e["event"] == "call"]) == 1
    assert result.ledger.tool_executions == 1
    assert reconcile(ws.parent / "run.jsonl").ok


def test_a_tool_raising_system_exit_is_a_result_even_inline(ws):
    def leave() -> str:
        raise SystemExit(3)

    replies = [calls_reply(tool_call("leave", "{}")), text_reply("handled")]
    result, events, _ = _go(ws, replies, tools=[tool(leave)],
                            limits=Limits(tool_timeout_s=None, max_wall_seconds=None))
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert json.loads(next(e for e in events if e["event"] == "result")["content"])["ok"] is False


def test_feedback_turn_with_a_rejected_call_is_not_no_progress(ws):
    replies = [calls_reply(tool_call("read_file", path="app/config.py")),
               calls_reply(tool_call("read_file", path="app/config.py"), tool_call("read_file", '{"path": 3}')),
               text_reply("done")]
    result, _, _ = _go(ws, replies, policy=Policy(on_bad_call="feedback"))
    assert result.stop.reason is StopReason.FINAL_ANSWER
    assert result.ledger.rejected == 1 and result.ledger.reused == 1


def test_a_bug_in_a_guard_ends_named_and_says_it_is_internal(ws):
    from loopfence import Guard

    class Broken(Guard):
        def before_request(self, s):
            raise ZeroDivisionError("oops")

    from loopfence.runlog import reconcile

    result, events, _ = _go(ws, [text_reply("x")], guards=[Broken()])
    assert result.stop.reason is StopReason.INTERNAL_ERROR
    assert "internal error in loopfence" in result.stop.detail and "ZeroDivisionError" in result.stop.data["traceback"]
    assert events[-1]["event"] == "stop" and events[-1]["reason"] == "internal_error"
    assert reconcile(ws.parent / "run.jsonl").ok


def test_a_model_raising_system_exit_ends_the_run_cancelled_then_exits(tmp_path):
    """The stop line is written whatever escapes; the exit asked for still happens after it."""
    from loopfence.runlog import reconcile

    log = tmp_path / "run.jsonl"
    with pytest.raises(SystemExit) as info:
        run("task", model=_Raising(SystemExit(7)), tools=[], log=log)
    assert info.value.code == 7
    last = read_log(log)[-1]
    assert last["event"] == "stop" and last["reason"] == str(StopReason.CANCELLED)
    assert "SystemExit(7)" in last["detail"]
    assert reconcile(log).ok


def test_cost_budget_stops_before_the_request_it_cannot_pay_for(ws):
    """$0.001 a reply (100 completion tokens at $10/MTok) and $0.001 reserved: the third request would
    make $0.003 > $0.0025, so it is never sent (issue 19; tests/test_policies.py has the rest)."""
    replies = [calls_reply(tool_call("list_dir", path=p), usage=(10, 100)) for p in (".", "app", "src")]
    result, events, model = _go(ws, replies, prices={"*": (0.0, 10.0)},
                                limits=Limits(max_cost_usd=0.0025, max_tokens_per_request=100))
    assert result.stop.reason is StopReason.MAX_COST_USD and model.served == 2
    assert events[-1]["ledger"]["cost_usd"] == pytest.approx(0.002)
