"""Each guard alone, against a hand-built state: budgets as preconditions, messages naming limit and value."""

from __future__ import annotations

from loopfence import Limits, Policy, StopReason
from loopfence._contract import CheckedCall
from loopfence._guards import (CompletionTokenLimit, NoProgress, PromptTokenLimit, RepeatedCall,
                               RepeatedResult, StepLimit, ToolCallLimit, WallClock)
from loopfence._messages import ToolCall
from loopfence._state import RunState
from loopfence.tools import Registry, ToolResult, tool


def ping(n: int = 0) -> str:
    return "pong"


def poll(job: str = "") -> str:
    return "running"


REG = Registry([tool(ping), tool(poll, kind="poll")])


def state(**limits) -> RunState:
    return RunState(Limits(**limits), Policy(), REG, messages=[{"role": "user", "content": "x"}])


def call(name="ping", key="ping:{}") -> CheckedCall:
    return CheckedCall(ToolCall("c", name, "{}"), REG.get(name), {}, key)


def res(content="ok", decision="executed") -> ToolResult:
    return ToolResult(content, True, decision)


def test_step_limit_before_request():
    s = state()
    g = StepLimit(2)
    s.ledger.model_requests = 1
    assert g.before_request(s) is None
    s.ledger.model_requests = 2
    stop = g.before_request(s)
    assert stop.reason is StopReason.MAX_STEPS and "max_steps=2" in stop.detail
    assert StepLimit(None).before_request(s) is None


def test_tool_call_limit_ignores_reuse():
    s = state()
    s.ledger.tool_executions = 3
    g = ToolCallLimit(3)
    assert g.before_execution(s, call(), reuse=True) is None
    stop = g.before_execution(s, call(), reuse=False)
    assert stop.reason is StopReason.MAX_TOOL_CALLS and "max_tool_calls=3" in stop.detail


def test_prompt_tokens_counts_used_plus_next_estimate():
    s = state()
    est = s.next_prompt_estimate()
    assert PromptTokenLimit(est).before_request(s) is None
    s.ledger.prompt_tokens = 1
    stop = PromptTokenLimit(est).before_request(s)
    assert stop.reason is StopReason.MAX_PROMPT_TOKENS and stop.data["value"] == est + 1
    assert PromptTokenLimit(None, context_window=est - 1).before_request(s).reason is StopReason.CONTEXT_OVERFLOW


def test_completion_tokens_reserve_max_tokens():
    s = state()
    s.params = {"max_tokens": 100}
    s.ledger.completion_tokens = 50
    assert CompletionTokenLimit(150).before_request(s) is None
    assert CompletionTokenLimit(149).before_request(s).reason is StopReason.MAX_COMPLETION_TOKENS


def test_wall_clock():
    s = state()
    s.t0 -= 10
    assert WallClock(20).before_request(s) is None
    assert WallClock(5).before_request(s).reason is StopReason.MAX_WALL_SECONDS
    assert WallClock(5).before_execution(s, call(), reuse=True) is None


def test_repeated_call_counts_replies_not_calls_and_exempts_polls():
    s = state()
    g = RepeatedCall(2)
    g.on_reply(s, [call(), call()])  # twice in one reply counts once
    assert g.before_execution(s, call(), False) is None
    g.on_reply(s, [call()])
    assert g.before_execution(s, call(), False).reason is StopReason.REPEATED_CALL
    p = call("poll", "poll:{}")
    for _ in range(5):
        g.on_reply(s, [p])
    assert g.before_execution(s, p, False) is None


def test_repeated_result_streak_resets_on_a_different_result():
    s = state()
    g = RepeatedResult(2)
    assert g.after_execution(s, call(), res("a")) is None
    assert g.after_execution(s, call(), res("a")) is None
    assert g.after_execution(s, call(), res("b")) is None
    assert g.after_execution(s, call(), res("b")) is None
    assert g.after_execution(s, call(), res("b")).reason is StopReason.REPEATED_RESULT
    assert g.after_execution(s, call(), res("b", "reused")) is None  # reuses are not executions


def test_no_progress_only_when_every_call_was_reused():
    s = state()
    assert NoProgress().after_turn(s, [res(decision="reused"), res()]) is None
    assert NoProgress().after_turn(s, [res(decision="reused")]).reason is StopReason.NO_PROGRESS
    assert NoProgress(False).after_turn(s, [res(decision="reused")]) is None
