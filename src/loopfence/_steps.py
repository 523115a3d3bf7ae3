"""The ring's steps that wait on nothing outside: the request and reply events, the
contract's verdict, one call through the guards, the end of a turn, the results still owed, the stop.

The ring (`_loop._ring`) awaits the model and the tools between these steps; a framework fence
(`loopfence.integrations`) runs the same steps around a framework's own model requests and tool
calls. So the rules, the ledger and the log are written once, and a fenced framework run leaves a
log that `loopfence reconcile` folds through the ring like any other.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._contract import CheckedCall, ContractResult, requested_max_tokens
from ._guards import Guards, nudge_for
from ._messages import Reply, Request
from ._repeats import outcome_fingerprint
from ._state import RunState
from ._stops import RunResult, Stop, StopError, StopReason
from ._log._schema import (AnswerLine, CallLine, Decision, NudgeLine, ReplyLine, RequestLine, ResultLine,
                           StopLine, Usage)
from ._log._writer import RunLog
from .tools._executor import ToolResult, error_result, refusal
from .tools._registry import ToolKind

__all__ = ["open_request", "close_reply",
           "settle_contract", "judge_answer", "announce", "run_call", "end_turn", "deliver_note", "record", "settle",
           "finish", "nudge", "on_the_clock", "past_the_clock"]

T = TypeVar("T")


# -- the run's wall clock --------------------------------------------------------------------------
CLOCK_GRACE_S = 0.05  # the scope fires this much after the deadline: what is bounded by the deadline
# itself (a tool's timeout, never longer than what is left) ends first and is answered as such


async def on_the_clock(s: RunState, aw: Awaitable[T]) -> T:
    """`aw` under the run's wall clock: ONE scope (`asyncio.timeout`) around the ring. Past
    max_wall_seconds whatever it awaits is cancelled (a sync call on a worker is left behind), and
    this is the one place that turns the expiry into the `max_wall_seconds` stop (a StopError naming
    `s.doing`, what was running)."""
    deadline = s.deadline()
    scope = asyncio.timeout(None if deadline is None else deadline + CLOCK_GRACE_S - time.monotonic())
    outer, s.clock = s.clock, scope
    try:
        async with scope:
            return await aw
    except TimeoutError:
        if not scope.expired():
            raise  # something inside raised its own TimeoutError
    finally:
        s.clock = outer
    limit, elapsed = s.limits.max_wall_seconds, s.elapsed()
    raise StopError(StopReason.MAX_WALL_SECONDS, f"{elapsed:.2f}s elapsed: {s.doing} was still running at "
                    f"max_wall_seconds={limit:g}; the run went on without it", limit=limit, value=round(elapsed, 3))


async def past_the_clock(s: RunState) -> None:
    """Past the deadline (a reply that came late, an adapter that blocked the loop, a replayed
    clock), nothing more is started or used: the clock's scope ends the run now."""
    deadline = s.deadline()
    if deadline is not None and s.clock is not None and time.monotonic() >= deadline:
        loop = asyncio.get_running_loop()
        s.clock.reschedule(loop.time())
        await loop.create_future()  # cancelled by the scope


# -- one request -----------------------------------------------------------------------------------
def open_request(s: RunState, log: RunLog) -> tuple[Request, int]:
    """The next request, logged and counted (before it is sent): (the request, its prompt estimate)."""
    estimate = s.next_prompt_estimate()
    request = s.request()
    log.write(RequestLine(step=request.step, fingerprint=s.request_fingerprint(),
                          n_messages=len(request.messages), prompt_estimate=estimate, params=request.params))
    s.ledger.model_requests += 1
    return request, estimate


def close_reply(s: RunState, log: RunLog, step: int, reply: Reply, estimate: int, started: float) -> None:
    """The reply remembered, charged (tokens; dollars where the run has a price) and logged."""
    s.streamed.clear()  # the reply is whole: its text is in the log
    prompt, completion = s.remember(reply, estimate)
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion,
                  reported=reply.usage is not None and reply.usage.prompt_tokens is not None, **s.charge_note)
    log.write(ReplyLine(step=step, raw=reply.raw, complete=reply.complete, problem=reply.problem,
                        finish_reason=reply.finish_reason, usage=usage,
                        duration_s=round(time.monotonic() - started, 6)))


def settle_contract(s: RunState, log: RunLog, reply: Reply, checked: ContractResult,
                    final: list[str | None]) -> tuple[list[CheckedCall], Stop | None, list[ToolResult]]:
    """Which calls may run, or the stop, and the results already given (rejected calls).
    Fail closed by default; feedback mode tells the model."""
    if checked.incomplete:
        final[1] = reply.content
        cut = _cut_by_budget(s, reply) or _cut_by_model_cap(s, reply) or \
            Stop(StopReason.INCOMPLETE_STREAM, checked.incomplete.detail)
        return [], cut, []
    if not reply.tool_calls:
        if (reply.content or "").strip():
            return [], judge_answer(s, log, reply.content or "", final), []
        return [], Stop(StopReason.EMPTY_ANSWER, "the model replied with no tool calls and no text"), []
    valid = [i for i in checked.items if isinstance(i, CheckedCall)]
    bad = checked.violations
    if not bad:
        s.bad_streak = 0
        return valid, None, []
    s.bad_streak += 1
    first = bad[0]
    limit = s.policy.max_bad_calls
    feedback = s.policy.on_bad_call == "feedback" and (limit is None or s.bad_streak < limit)
    given = []
    for v in bad:
        body = v.feedback() if feedback else {"ok": False, "error": str(v.reason), "message": v.detail}
        given.append(_violation_result(body))
        record(s, log, v.call, given[-1], key=None, reason=str(v.reason))
    if feedback:
        return valid, None, given
    why = "" if s.policy.on_bad_call == "fail" else \
        f" ({s.bad_streak} replies in a row with a violation, max_bad_calls={limit})"
    return [], Stop(first.reason, first.detail + why), given


def judge_answer(s: RunState, log: RunLog, text: str, final: list[str | None]) -> Stop | None:
    """A final answer under the answer contract (`s.answer`), its verdict an `answer` event: the
    final_answer stop (accepted: `s.output` its typed value); None, rejected with a retry left (the
    error went to the model as a user message: the ring goes on, under the same budgets); or the
    answer_rejected stop. With no contract: the final_answer stop, nothing logged."""
    contract, step = s.answer, s.ledger.model_requests
    judged = contract.judge(text) if contract is not None else None
    if judged is None or judged.error is None:
        if judged is not None:
            log.write(AnswerLine(step=step, decision="accepted"))
        final[0], s.output = text, text if judged is None else judged.output
        return Stop(StopReason.FINAL_ANSWER, f"answer after {step} request{'' if step == 1 else 's'}")
    s.answer_rejections += 1
    if s.answer_rejections <= contract.retries:
        message = contract.feedback(judged.error)
        log.write(AnswerLine(step=step, decision="rejected", error=judged.error, message=message))
        s.append({"role": "user", "content": message})
        return None
    log.write(AnswerLine(step=step, decision="rejected", error=judged.error))
    n, limit = s.answer_rejections, contract.retries
    return Stop(StopReason.ANSWER_REJECTED, f"the answer failed the answer contract {n} time{'' if n == 1 else 's'} "
                f"(answer_retries={limit}): {judged.error}", {"error": judged.error, "limit": limit, "value": n})


def _cut_by_budget(s: RunState, reply: Reply) -> Stop | None:
    """A reply cut at the tokens the run reserved for it (its `max_tokens` lowered to what was left
    of max_completion_tokens, below every other cap) is that budget's stop; None for any other cut
    (a broken stream, a cap the user asked for, the server's own)."""
    limit = s.limits.max_completion_tokens
    if limit is None or not s.names_reservation_cuts or not reply.complete or reply.finish_reason != "length" or not s.ledger.per_step:
        return None
    used = s.ledger.completion_tokens
    left = limit - (used - s.ledger.per_step[-1][1])  # what was left when the request was sent
    caps = [c for c in (s.limits.max_tokens_per_request, requested_max_tokens(s.params)) if c is not None]
    reported = reply.usage.completion_tokens if reply.usage else None
    if left < 1 or any(c <= left for c in caps) or (reported is not None and reported < left):
        return None
    calls = "; its tool calls were not run" if reply.tool_calls else ""
    return Stop(StopReason.MAX_COMPLETION_TOKENS, f"the reply was cut at the {left} tokens left of "
                f"max_completion_tokens={limit} ({used} used in all){calls}",
                {"limit": limit, "value": used, "left": left})


def _cut_by_model_cap(s: RunState, reply: Reply) -> Stop | None:
    """A reply cut at the model's own cap (`s.model_cap`: the embedded model's max_tokens, which it
    uses where a request sets none) is still incomplete_stream, and says so: the cap, and how to raise
    it. None for any other cut."""
    cap, used = s.model_cap, reply.usage.completion_tokens if reply.usage else None
    per_request = s.limits.max_tokens_per_request
    if cap is None or used != cap or not reply.complete or reply.finish_reason != "length" \
            or requested_max_tokens(s.params) is not None or (per_request is not None and per_request <= cap):
        return None  # another cut, or one a larger request cap would not lift (max_tokens_per_request)
    calls = "its tool calls were not run" if reply.tool_calls else "its text is kept (partial_text), not shipped"
    return Stop(StopReason.INCOMPLETE_STREAM, f"the reply was cut at {cap} tokens, the model's own cap (max_tokens="
                f"{cap}, which it uses where a request sets none); {calls}. To raise it, set the request's "
                f"max_tokens: loopfence run --param max_tokens=N, run(params={{'max_tokens': N}}), or a client's "
                f"max_tokens through the proxy (LocalModel(max_tokens=N) changes the default)",
                {"model_max_tokens": cap})


def _violation_result(body: dict[str, Any]) -> ToolResult:
    return ToolResult(json.dumps(body, ensure_ascii=False), False, "rejected", error=body["error"])


# -- one call --------------------------------------------------------------------------------------
def announce(s: RunState, log: RunLog, c: CheckedCall) -> None:
    """The call's intent, logged before it runs: a stop from now on leaves it `outcome_unknown`."""
    s.in_flight = c.call
    log.write(CallLine(step=s.ledger.model_requests, tool_call_id=c.call.id, name=c.tool.name,
                       raw_arguments=c.call.raw_arguments, arguments=c.args, key=c.key, kind=str(c.tool.kind),
                       decision=Decision.EXECUTED, intent=True))


async def run_call(s: RunState, log: RunLog, guards: Guards, c: CheckedCall,
                   execute: Callable[[CheckedCall], Awaitable[ToolResult]],
                   results: list[ToolResult]) -> tuple[ToolResult | None, Stop | None]:
    """One call through the guards: answered from the read-only cache, refused, or executed
    (`execute` announces it and runs it); recorded; checked after. (its result, appended to
    `results`, or None; the stop, or None)."""
    cached = s.cache.get(c.key) if c.tool.kind is ToolKind.READ_ONLY else None
    verdict = guards.before_execution(s, c, cached is not None) if s.nudge_note is None else \
        refusal("nudge_pending", message="not run: a repetition rule stopped this reply's calls; "
                "read the message after these results first")  # a nudge costs no execution
    if isinstance(verdict, Awaitable):  # a decision that waits (the gate's approval hook)
        log.flush()  # the file is whole while the run waits
        verdict = await verdict
    if isinstance(verdict, Stop):
        if (note := nudge(s, log, verdict, c)) is None:
            return None, verdict
        verdict = refusal(str(verdict.reason), message=note)  # the call's one result: the nudge
    result = verdict or (cached.as_reused() if cached else await execute(c))
    s.cache.record(c.tool, c.key, result)
    record(s, log, c.call, result, c.key, logged_intent=result.decision == "executed")
    results.append(result)
    if (stop := guards.after_execution(s, c, result)) and nudge(s, log, stop, c, later=True) is None:
        return result, stop
    return result, None


def end_turn(s: RunState, log: RunLog, guards: Guards, calls: list[CheckedCall],
             results: list[ToolResult]) -> Stop | None:
    """Once every call of a reply has its result: the after_turn guards, then a nudge that is due."""
    if (stop := guards.after_turn(s, results)) and nudge(s, log, stop, calls=calls, later=True) is None:
        return stop
    if s.warning is not None:  # a rule one result short of its stop: the nudge comes now
        warned, s.warning = s.warning, None
        nudge(s, log, warned[0], warned[1], later=True)
    return None


def deliver_note(s: RunState) -> str | None:
    """A nudge raised after an execution goes to the model as a user message, after the turn's
    results: added to the conversation here; the text (for a framework to send), or None."""
    note = s.nudge_note
    if note is not None:
        s.append({"role": "user", "content": note})
        s.nudge_note = None
    return note


def nudge(s: RunState, log: RunLog, stop: Stop, c: CheckedCall | None = None,
          calls: list[CheckedCall] | None = None, later: bool = False) -> str | None:
    """Policy(nudge=True): the run's first repetition stop becomes one message (a `nudge` event,
    counted in the ledger) and the run goes on; None: the stop stands. Raised before an execution
    (`later` False), the message is the refused call's result; raised after one, it goes to the
    model as a user message once every call of the turn has its result."""
    note = nudge_for(s, stop, c, calls)
    if note is None:
        return None
    s.ledger.nudges += 1
    log.write(NudgeLine(step=s.ledger.model_requests, reason=stop.reason, detail=stop.detail, data=stop.data,
                        tool_call_id=c.call.id if c is not None and not later else None,
                        key=c.key if c is not None else None, delivered="message" if later else "refusal",
                        message=note))
    if later:
        s.nudge_note = note
    return note


def record(s: RunState, log: RunLog, call: Any, result: ToolResult, key: str | None,
           logged_intent: bool = False, reason: str | None = None) -> None:
    """One result per requested call: the call event (unless its intent was logged) and the result."""
    step = s.ledger.model_requests
    if not logged_intent:
        log.write(CallLine(step=step, tool_call_id=call.id, name=call.name, raw_arguments=call.raw_arguments,
                           key=key, decision=result.decision, reason=reason or result.error))
    s.add_result(call, result)
    if key is not None and s.policy.nudge and result.decision in ("executed", "reused"):
        s.outcomes[key] = outcome_fingerprint(result.content)  # what a nudge names
    log.write(ResultLine(step=step, tool_call_id=call.id, name=call.name, decision=result.decision, ok=result.ok,
                         error=result.error, fingerprint=result.fingerprint, duration_s=round(result.duration_s, 6),
                         untrusted=result.untrusted, content=result.content,
                         **({"violation": result.violation} if result.violation else {})))


# -- the end ---------------------------------------------------------------------------------------
def settle(s: RunState, log: RunLog, stop: Stop) -> None:
    """Every requested call still owed a result gets one: not run, or (the one in flight) outcome unknown."""
    for call in list(s.pending):
        if call is s.in_flight:  # its intent is logged and it may have acted: never "not run"
            record(s, log, call, error_result("outcome_unknown", side_effects="may have happened",
                   message=f"interrupted while running: the run stopped ({stop.reason})"),
                   key=None, logged_intent=True)
        else:
            record(s, log, call, error_result("not_executed", "refused",
                   message=f"not run: the run stopped ({stop.reason})"), key=None)


def finish(s: RunState, log: RunLog, stop: Stop, final: list[str | None], last: str | None = None) -> RunResult:
    """Every requested call gets exactly one result; the stop is the log's last line."""
    settle(s, log, stop)
    s.ledger.elapsed_s = s.elapsed()
    ledger = s.ledger.snapshot()
    log.write(StopLine(**stop.to_json(), verdict=stop.verdict, final_answer=final[0], partial_text=final[1],
                       ledger=ledger.to_json(), per_step=[list(p) for p in s.ledger.per_step],
                       **({"last_answer": last} if last is not None else {})))
    log.close()
    return RunResult(stop, final[0], ledger, tuple(s.messages), log.path, final[1], last_answer=last,
                     output=s.output if stop.reason is StopReason.FINAL_ANSWER else None)
