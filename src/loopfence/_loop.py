"""The ring: send -> remember -> stop gate -> run tools. The only part that acts.

Policies live in guards (_guards.py) and the contract (_contract.py); this module wires them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict

from ._aio import CTRL_C, METER, Meter, checkpoint, in_thread, prefers_async, run_sync, waited
from ._answer import AnswerArg
from ._compact import Compaction
from ._conversation import Task
from ._contract import CheckedCall, check_reply, requested_max_tokens
from ._gate import ApprovalHook, UntrustedGate
from ._guards import Guard, Guards
from ._json import MAX_DEPTH, depth
from ._limits import Limits, Policy
from ._messages import Reply, Request
from ._prices import PricesArg
from ._state import RunState
from ._setup import describe_model, new_state, set_price, start
from ._steps import (announce, close_reply, deliver_note, end_turn, finish, on_the_clock, open_request,
                     past_the_clock, run_call, settle, settle_contract)
from ._stops import RunResult, Stop, StopError, StopReason
from .models._base import ON_RETRY, ON_TEXT, Model
from ._log._schema import LastAnswerLine, LogEvent, RetryLine
from ._log._writer import Abandoned, LogWriteError, RunLog
from .tools._executor import Executor, ToolResult
from .tools._registry import Registry, Tool

__all__ = ["Settings", "RunSettings", "LogArg", "to_stop", "arun_with", "drive", "adrive", "new_state",
           "check_price", "check_model", "LAST_ANSWER_FOR", "last_answer_prompt"]


LimitsArg = Limits | Mapping[str, Any] | str | None  # a dict of Limits' field names, or a profile's name
PolicyArg = Policy | Mapping[str, Any] | None
LogArg = RunLog | str | Path | None


class Settings(TypedDict, total=False):
    """A run's settings after its model and log: `run()`'s, `arun()`'s and `stream()`'s keywords,
    `Agent(...)`'s fields (docs/python-api.md, "Running a loop")."""

    tools: Iterable[Tool | Callable[..., Any]] | Registry
    limits: LimitsArg
    policy: PolicyArg
    system: str | None
    params: Mapping[str, Any] | None
    on_event: Callable[[LogEvent], None] | None
    guards: Iterable[Guard] | None
    gate: UntrustedGate | None
    approve: ApprovalHook | None
    compaction: Compaction | None
    prices: PricesArg
    answer: AnswerArg
    answer_retries: int
    header: Mapping[str, Any] | None
    executor: Executor | None


class RunSettings(Settings, total=False):
    """Everything one run takes: its settings, its model and its log (a path or a RunLog)."""

    model: Model
    log: LogArg


async def to_stop(task: Task, settings: RunSettings) -> tuple[RunResult, asyncio.CancelledError | None]:
    """The run of `task` under `settings` to its named stop: (its result, the cancel that ended it,
    if one did). Every run goes through here (an `Agent`'s; `run()`, `arun()`, `stream()` make one):
    `arun()` raises that cancel once the stop is written, `run()` returns the result."""
    model = settings["model"]
    check_model(model)
    get = settings.get
    params, header, guards = get("params"), get("header"), get("guards")
    state, runlog, guard, exe = start(task, model, get("tools", ()), get("limits"), get("policy"),  # type: ignore[arg-type]
                                      get("system"), None if params is None else dict(params), get("log"),
                                      None if guards is None else list(guards), get("executor"),
                                      None if header is None else dict(header), get("gate"), get("approve"),
                                      get("compaction"), get("on_event"), get("prices"),
                                      get("answer"), get("answer_retries", 1))
    return await _to_stop(state, model, runlog, guard, exe)


async def arun_with(task: Task, settings: RunSettings) -> RunResult:
    """`to_stop`, as `arun()` ends: a cancel that ended the run propagates once its stop is written."""
    result, cancel = await to_stop(task, settings)
    if cancel is not None:
        raise cancel
    return result


def check_price(model: Model, limits: Limits, prices: PricesArg = None,
                params: dict[str, Any] | None = None) -> None:
    """The PriceError run() would raise at its start, without starting a run (the CLI asks before it
    makes the log file)."""
    set_price(RunState(limits, Policy(), Registry(()), dict(params or {})), model, describe_model(model), prices)


def check_model(model: Any) -> None:
    """TypeError, before the run starts, for a `model=` that is not a model adapter (a model's name)."""
    if isinstance(model, str):
        raise TypeError(f"model= takes a model adapter, not a name: for {model!r} on an OpenAI-compatible "
                        f"endpoint, model=OpenAIModel(base_url=\"https://api.openai.com/v1\", model={model!r}) "
                        f"(or OpenAIModel.from_env(model={model!r}): LOOPFENCE_BASE_URL, LOOPFENCE_API_KEY); "
                        f"also LocalModel() or ScriptedModel([...])")
    if not any(callable(getattr(model, m, None)) for m in ("complete", "acomplete")):
        raise TypeError(f"model= must have complete(request) or async acomplete(request) (the Model "
                        f"protocol), got {type(model).__name__}")


def drive(s: RunState, model: Model, log: RunLog, guards: Guards, executor: Executor) -> RunResult:
    """`adrive` from sync code (replay, resume): the one bridge (`_aio.run_sync`); Ctrl-C or
    a cancel returns the cancelled result."""
    return run_sync(_to_stop(s, model, log, guards, executor))[0]


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
    log.hold = True  # two writes a step: the ring flushes before each operation it awaits
    ops = _Ops(model, executor, s)
    meter = Meter()
    metered = METER.set(meter)
    listened = _listen(s)  # the text streamed of the reply still awaited, kept in s.streamed
    stop: Stop | None = None
    cancel: asyncio.CancelledError | None = None
    exiting: BaseException | None = None
    last: str | None = None
    try:
        try:
            stop = await on_the_clock(s, _ring(s, ops, log, guards, final))
        except StopError as exc:
            stop = exc.stop
        except asyncio.CancelledError as exc:
            cancel = exc
            stop = Stop(StopReason.CANCELLED, CTRL_C if exc.args == (CTRL_C,) else "cancelled: the task awaiting the run was cancelled")
        except KeyboardInterrupt:
            stop = Stop(StopReason.CANCELLED, CTRL_C)
        except (LogWriteError, Abandoned):  # nothing more can be logged, or the log is not ours to end
            raise
        except SystemExit as exc:  # an exit asked for inside the run: the run ends named, then it exits
            exiting = exc
            stop = Stop(StopReason.CANCELLED, f"SystemExit({exc.code!r}) was raised inside the run")
        except BaseException as exc:  # noqa: BLE001 - even a bug in loopfence must end the run named
            stop = Stop(StopReason.INTERNAL_ERROR, f"internal error in loopfence, please report it: "
                        f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()})
        if s.policy.last_answer and stop.reason in LAST_ANSWER_FOR:
            settle(s, log, stop)  # the stopped turn's calls have their results before it is asked
            last, late = await _last_answer(s, ops, log, guards, stop)
            if isinstance(late, asyncio.CancelledError):
                cancel = late
            elif late is not None:
                exiting = late
    except (LogWriteError, Abandoned):
        stop = None  # no stop line: it could not be written, or the log is not ours to end
        log.close()
        raise
    finally:
        METER.reset(metered)
        if listened is not None:
            ON_TEXT.reset(listened)
        if stop is not None:
            if final[0] is None and final[1] is None and s.streamed.get(s.ledger.model_requests):
                final[1] = "".join(s.streamed[s.ledger.model_requests])  # stopped mid-reply (a client gone)
            result = finish(s, log, stop, final, last)
    if exiting is not None:
        raise exiting
    return _with_cpu(result, meter.cpu), cancel


def _listen(s: RunState) -> Any:
    """A streamed run (someone listens to its text: ON_TEXT) keeps the pieces of the reply it awaits
    in `s.streamed` as they pass on: a run stopped before that reply is whole (cancelled, a client
    gone, the clock) keeps them as its partial_text. The ON_TEXT token to reset, or None."""
    report = ON_TEXT.get()
    if report is None:
        return None

    def tee(step: int, text: str) -> None:
        if step not in s.streamed:
            s.streamed.clear()  # only the awaited reply's
            s.streamed[step] = []
        s.streamed[step].append(text)
        report(step, text)
    return ON_TEXT.set(tee)


# The stops a last answer is asked after (Policy(last_answer=True)): budgets on the work, and loops.
LAST_ANSWER_FOR = frozenset({StopReason.MAX_STEPS, StopReason.MAX_TOOL_CALLS, StopReason.MAX_WALL_SECONDS,
                             StopReason.NO_PROGRESS, StopReason.REPEATED_CALL, StopReason.REPEATED_RESULT,
                             StopReason.GUARD})


def last_answer_prompt(stop: Stop) -> str:
    """What the last answer's request asks (the reason and its limit only: the same text on replay)."""
    limit = stop.data.get("limit")
    what = f"{stop.reason}={limit:g}" if isinstance(limit, float) else \
        f"{stop.reason}={limit}" if limit is not None else str(stop.reason)
    return (f"loopfence: the run has stopped ({what}) and no more tools can be called. Answer the task now, "
            "as well as you can from what you already know; say what is missing or uncertain.")


async def _last_answer(s: RunState, ops: _Ops, log: RunLog, guards: Guards,
                       stop: Stop) -> tuple[str | None, BaseException | None]:
    """Policy(last_answer=True): one more request, tools disabled (`tool_choice: "none"`), its output
    bounded by last_answer_tokens. It is the one request allowed past max_steps; every other
    before_request guard must let it through (tokens, dollars, time left), else it is skipped. A
    `last_answer` event says it was asked, skipped or failed, and why. (the answer, or None; a
    cancel or exit that came while it was asked, raised once the stop line is written.)"""
    step = s.ledger.model_requests + 1
    s.final_request = True

    def failed(reason: str | None, detail: str) -> None:
        log.write(LastAnswerLine(step=step, decision="failed", reason=reason, detail=detail))

    try:
        s.append({"role": "user", "content": last_answer_prompt(stop)})
        if s.needs_count():
            await _count(s, ops)
        if (no := guards.before_request(s)) is not None:
            est = no.data.get("prompt_estimate")  # the figure a prompt budget judged (replay counts with it)
            log.write(LastAnswerLine(step=step, decision="skipped", reason=no.reason, detail=no.detail,
                                     **({"prompt_estimate": est} if est is not None else {})))
            return None, None
        log.write(LastAnswerLine(step=step, decision="asked", reason=None,
                                 detail=f"after {stop.reason}: one request with tools disabled",
                                 max_tokens=s.max_tokens()))
        reply = await on_the_clock(s, _ask(s, ops, log))
        if reply.complete and (reply.content or "").strip():
            return reply.content, None
        failed(None, "the reply was cut off: " + (reply.problem or "incomplete") if not reply.complete else
               "the reply asked for tools (they are not run)" if reply.tool_calls else "the reply had no text")
        return None, None
    except (LogWriteError, Abandoned):
        raise
    except StopError as exc:
        failed(str(exc.stop.reason), exc.stop.detail)
        return None, None
    except asyncio.CancelledError as exc:
        failed(str(StopReason.CANCELLED), "cancelled while the last answer was asked")
        return None, exc
    except KeyboardInterrupt:
        failed(str(StopReason.CANCELLED), CTRL_C)
        return None, None
    except SystemExit as exc:
        failed(str(StopReason.CANCELLED), f"SystemExit({exc.code!r}) was raised inside the run")
        return None, exc
    except Exception as exc:  # noqa: BLE001 - the run has its stop already; say why there is no answer
        failed(str(StopReason.INTERNAL_ERROR), f"internal error in loopfence, please report it: "
               f"{type(exc).__name__}: {exc}")
        return None, None
    finally:
        s.final_request = False


def _with_cpu(result: RunResult, cpu: float) -> RunResult:
    return dataclasses.replace(result, cpu_s=round(cpu, 6))


class _Ops:
    """The run's operations: async adapters are awaited, sync ones run on the worker pool (the most
    derived of a pair wins: see prefers_async)."""

    def __init__(self, model: Model, executor: Executor, s: RunState) -> None:
        self.complete: Callable[[Request], Awaitable[Reply]] = \
            model.acomplete if prefers_async(model, "complete", "acomplete") else \
            (lambda request: in_thread(model.complete, request))  # type: ignore[attr-defined]
        count: Any = None
        if prefers_async(model, "count_tokens", "acount_tokens"):
            count = model.acount_tokens  # type: ignore[attr-defined]
        elif callable(sync := getattr(model, "count_tokens", None)):
            count = lambda messages, tools: in_thread(sync, messages, tools)  # noqa: E731
        self.count = count
        s.counts_tokens = count is not None  # exact counts when the model offers them
        self.execute: Callable[..., Awaitable[ToolResult]] = \
            executor.aexecute if prefers_async(executor, "execute", "aexecute") else \
            (lambda t, args, timeout_s: in_thread(executor.execute, t, args, timeout_s))


async def _ring(s: RunState, ops: _Ops, log: RunLog, guards: Guards, final: list[str | None]) -> Stop:
    execute = lambda c: _execute(s, log, ops, c)  # noqa: E731
    while True:
        if s.needs_count():
            await _count(s, ops)
        if stop := guards.before_request(s):
            return stop
        reply = await _ask(s, ops, log)  # send, remember
        checked = check_reply(reply, s.registry, requested_max_tokens(s.params))
        calls, stop, results = settle_contract(s, log, reply, checked, final)  # stop gate
        if stop:
            return stop
        guards.on_reply(s, calls)
        for c in calls:  # run tools: one execution = one count
            _, stop = await run_call(s, log, guards, c, execute, results)
            if stop:
                return stop
        if stop := end_turn(s, log, guards, calls, results):
            return stop
        deliver_note(s)  # a nudge raised after an execution: after the turn's results


async def _ask(s: RunState, ops: _Ops, log: RunLog) -> Reply:
    """One request and its reply, logged and charged (tokens; dollars where the run has a price)."""
    request, estimate = open_request(s, log)
    started = time.monotonic()
    reply = await _send(s, ops, request)  # send
    close_reply(s, log, request.step, reply, estimate, started)  # remember
    return reply


async def _count(s: RunState, ops: _Ops) -> None:
    """The model's own count of the next prompt, bounded by the run's clock; a courtesy: whatever
    goes wrong, the estimate holds."""
    await checkpoint()
    if s.log is not None:
        s.log.flush()  # the file is whole while the run waits
    s.doing = "the token count"
    try:
        counted = await waited(ops.count(s.view.messages, s.registry.schemas()))
    except Exception:  # noqa: BLE001
        counted = None
    s.set_count(counted)


async def _send(s: RunState, ops: _Ops, request: Request) -> Reply:
    """One request. Whatever an adapter raises ends the run as endpoint_error, never as a traceback;
    so does a reply nested too deep for the log to record and read back. Past max_wall_seconds the
    run goes on without the request (it stops max_wall_seconds: `on_the_clock`)."""
    await checkpoint()
    s.doing = "the model request"
    live = [True]  # a retry reported after the request ended (an abandoned worker) is not this run's

    def retried(attempt: int, status: int | None, wait_s: float, reason: str) -> None:
        if live[0] and s.log is not None:
            s.log.write(RetryLine(step=request.step, attempt=attempt, status=status, wait_s=wait_s, reason=reason))

    reporting = ON_RETRY.set(retried)
    try:
        await past_the_clock(s)  # a deadline already passed starts nothing
        reply = await waited(ops.complete(request))
    except StopError:
        await past_the_clock(s)  # an adapter's failure after the deadline: the clock's stop
        raise
    except Exception as exc:  # noqa: BLE001
        await past_the_clock(s)
        raise StopError(StopReason.ENDPOINT_ERROR,
                        f"the model adapter raised {type(exc).__name__}: {exc}") from exc
    finally:
        live[0] = False
        ON_RETRY.reset(reporting)
    if not isinstance(reply, Reply):
        raise StopError(StopReason.ENDPOINT_ERROR, f"the model adapter returned {type(reply).__name__}, "
                        "not a Reply")
    await past_the_clock(s)  # it blocked the loop, or kept on past the cancel: not used
    levels = max([depth(reply.raw), *(depth(c.arguments) for c in reply.tool_calls)])
    if levels > MAX_DEPTH:
        raise StopError(StopReason.ENDPOINT_ERROR, f"the reply is nested {levels:,} levels deep (the "
                        f"limit is {MAX_DEPTH}): the log could not record it")
    return reply


async def _execute(s: RunState, log: RunLog, ops: _Ops, c: CheckedCall) -> ToolResult:
    await checkpoint()
    s.doing = f"the call to {c.tool.name}"
    announce(s, log, c)  # intent logged, outcome not yet: a stop now leaves it outcome_unknown
    result = await waited(ops.execute(c.tool, c.args, s.tool_timeout()))
    s.in_flight = None
    return result
