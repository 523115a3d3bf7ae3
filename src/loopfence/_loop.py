"""The ring: send -> remember -> stop gate -> run tools. The only part that acts.

Policies live in guards (_guards.py) and the contract (_contract.py); this module wires them.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
import uuid
from collections.abc import Generator, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._compact import Compaction
from ._contract import CheckedCall, ContractResult, check_reply, requested_max_tokens
from ._driver import Op, interrupted, run_to_end
from ._gate import ApprovalHook, UntrustedGate
from ._guards import Guard, Guards, default_guards
from ._json import MAX_DEPTH, depth, loggable
from ._limits import Limits, Policy
from ._messages import Reply, Request
from ._state import RunState
from ._stops import RunResult, Stop, StopError, StopReason
from .models._base import Model
from .runlog._writer import FORMAT, VERSION, LogWriteError, RunLog
from .tools._executor import Executor, ToolResult, error_result
from .tools._registry import Registry, Tool, ToolKind

__all__ = ["run", "drive", "new_state"]


def run(task: str, *, model: Model, tools: Iterable[Tool] | Registry = (), limits: Limits | None = None,
        policy: Policy | None = None, system: str | None = None, params: dict[str, Any] | None = None,
        log: RunLog | str | Path | None = None, guards: list[Guard] | None = None,
        executor: Executor | None = None, header: dict[str, Any] | None = None,
        gate: UntrustedGate | None = None, approve: ApprovalHook | None = None,
        compaction: Compaction | None = None) -> RunResult:
    """Run the fenced loop until it stops for a named reason. Never raises for a stop; raises
    LogWriteError (an OSError) when the log cannot be written, ending the run where its log ends.

    gate: the untrusted-content gate (default: UntrustedGate(approve); `approve` None denies);
    compaction: the outgoing-context policy (default: Compaction(); `Compaction.off()` disables).
    """
    registry = tools if isinstance(tools, Registry) else Registry(tools)
    task, system = loggable(task), system and loggable(system)  # as the header reads back (replay)
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": task}]
    gate = gate or UntrustedGate(approve)
    state = new_state(registry, limits or Limits(), policy or Policy(), params or {}, messages,
                      compaction or Compaction())
    runlog = log if isinstance(log, RunLog) else RunLog(log, t0=state.t0)
    runlog.write("header", format=FORMAT, version=VERSION, run_id=uuid.uuid4().hex,
                 started_at=datetime.now(timezone.utc).isoformat(), task=task, system=system,
                 limits=state.limits.to_json(), policy=state.policy.to_json(), params=state.params,
                 tools=[{"kind": str(t.kind), "untrusted": t.untrusted, "privileged": t.privileged,
                         **t.schema()} for t in registry],
                 model=_describe(model), gate=gate.describe(), compaction=state.compaction.to_json(),
                 **_tool_info(registry), **(header or {}))
    return drive(state, model, runlog, default_guards(state.limits, guards, gate), executor or Executor())


def _tool_info(registry: Registry) -> dict[str, Any]:
    """What tools report about themselves for the header (run_command: the bounds in force)."""
    info = {t.name: t.info for t in registry if t.info}
    return {"tool_info": info} if info else {}


def new_state(registry: Registry, limits: Limits, policy: Policy, params: dict[str, Any],
              messages: list[dict[str, Any]], compaction: Compaction | None = None) -> RunState:
    return RunState(limits, policy, registry, dict(params), messages=messages,
                    compaction=compaction or Compaction())


def drive(s: RunState, model: Model, log: RunLog, guards: Guards, executor: Executor) -> RunResult:
    """Run the ring from the current state to a stop; write the stop as the log's last line.
    The ring runs on a runner thread that also performs its model calls and tools (see _driver)."""
    result: RunResult
    result, cpu_s = run_to_end(_drive(s, model, log, guards, executor))
    return dataclasses.replace(result, cpu_s=round(cpu_s, 6))


def _drive(s: RunState, model: Model, log: RunLog, guards: Guards,
           executor: Executor) -> Generator[Op, Any, RunResult]:
    final: list[str | None] = [None, None]  # final answer, partial text of a cut-off reply
    s.log = log
    s.token_counter = getattr(model, "count_tokens", None)  # exact counts when the model offers them
    try:
        stop = yield from _ring(s, model, log, guards, executor, final)
    except StopError as exc:
        stop = exc.stop
    except KeyboardInterrupt:
        stop = Stop(StopReason.CANCELLED, "interrupted (Ctrl-C)")
    except LogWriteError:  # nothing more can be logged: the run ends here, its log resumable
        log.close()
        raise
    except Exception as exc:  # noqa: BLE001 - even a bug in loopfence must end the run named
        stop = Stop(StopReason.ENDPOINT_ERROR, f"internal error in loopfence, please report it: "
                    f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()})
    for call in list(s.pending):  # every requested call gets exactly one result
        if call is s.in_flight:  # its intent is logged and it may have acted: never "not run"
            _record(s, log, call, error_result("outcome_unknown", side_effects="may have happened",
                    message=f"interrupted while running: the run stopped ({stop.reason})"),
                    key=None, logged_intent=True)
        else:
            _record(s, log, call, error_result("not_executed", "refused",
                    message=f"not run: the run stopped ({stop.reason})"), key=None)
    s.ledger.elapsed_s = s.elapsed()
    ledger = s.ledger.snapshot()
    log.write("stop", **stop.to_json(), verdict=str(stop.verdict), final_answer=final[0],
              partial_text=final[1], ledger=ledger.to_json(),
              per_step=[list(p) for p in s.ledger.per_step])
    log.close()
    return RunResult(stop, final[0], ledger, tuple(s.messages), log.path, final[1])


def _ring(s: RunState, model: Model, log: RunLog, guards: Guards, executor: Executor,
          final: list[str | None]) -> Generator[Op, Any, Stop]:
    while True:
        if stop := guards.before_request(s):
            return stop
        estimate = s.next_prompt_estimate()
        request = s.request()
        log.write("request", step=request.step, fingerprint=s.request_fingerprint(),
                  n_messages=len(request.messages), prompt_estimate=estimate, params=request.params)
        s.ledger.model_requests += 1
        started = time.monotonic()
        reply = yield from _send(model, request)  # send
        prompt, completion = s.remember(reply, estimate)  # remember
        log.write("reply", step=request.step, raw=reply.raw, complete=reply.complete,
                  problem=reply.problem, finish_reason=reply.finish_reason,
                  usage={"prompt_tokens": prompt, "completion_tokens": completion,
                         "reported": reply.usage is not None and reply.usage.prompt_tokens is not None},
                  duration_s=round(time.monotonic() - started, 6))
        checked = check_reply(reply, s.registry, requested_max_tokens(s.params))
        calls, stop, results = _settle_contract(s, log, reply, checked, final)  # stop gate
        if stop:
            return stop
        guards.on_reply(s, calls)
        for c in calls:  # run tools: one execution = one count
            cached = s.cache.get(c.key) if c.tool.kind is ToolKind.READ_ONLY else None
            verdict = guards.before_execution(s, c, cached is not None)
            if isinstance(verdict, Stop):
                return verdict
            result = verdict or (cached.as_reused() if cached else (yield from _execute(s, log, executor, c)))
            s.cache.record(c.tool, c.key, result)
            _record(s, log, c.call, result, c.key, logged_intent=result.decision == "executed")
            results.append(result)
            if stop := guards.after_execution(s, c, result):
                return stop
        if stop := guards.after_turn(s, results):
            return stop


class _Send(Op):
    __slots__ = ("model", "request")

    def __init__(self, model: Model, request: Request) -> None:
        self.model, self.request = model, request

    def run(self) -> Reply:
        return self.model.complete(self.request)


class _Execute(Op):
    __slots__ = ("executor", "tool", "args", "timeout_s")

    def __init__(self, executor: Executor, t: Tool, args: dict[str, Any], timeout_s: float | None) -> None:
        self.executor, self.tool, self.args, self.timeout_s = executor, t, args, timeout_s

    def run(self) -> ToolResult:
        return self.executor.execute(self.tool, self.args, self.timeout_s)


def _send(model: Model, request: Request) -> Generator[Op, Any, Reply]:
    """One request. Whatever an adapter raises ends the run as endpoint_error, never as a traceback;
    so does a reply nested too deep for the log to record and read back."""
    try:
        reply = yield _Send(model, request)
    except (StopError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001
        raise StopError(StopReason.ENDPOINT_ERROR,
                        f"the model adapter raised {type(exc).__name__}: {exc}") from exc
    levels = max([depth(reply.raw), *(depth(c.arguments) for c in reply.tool_calls)])
    if levels > MAX_DEPTH:
        raise StopError(StopReason.ENDPOINT_ERROR, f"the reply is nested {levels:,} levels deep (the "
                        f"limit is {MAX_DEPTH}): the log could not record it")
    return reply


def _settle_contract(s: RunState, log: RunLog, reply: Reply, checked: ContractResult,
                     final: list[str | None]) -> tuple[list[CheckedCall], Stop | None, list[ToolResult]]:
    """Which calls may run, or the stop, and the results already given (rejected calls).
    Fail closed by default; feedback mode tells the model."""
    if checked.incomplete:
        final[1] = reply.content
        return [], Stop(StopReason.INCOMPLETE_STREAM, checked.incomplete.detail), []
    if not reply.tool_calls:
        text = (reply.content or "").strip()
        if text:
            final[0] = reply.content
            return [], Stop(StopReason.FINAL_ANSWER, f"answer after {s.ledger.model_requests} requests"), []
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
        _record(s, log, v.call, given[-1], key=None, reason=str(v.reason))
    if feedback:
        return valid, None, given
    why = "" if s.policy.on_bad_call == "fail" else \
        f" ({s.bad_streak} replies in a row with a violation, max_bad_calls={limit})"
    return [], Stop(first.reason, first.detail + why), given


def _violation_result(body: dict[str, Any]) -> ToolResult:
    return ToolResult(json.dumps(body, ensure_ascii=False), False, "rejected", error=body["error"])


def _execute(s: RunState, log: RunLog, executor: Executor, c: CheckedCall) -> Generator[Op, Any, ToolResult]:
    if interrupted():
        raise KeyboardInterrupt
    s.in_flight = c.call  # intent logged, outcome not yet: a stop now leaves it outcome_unknown
    log.write("call", step=s.ledger.model_requests, tool_call_id=c.call.id, name=c.tool.name,
              raw_arguments=c.call.raw_arguments, arguments=c.args, key=c.key, kind=str(c.tool.kind),
              decision="executed", intent=True)
    result = yield _Execute(executor, c.tool, c.args, s.tool_timeout())
    s.in_flight = None
    return result


def _record(s: RunState, log: RunLog, call: Any, result: ToolResult, key: str | None,
            logged_intent: bool = False, reason: str | None = None) -> None:
    """One result per requested call: the call event (unless its intent was logged) and the result."""
    step = s.ledger.model_requests
    if not logged_intent:
        log.write("call", step=step, tool_call_id=call.id, name=call.name,
                  raw_arguments=call.raw_arguments, key=key, decision=result.decision,
                  reason=reason or result.error)
    s.add_result(call, result)
    log.write("result", step=step, tool_call_id=call.id, name=call.name, decision=result.decision,
              ok=result.ok, error=result.error, fingerprint=result.fingerprint,
              duration_s=round(result.duration_s, 6), untrusted=result.untrusted, content=result.content,
              **({"violation": result.violation} if result.violation else {}))


def _describe(model: Model) -> dict[str, Any]:
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else {"kind": type(model).__name__}
