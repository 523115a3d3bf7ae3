"""Each guard alone, against a hand-built state: budgets as preconditions, messages naming limit and value."""

from __future__ import annotations

from loopfence import Limits, Policy, StopReason
from loopfence._contract import CheckedCall
from loopfence._guards import (CompletionTokenLimit, NoProgress, PromptTokenLimit, RepeatedCall,
                               RepeatedCycle, RepeatedResult, StepLimit, ToolCallLimit, WallClock)
from loopfence._messages import ToolCall
from loopfence._state import RunState
from loopfence.tools import Registry, ToolResult, tool


def ping(n: int = 0) -> str:
    return "pong"


def poll(job: str = "") -> str:
    return "running"


def look(path: str = "") -> str:
    return "text"


REG = Registry([tool(ping), tool(poll, kind="poll"), tool(look, kind="read_only")])


def state(policy: Policy | None = None, **limits) -> RunState:
    return RunState(Limits(**limits), policy or Policy(), REG, messages=[{"role": "user", "content": "x"}])


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


def test_repeated_call_restarts_when_another_call_changes_the_world():
    s = state()
    g = RepeatedCall(3)
    test, edit = call("ping", 'ping:{"n":1}'), call("ping", 'ping:{"n":2}')
    for _ in range(5):  # the same test after each edit is a new question
        g.on_reply(s, [test])
        assert g.before_execution(s, test, False) is None
        g.after_execution(s, test, res("3 failed"))
        g.on_reply(s, [edit])
        g.after_execution(s, edit, res("edited"))
    assert g.counts[test.key] == 0 and g.counts[edit.key] == 1


def test_repeated_call_is_not_restarted_by_reads_refusals_or_itself():
    s = state()
    g = RepeatedCall(3)
    test, read = call("ping", 'ping:{"n":1}'), call("look", 'look:{"path":"a"}')
    g.on_reply(s, [test])
    g.after_execution(s, test, res())  # its own execution changes nothing for itself
    g.on_reply(s, [read])
    g.after_execution(s, read, res())  # a read changes nothing
    g.on_reply(s, [test])
    other = call("ping", 'ping:{"n":9}')
    g.after_execution(s, other, res(decision="refused"))  # a call that did not run changed nothing
    g.on_reply(s, [test])
    stop = g.before_execution(s, test, False)
    assert stop.reason is StopReason.REPEATED_CALL and stop.data == {
        "limit": 3, "value": 3, "key": test.key, "scope": "change"}
    assert "with nothing changed in between (max_repeats=3)" in stop.detail


def test_repeated_call_a_side_effect_earlier_in_the_same_reply_restarts_the_count():
    s = state()
    g = RepeatedCall(2)
    test, edit = call("ping", 'ping:{"n":1}'), call("ping", 'ping:{"n":2}')
    g.on_reply(s, [test])
    g.on_reply(s, [edit, test])  # the edit runs first: the test after it is a new question
    g.after_execution(s, edit, res("edited"))
    assert g.before_execution(s, test, False) is None


def test_repeat_scope_run_counts_the_whole_run():
    s = state(Policy(repeat_scope="run"))
    g = RepeatedCall(3)
    test, edit = call("ping", 'ping:{"n":1}'), call("ping", 'ping:{"n":2}')
    for i in range(3):
        g.on_reply(s, [test])
        verdict = g.before_execution(s, test, False)
        if i < 2:
            assert verdict is None
            g.after_execution(s, test, res(f"{3 - i} failed"))
            g.on_reply(s, [edit])
            g.after_execution(s, edit, res("edited"))
    assert verdict.reason is StopReason.REPEATED_CALL and verdict.data["scope"] == "run"
    explicit = RepeatedCall(3, scope="run")  # a guard's own scope wins over the run's policy
    explicit.on_reply(state(), [test])
    assert explicit.counts.scope == "run"


def test_repeated_result_streak_resets_on_a_different_result():
    s = state()
    g = RepeatedResult(2)
    assert g.after_execution(s, call(), res("a")) is None
    assert g.after_execution(s, call(), res("a")) is None
    assert g.after_execution(s, call(), res("b")) is None
    assert g.after_execution(s, call(), res("b")) is None
    assert g.after_execution(s, call(), res("b")).reason is StopReason.REPEATED_RESULT
    assert g.after_execution(s, call(), res("b", "reused")) is None  # reuses are not executions


def test_repeated_result_default_allows_five_identical_results_in_a_row():
    s = state()
    g = RepeatedResult(Limits().max_identical_results)
    assert all(g.after_execution(s, call("ping", f'ping:{{"n":{i}}}'), res("pong")) is None for i in range(5))
    stop = g.after_execution(s, call("ping", 'ping:{"n":9}'), res("pong"))
    assert stop.reason is StopReason.REPEATED_RESULT and stop.data["value"] == 6
    assert g.after_execution(s, call("poll", "poll:{}"), res("pong")) is None  # polls are exempt
    assert RepeatedResult(None).after_execution(s, call(), res("")) is None


def test_a_side_effects_empty_success_counts_only_against_the_same_call():
    s = state()
    g = RepeatedResult(2)
    empty = '{"ok": true, "exit_code": 0, "stdout": "", "duration_s": 0.1}'
    assert all(g.after_execution(s, call("ping", f'ping:{{"n":{i}}}'), res(empty)) is None for i in range(9))
    assert all(g.after_execution(s, call("ping", 'ping:{"n":1}'), res(empty)) is None for _ in range(2))
    assert g.after_execution(s, call("ping", 'ping:{"n":1}'), res(empty)).reason is StopReason.REPEATED_RESULT
    failed = ToolResult('{"ok": false, "error": "nonzero_exit", "exit_code": 1, "stderr": ""}', False)
    looks = [g.after_execution(s, call("look", f'look:{{"n":{i}}}'), res("")) for i in range(3)]
    assert looks[:2] == [None, None] and looks[2].reason is StopReason.REPEATED_RESULT  # read-only: a repeat
    for failure in (failed, res('{"success": false, "reason": "denied"}'), res('{"status": "error", "detail": "x"}')):
        g = RepeatedResult(2)
        fails = [g.after_execution(s, call("ping", f'ping:{{"n":{i}}}'), failure) for i in range(3)]
        assert fails[:2] == [None, None] and fails[2].reason is StopReason.REPEATED_RESULT  # errors: a repeat


def test_repeated_result_ignores_the_shells_timing():
    s = state()
    g = RepeatedResult(1)
    assert g.after_execution(s, call(), res('{"ok": true, "stdout": "", "duration_s": 0.101}')) is None
    stop = g.after_execution(s, call(), res('{"stdout": "", "ok": true, "duration_s": 0.254}'))
    assert stop is not None and stop.reason is StopReason.REPEATED_RESULT


def _edit(content: str = "x") -> CheckedCall:
    key = f'ping:{{"n":1,"path":"a.py","c":"{content}"}}'
    return CheckedCall(ToolCall("c", "ping", "{}"), REG.get("ping"), {}, key)


def test_a_ping_pong_with_identical_results_stops_at_its_third_round():
    s = state()
    g = RepeatedCycle(3)
    edit, test = _edit(), call("ping", 'ping:{"cmd":"pytest -q"}')
    seen = []
    for _ in range(3):
        seen.append(g.after_execution(s, edit, res("wrote 10 bytes")))
        seen.append(g.after_execution(s, test, res("1 failed")))
    assert seen[:-1] == [None] * 5
    stop = seen[-1]
    assert stop.reason is StopReason.REPEATED_RESULT
    assert stop.detail.startswith("ping a.py → ping pytest -q: 3 times with identical results")
    assert stop.data["period"] == 2 and stop.data["cycle"] == [edit.key, test.key]


def test_a_period_three_cycle_stops_and_different_results_do_not():
    s = state()
    a, b, c = (call("ping", f'ping:{{"n":{i}}}') for i in range(3))
    g = RepeatedCycle(3)
    out = [g.after_execution(s, x, res(x.key)) for _ in range(3) for x in (a, b, c)]
    assert out[:-1] == [None] * 8 and out[-1].data["period"] == 3
    changing = RepeatedCycle(3)  # the same calls, a new test output each round: progress
    assert all(changing.after_execution(s, x, res(f"{x.key} {i}")) is None for i in range(5) for x in (a, b))


def test_a_cycle_ignores_reuses_polls_and_one_call_repeated():
    s = state()
    g = RepeatedCycle(3)
    a, b = call("ping", 'ping:{"n":1}'), call("ping", 'ping:{"n":2}')
    for _ in range(3):
        assert g.after_execution(s, a, res("same")) is None
        assert g.after_execution(s, call("poll", "poll:{}"), res("running")) is None
        assert g.after_execution(s, b, res("same", decision="reused")) is None
    for _ in range(6):  # period 1 is repeated_call's and the streak's business
        assert g.after_execution(s, a, res("same")) is None
    assert RepeatedCycle(None).after_execution(s, a, res("same")) is None


def test_no_progress_only_when_every_call_was_reused():
    s = state()
    assert NoProgress().after_turn(s, [res(decision="reused"), res()]) is None
    assert NoProgress().after_turn(s, [res(decision="reused")]).reason is StopReason.NO_PROGRESS
    assert NoProgress(False).after_turn(s, [res(decision="reused")]) is None
