"""The ring: send -> remember -> stop gate -> run tools. The only part that acts.

Policies live in guards (_guards.py) and the contract (_contract.py); this module wires them.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._aio import CTRL_C, METER, Blocking, Expired, Meter, drive_sync, interrupted, prefers_async, within
from ._compact import Compaction
from ._contract import CheckedCall, ContractResult, check_reply, requested_max_tokens
from ._gate import ApprovalHook, UntrustedGate
from ._guards import Guard, Guards, default_guards
from ._json import MAX_DEPTH, depth, loggable
from ._limits import Limits, Policy
from ._messages import Reply, Request
from ._state import RunState
from ._stops import RunResult, Stop, StopError, StopReason
from .models._base import ON_RETRY, Model
from .runlog._schema import LogEvent
from .runlog._writer import FORMAT, VERSION, Abandoned, LogWriteError, RunLog
from .tools._executor import Executor, ToolResult, error_result
from .tools._registry import Registry, Tool, ToolKind

__all__ = ["run", "arun", "drive", "adrive", "new_state"]


async def arun(task: str, *, model: Model, tools: Iterable[Tool] | Registry = (), limits: Limits | None = None,
               policy: Policy | None = None, system: str | None = None, params: dict[str, Any] | None = None,
               log: RunLog | str | Path | None = None, guards: list[Guard] | None = None,
               executor: Executor | None = None, header: dict[str, Any] | None = None,
               gate: UntrustedGate | None = None, approve: ApprovalHook | None = None,
               compaction: Compaction | None = None,
               on_event: Callable[[LogEvent], None] | None = None) -> RunResult:
    """Run the fenced loop until it stops for a named reason: the core, on the running event loop.
    Every operation (model request, token count, tool, approval) is awaited under the run's limits:
    an async adapter (`acomplete`, `acount_tokens`, an `async def` tool) is awaited and cancelled at
    its deadline; a sync one runs on a worker thread and the run goes on without it at the deadline.

    Never raises for a stop; raises LogWriteError (an OSError) when the log cannot be written.
    Cancelling the task that awaits it (or an `asyncio.timeout` around it) ends the run `cancelled`:
    nothing new starts, the call in flight is cancelled or killed (its result `outcome_unknown`),
    every other requested call is answered `not_executed`, the stop line is written, and then
    CancelledError propagates, as asyncio expects (the stop is in the log: `runlog.read_log`).
    A SystemExit raised inside (by a model or a guard) ends the run `cancelled` and then propagates;
    a bug inside loopfence ends it `internal_error` with the traceback in the stop's data.
    Arguments as `run()`.
    """
    state, runlog, guard, exe = _start(task, model, tools, limits, policy, system, params, log, guards,
                                       executor, header, gate, approve, compaction, on_event)
    return await adrive(state, model, runlog, guard, exe)


def run(task: str, *, model: Model, tools: Iterable[Tool] | Registry = (), limits: Limits | None = None,
        policy: Policy | None = None, system: str | None = None, params: dict[str, Any] | None = None,
        log: RunLog | str | Path | None = None, guards: list[Guard] | None = None,
        executor: Executor | None = None, header: dict[str, Any] | None = None,
        gate: UntrustedGate | None = None, approve: ApprovalHook | None = None,
        compaction: Compaction | None = None, on_event: Callable[[LogEvent], None] | None = None) -> RunResult:
    """Run the fenced loop until it stops for a named reason (`arun()` on an event loop of its own;
    inside a running event loop, on a helper thread). Never raises for a stop; raises
    LogWriteError (an OSError) when the log cannot be written, ending the run where its log ends.
    Ctrl-C ends the run `cancelled` and returns its result (a second Ctrl-C raises KeyboardInterrupt).

    gate: the untrusted-content gate (default: UntrustedGate(approve); `approve` None denies);
    compaction: the outgoing-context policy (default: Compaction(); `Compaction.off()` disables);
    on_event: called with each typed event (runlog._schema) as it is written, header to stop.
    """
    state, runlog, guard, exe = _start(task, model, tools, limits, policy, system, params, log, guards,
                                       executor, header, gate, approve, compaction, on_event)
    return drive(state, model, runlog, guard, exe)


def _start(task: str, model: Model, tools: Iterable[Tool] | Registry, limits: Limits | None,
           policy: Policy | None, system: str | None, params: dict[str, Any] | None,
           log: RunLog | str | Path | None, guards: list[Guard] | None, executor: Executor | None,
           header: dict[str, Any] | None, gate: UntrustedGate | None, approve: ApprovalHook | None,
           compaction: Compaction | None,
           on_event: Callable[[LogEvent], None] | None = None) -> tuple[RunState, RunLog, Guards, Executor]:
    """The run's state, and its log with the header written."""
    registry = tools if isinstance(tools, Registry) else Registry(tools)
    task, system = loggable(task), system and loggable(system)  # as the header reads back (replay)
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": task}]
    gate = gate or UntrustedGate(approve)
    state = new_state(registry, limits or Limits(), policy or Policy(), params or {}, messages,
                      compaction or Compaction())
    runlog = log if isinstance(log, RunLog) else RunLog(log, t0=state.t0)
    if on_event is not None:
        runlog.on_event = on_event
    runlog.write("header", format=FORMAT, version=VERSION, run_id=uuid.uuid4().hex,
                 started_at=datetime.now(timezone.utc).isoformat(), task=task, system=system,
                 limits=state.limits.to_json(), policy=state.policy.to_json(), params=state.params,
                 tools=[{"kind": str(t.kind), "untrusted": t.untrusted, "privileged": t.privileged,
                         **t.schema()} for t in registry],
                 model=_describe(model), gate=gate.describe(), compaction=state.compaction.to_json(),
                 **_tool_info(registry), **(header or {}))
    return state, runlog, default_guards(state.limits, guards, gate), executor or Executor()


def _tool_info(registry: Registry) -> dict[str, Any]:
    """What tools report about themselves for the header (run_command: the bounds in force)."""
    info = {t.name: t.info for t in registry if t.info}
    return {"tool_info": info} if info else {}


def new_state(registry: Registry, limits: Limits, policy: Policy, params: dict[str, Any],
              messages: list[dict[str, Any]], compaction: Compaction | None = None) -> RunState:
    return RunState(limits, policy, registry, dict(params), messages=messages,
                    compaction=compaction or Compaction())


def drive(s: RunState, model: Model, log: RunLog, guards: Guards, executor: Executor) -> RunResult:
    """`adrive` from sync code (replay, resume, run()); Ctrl-C or a cancel returns the cancelled result."""
    return drive_sync(_to_stop(s, model, log, guards, executor), lambda: asyncio.CancelledError(CTRL_C))[0]


async def adrive(s: RunState, model: Model, log: RunLog, guards: Guards, executor: Executor) -> RunResult:
    """Run the ring from the current state to a stop; the stop is the log's last line. Cancelled:
    the run ends `cancelled`, then CancelledError propagates."""
    result, cancel = await _to_stop(s, model, log, guards, executor)
    if cancel is not None:
        raise cancel
    return result


async def _to_stop(s: RunState, model: Model, log: RunLog, guards: Guards,
                   executor: Executor) -> tuple[RunResult, asyncio.CancelledError | None]:
    """The run to its stop, whatever happens inside; (its result, the cancel that ended it)."""
    final: list[str | None] = [None, None]  # final answer, partial text of a cut-off reply
    s.log = log
    ops = _Ops(model, executor, s)
    meter = Meter()
    metered = METER.set(meter)
    stop: Stop | None = None
    cancel: asyncio.CancelledError | None = None
    exiting: BaseException | None = None
    try:
        stop = await _ring(s, ops, log, guards, final)
    except StopError as exc:
        stop = exc.stop
    except asyncio.CancelledError as exc:
        cancel = exc
        stop = Stop(StopReason.CANCELLED, CTRL_C if exc.args == (CTRL_C,) else "cancelled: the task awaiting the run was cancelled")
    except KeyboardInterrupt:
        stop = Stop(StopReason.CANCELLED, CTRL_C)
    except (LogWriteError, Abandoned):  # nothing more can be logged, or the log is not ours to end
        log.close()
        raise
    except SystemExit as exc:  # an exit asked for inside the run: the run ends named, then it exits
        exiting = exc
        stop = Stop(StopReason.CANCELLED, f"SystemExit({exc.code!r}) was raised inside the run")
    except BaseException as exc:  # noqa: BLE001 - even a bug in loopfence must end the run named
        stop = Stop(StopReason.INTERNAL_ERROR, f"internal error in loopfence, please report it: "
                    f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()})
    finally:
        METER.reset(metered)
        if stop is not None:
            result = _finish(s, log, stop, final)
    if exiting is not None:
        raise exiting
    return _with_cpu(result, meter.cpu), cancel


def _finish(s: RunState, log: RunLog, stop: Stop, final: list[str | None]) -> RunResult:
    """Every requested call gets exactly one result; the stop is the log's last line."""
    for call in list(s.pending):
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


def _with_cpu(result: RunResult, cpu: float) -> RunResult:
    return RunResult(result.stop, result.final_answer, result.ledger, result.messages, result.log_path,
                     result.partial_text, round(cpu, 6))


class _Ops:
    """The run's operations, each awaited under its deadline: async adapters are awaited, sync ones
    run on a worker thread (the most derived of a pair wins: see prefers_async)."""

    def __init__(self, model: Model, executor: Executor, s: RunState) -> None:
        self.complete: Callable[[Request], Awaitable[Reply]] = \
            model.acomplete if prefers_async(model, "complete", "acomplete") else \
            (lambda request: Blocking(model.complete, request))  # type: ignore[attr-defined]
        count: Any = None
        if prefers_async(model, "count_tokens", "acount_tokens"):
            count = model.acount_tokens  # type: ignore[attr-defined]
        elif callable(sync := getattr(model, "count_tokens", None)):
            count = lambda messages, tools: Blocking(sync, messages, tools)  # noqa: E731
        self.count = count
        s.counts_tokens = count is not None  # exact counts when the model offers them
        self.execute: Callable[..., Awaitable[ToolResult]] = \
            executor.aexecute if prefers_async(executor, "execute", "aexecute") else \
            (lambda t, args, timeout_s: Blocking(executor.execute, t, args, timeout_s))


async def _ring(s: RunState, ops: _Ops, log: RunLog, guards: Guards, final: list[str | None]) -> Stop:
    while True:
        if s.needs_count():
            await _count(s, ops)
        if stop := guards.before_request(s):
            return stop
        estimate = s.next_prompt_estimate()
        request = s.request()
        log.write("request", step=request.step, fingerprint=s.request_fingerprint(),
                  n_messages=len(request.messages), prompt_estimate=estimate, params=request.params)
        s.ledger.model_requests += 1
        started = time.monotonic()
        reply = await _send(s, ops, request)  # send
        prompt, completion = s.remember(reply, estimate)  # remember
        log.write("reply", step=request.step, raw=reply.raw, complete=reply.complete,
                  problem=reply.problem, finish_reason=reply.finish_reason,
                  usage={"prompt_tokens": prompt, "completion_tokens": completion,
                         "reported": reply.usage is not None and reply.usage.prompt_tokens is not None,
                         **s.charge_note},
                  duration_s=round(time.monotonic() - started, 6))
        checked = check_reply(reply, s.registry, requested_max_tokens(s.params))
        calls, stop, results = _settle_contract(s, log, reply, checked, final)  # stop gate
        if stop:
            return stop
        guards.on_reply(s, calls)
        for c in calls:  # run tools: one execution = one count
            cached = s.cache.get(c.key) if c.tool.kind is ToolKind.READ_ONLY else None
            verdict = guards.before_execution(s, c, cached is not None)
            if isinstance(verdict, Awaitable):  # a decision that waits (the gate's approval hook)
                verdict = await verdict
            if isinstance(verdict, Stop):
                return verdict
            result = verdict or (cached.as_reused() if cached else await _execute(s, log, ops, c))
            s.cache.record(c.tool, c.key, result)
            _record(s, log, c.call, result, c.key, logged_intent=result.decision == "executed")
            results.append(result)
            if stop := guards.after_execution(s, c, result):
                return stop
        if stop := guards.after_turn(s, results):
            return stop


async def _count(s: RunState, ops: _Ops) -> None:
    """The model's own count of the next prompt, bounded by the run's clock; a courtesy: whatever
    goes wrong, the estimate holds."""
    if interrupted():
        raise KeyboardInterrupt
    try:
        counted = await within(s.deadline(), ops.count(s.view.messages, s.registry.schemas()))
    except (Expired, Exception):  # noqa: BLE001
        counted = None
    s.set_count(counted)


async def _send(s: RunState, ops: _Ops, request: Request) -> Reply:
    """One request. Whatever an adapter raises ends the run as endpoint_error, never as a traceback;
    so does a reply nested too deep for the log to record and read back. Past max_wall_seconds the
    run goes on without the request (it stops max_wall_seconds)."""
    if interrupted():
        raise KeyboardInterrupt
    live = [True]  # a retry reported after the request ended (an abandoned worker) is not this run's

    def retried(attempt: int, status: int | None, wait_s: float, reason: str) -> None:
        if live[0] and s.log is not None:
            s.log.write("retry", step=request.step, attempt=attempt, status=status, wait_s=wait_s,
                        reason=reason)

    reporting = ON_RETRY.set(retried)
    try:
        reply = await within(s.deadline(), ops.complete(request))
    except Expired:
        limit, elapsed = s.limits.max_wall_seconds, s.elapsed()
        raise StopError(StopReason.MAX_WALL_SECONDS, f"{elapsed:.2f}s elapsed: the model request was still "
                        f"running at max_wall_seconds={limit:g}; the run went on without it",
                        limit=limit, value=round(elapsed, 3)) from None
    except StopError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise StopError(StopReason.ENDPOINT_ERROR,
                        f"the model adapter raised {type(exc).__name__}: {exc}") from exc
    finally:
        live[0] = False
        ON_RETRY.reset(reporting)
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


async def _execute(s: RunState, log: RunLog, ops: _Ops, c: CheckedCall) -> ToolResult:
    if interrupted():
        raise KeyboardInterrupt
    s.in_flight = c.call  # intent logged, outcome not yet: a stop now leaves it outcome_unknown
    log.write("call", step=s.ledger.model_requests, tool_call_id=c.call.id, name=c.tool.name,
              raw_arguments=c.call.raw_arguments, arguments=c.args, key=c.key, kind=str(c.tool.kind),
              decision="executed", intent=True)
    result = await ops.execute(c.tool, c.args, s.tool_timeout())
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
