"""The fence around another framework's agent: the ring's steps, run around the framework's own
model requests and tool calls.

An adapter (one module per framework: `loopfence.integrations.pydantic_ai`, ...) drives one
`FencedRun` per agent run, in the order the ring would:

    run = fence.start(task, [fence.tool(name, schema, description) ...], framework="...")
    reply = await run.model_request(send, to_reply)  # before_request guards, the request and reply
                                                     # events, the contract; the framework's response
    value = await run.call(call_id, execute)         # one requested call: the read-only cache, the
                                                     # before_execution guards (and the untrusted-
                                                     # content gate), the framework's own tool
                                                     # function, the result events, after_execution
    result = run.finish(...)                         # the stop line, the ledger: a RunResult

`end_turn()` (after_turn: no_progress, a nudge that is due) runs by itself before the next request.
A framework whose hooks are plain functions calls `model_request_sync(send, to_reply)` and
`call_sync(call_id, execute)` instead, with blocking `send`/`execute`: the same async core through
the one bridge (`_aio.run_sync`), the blocking call on the worker pool while a clock is set.
Every step is the ring's own (`loopfence._steps`), over the same `Guards` and `RunState`, so a fenced
run's log folds through the ring: `loopfence reconcile` checks it like any other.

A stop ends the framework's run by raising `FenceStop` (an adapter may raise a subclass that is also
its framework's own run error), carrying the `Stop`: its reason, detail, limit and value. Whatever the
framework itself raises (a model error, a tool's exception) is re-raised unchanged, after the run's
stop is written. The framework's own limit (pydantic-ai's request_limit, the Agents SDK's max_turns)
is a named end, not a bug: the adapter's `limit_of` recognizes its error, and the stop is
`framework_limit`, naming the limit and its value (`framework_limit(...)`); replay ends where it did.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic_core import to_jsonable_python

from .._aio import CTRL_C, in_thread, run_sync, waited
from .._contract import CheckedCall, check_reply, requested_max_tokens
from .._guards import Guards
from .._messages import Reply, Request
from .._state import RunState
from .._steps import (announce, close_reply, deliver_note, end_turn, finish, on_the_clock, open_request, record,
                      run_call, settle_contract)
from .._stops import RunResult, Stop, StopError, StopReason
from .._log._writer import RunLog
from ..tools._executor import Executor, ToolResult, refusal

if TYPE_CHECKING:
    from ._config import Fence

__all__ = ["FencedRun", "FenceStop", "LimitOf", "framework_call", "framework_limit", "versions"]

T = TypeVar("T")
ORDER_GRACE_S = 2.0  # call_sync: how long a call waits for an earlier call of its reply to be passed in
LimitOf = Callable[[BaseException], "Stop | None"]  # the framework's own limit an error reports, as its stop


def framework_limit(framework: str, said: BaseException | str, name: str | None, limit: Any = None) -> Stop:
    """The stop for a framework's own limit that ended its run (`said`: the error it raised, or the
    message it ended the run with): `framework_limit`, its detail naming the limit and its value
    (`request_limit=3`), its data {"framework", "name", "limit", "error"} (`name`, `limit` None: what
    the framework does not name)."""
    what = f"its {name}={limit}" if name is not None and limit is not None else \
        f"its {name}" if name is not None else "a limit of its own"
    raised = isinstance(said, BaseException)
    data = {"framework": framework, **{k: v for k, v in (("name", name), ("limit", limit)) if v is not None},
            **({"error": type(said).__name__} if raised else {})}
    return Stop(StopReason.FRAMEWORK_LIMIT, f"{framework} ended the run at {what}: "
                f"{f'{type(said).__name__}: ' if raised else ''}{said}", data)


class FenceStop(Exception):
    """A loopfence stop ending a framework's run. `stop` is the `Stop` (reason, detail, data);
    `result` the run's `RunResult` (ledger, log path), written before this was raised."""

    def __init__(self, stop: Stop, result: RunResult | None = None) -> None:
        super().__init__(f"loopfence stopped the run: {stop.reason}: {stop.detail}")
        self.stop = stop
        self.result = result
        self.message = str(self)  # what a framework's own error types print (AgentRunError, AgentsException)

    @property
    def reason(self) -> StopReason:
        return self.stop.reason

    @property
    def detail(self) -> str:
        return self.stop.detail

    @property
    def limit(self) -> Any:
        """The limit the stop names (max_steps=8: 8), or None."""
        return self.stop.data.get("limit")

    @property
    def value(self) -> Any:
        """The value that reached it (the 9th request: 9), or None."""
        return self.stop.data.get("value")


# the framework's own function for the call being executed (set by FencedRun._execute around it)
_RUNNING: ContextVar[Callable[[], Awaitable[Any]] | None] = ContextVar("loopfence_fenced_call", default=None)


async def framework_call(**_: Any) -> Any:
    """Every fenced tool's function: the framework's own, for the call loopfence is executing."""
    execute = _RUNNING.get()
    if execute is None:
        raise RuntimeError("a fenced tool runs the framework's own function, given to FencedRun.call")
    return await execute()


@dataclass
class _Turn:
    """The calls one reply asked for, by id, and the results given so far (the ring's `results`)."""

    calls: list[CheckedCall]
    rejected: dict[str, ToolResult]  # feedback mode: the contract's answer to a malformed call
    results: list[ToolResult] = field(default_factory=list)
    waiting: dict[str, list[CheckedCall]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.calls:
            self.waiting.setdefault(c.call.id, []).append(c)

    def take(self, call_id: str) -> CheckedCall | None:
        queue = self.waiting.get(call_id)
        return queue.pop(0) if queue else None


class FencedRun:
    """One framework run under the fence. Its methods are the ring's phases; see the module doc."""

    def __init__(self, fence: Fence, state: RunState, log: RunLog, guards: Guards,
                 stop_error: type[FenceStop] = FenceStop, *, limit_of: LimitOf | None = None) -> None:
        self.fence = fence
        self.limit_of = limit_of
        self.state = state
        self.log = log
        self.guards = guards
        self.stop_error = stop_error
        self.final: list[str | None] = [None, None]  # final answer, partial text of a cut-off reply
        self.result: RunResult | None = None
        self.turn: _Turn | None = None
        self.answer: Stop | None = None  # a reply with no calls: the stop, once the framework ends its run
        self._asked: tuple[int, int, float] | None = None  # the open request: step, estimate, start
        self._lock = asyncio.Lock()  # one call at a time, as the ring runs them
        self._executor = Executor(fence.result_cap)
        self._sync_lock = threading.Lock()
        self._turn_taken = threading.Condition(self._sync_lock)  # a call of the reply has run (call_sync)
        state.log = log

    @property
    def finished(self) -> bool:
        return self.result is not None

    # -- a model request ---------------------------------------------------------------------------
    async def before_request(self) -> tuple[Request, str | None]:
        """Before the framework sends a request: the turn before it ends (after_turn), the budgets
        are checked, and the request is logged and counted. (the request as loopfence sees it: its
        `max_tokens` is the bound to send; a nudge to add to the conversation as a user message, or
        None). Raises the stop."""
        self._refuse_if_finished()
        if self.answer is not None:  # the framework asks again after an answer: the ring ended there
            raise self._stop(replace(self.answer, detail=self.answer.detail + "; the framework asked the model "
                                     "again after it (its output validation?): the fence ends runs at the answer"))
        note = self.end_turn()
        if stop := self.guards.before_request(self.state):
            raise self._stop(stop)
        request, estimate = open_request(self.state, self.log)
        self._asked = (request.step, estimate, time.monotonic())
        return request, note

    def reply(self, reply: Reply) -> list[CheckedCall]:
        """The framework's response, as a loopfence Reply: charged, logged, then the contract (complete?
        valid JSON? known tool? schema?) and on_reply. The calls that may run; raises the stop. A reply
        with no calls is the answer: the run stops there once the framework ends it (`finish()`)."""
        self._refuse_if_finished()
        if self._asked is None:
            raise RuntimeError("FencedRun.reply() without before_request()")
        step, estimate, started = self._asked
        self._asked = None
        s = self.state
        close_reply(s, self.log, step, reply, estimate, started)
        checked = check_reply(reply, s.registry, requested_max_tokens(s.params))
        calls, stop, given = settle_contract(s, self.log, reply, checked, self.final)
        if stop is not None and stop.reason is StopReason.FINAL_ANSWER:
            self.answer = stop
            return []
        if stop is not None:
            raise self._stop(stop)
        self.guards.on_reply(s, calls)
        rejected = {v.call.id: r for v, r in zip(checked.violations, given, strict=True) if v.call is not None}
        self.turn = _Turn(calls, rejected, list(given))
        return calls

    async def model_request(self, send: Callable[[Request, str | None], Awaitable[T]],
                            to_reply: Callable[[T], Reply]) -> T:
        """One model request the framework makes: `before_request`, then `send(request, note)` (the
        framework's own request; `request.max_tokens` is the bound to send, `note` a nudge to add as a
        user message, or None) under the run's wall clock, then `reply(to_reply(response))`. The
        framework's response; raises the stop. What `send` raises ends the run `endpoint_error` (or
        `framework_limit`, the framework's own limit checked in the request) and is raised on
        unchanged, after the stop is written."""
        request, note = await self.before_request()
        try:
            self.state.doing = "the model request"
            response = await on_the_clock(self.state, waited(send(request, note)))
        except StopError as exc:  # past max_wall_seconds
            raise self._stop(exc.stop) from None
        except TimeoutError:  # the framework's own timeout: its error
            self.finish(Stop(StopReason.ENDPOINT_ERROR, "the model request raised TimeoutError"))
            raise
        except asyncio.CancelledError:
            self.finish(cancelled=True)
            raise
        except FenceStop:
            raise
        except BaseException as exc:
            self.finish(self._limit(exc) or Stop(StopReason.ENDPOINT_ERROR,
                                                 f"the model request raised {type(exc).__name__}: {exc}"))
            raise
        self.reply(to_reply(response))
        return response

    # -- one tool call -----------------------------------------------------------------------------
    async def call(self, call_id: str, execute: Callable[[], Awaitable[Any]]) -> Any:
        """One call of the last reply, as the framework runs it: answered from the read-only cache,
        refused (the gate, a guard's refusal, a nudge), or executed by `execute()` (the framework's
        own tool function) under tool_timeout_s (a second scope). What the framework gets back: the
        function's own value when it ran, else the result text loopfence gives the model. Raises the stop; what
        `execute()` raises is recorded as the call's error result and raised on unchanged."""
        self._refuse_if_finished()
        turn = self.turn
        if turn is not None and call_id in turn.rejected:  # feedback mode: the contract answered it
            return turn.rejected.pop(call_id).content
        c = turn.take(call_id) if turn is not None else None
        if c is None or turn is None:  # not asked for by a reply of this run (a resumed deferred call)
            return await execute()
        async with self._lock:
            self._refuse_if_finished()
            ran: list[Any] = []  # the value, or ("raised", exc)
            result, stop = await run_call(self.state, self.log, self.guards, c,
                                          lambda checked: self._execute(checked, execute, ran), turn.results)
        if stop is not None:
            raise self._stop(stop)
        assert result is not None
        if ran and result.decision == "executed":
            if isinstance(ran[0], _Raised):
                raise ran[0].exc
            return ran[0]
        return result.content

    async def _execute(self, c: CheckedCall, execute: Callable[[], Awaitable[Any]], ran: list[Any]) -> ToolResult:
        """The framework's function, run by loopfence's executor (timeout, structured errors, the
        result cap): its value is kept for the framework, its exception for raising on."""
        async def fn() -> Any:
            try:
                value = await execute()
            except Exception as exc:  # the model gets the error as a result; the framework its exception
                ran.append(_Raised(exc))
                raise
            ran.append(value)
            return value if type(value) is str else to_jsonable_python(value, fallback=repr)  # what the log holds

        announce(self.state, self.log, c)
        token = _RUNNING.set(fn)
        try:
            result = await self._executor.aexecute(c.tool, c.args, self.state.tool_timeout())
        finally:
            _RUNNING.reset(token)
        self.state.in_flight = None
        return result

    # -- from sync code (a framework whose hooks are plain functions) -------------------------------
    def model_request_sync(self, send: Callable[[Request, str | None], T], to_reply: Callable[[T], Reply]) -> T:
        """`model_request` for a framework calling from sync code, with a blocking `send`, through the
        one bridge (`_aio.run_sync`). Under a wall clock `send` runs on the worker pool, so the clock
        can cut it (the run goes on without it); without one, right here."""
        timed = self.state.deadline() is not None

        async def asend(request: Request, note: str | None) -> T:
            return await in_thread(send, request, note) if timed else send(request, note)

        with self._sync_lock:
            return _bridged(self.model_request(asend, to_reply))

    def call_sync(self, call_id: str, execute: Callable[[], Any]) -> Any:
        """`call` for a framework calling from sync code, with a blocking `execute`, through the one
        bridge. One reply's calls arriving on several threads at once run one at a time, in the
        reply's order (as the ring runs them; a call not passed to the fence within ORDER_GRACE_S is
        not waited for). Under a timeout `execute` runs on the worker pool, so tool_timeout_s can cut
        it; without one, right here."""
        timed = self.state.tool_timeout() is not None

        async def aexecute() -> Any:
            return await in_thread(execute) if timed else execute()

        with self._sync_lock:
            self._await_turn(call_id)
            try:
                return _bridged(self.call(call_id, aexecute))
            finally:
                self._turn_taken.notify_all()

    def _await_turn(self, call_id: str) -> None:
        """Wait (holding the sync lock between waits) until `call_id` is the reply's first call not yet run."""
        give_up = time.monotonic() + ORDER_GRACE_S
        while self.result is None and (first := self._first_waiting(call_id)) is not None and first != call_id:
            left = give_up - time.monotonic()
            if left <= 0 or not self._turn_taken.wait(left):
                return

    def _first_waiting(self, call_id: str) -> str | None:
        """The id of the reply's first call not yet taken, when `call_id` is one still to take; else None."""
        turn = self.turn
        if turn is None or not turn.waiting.get(call_id):
            return None
        return next((c.call.id for c in turn.calls if c in turn.waiting.get(c.call.id, ())), None)

    def end_turn(self) -> str | None:
        """Once every call of the last reply has its result (the next request calls this itself):
        after_turn (no_progress, a nudge that is due). A nudge to add to the conversation as a user
        message, or None; raises the stop. Calls the framework never ran are answered not_executed."""
        turn, self.turn = self.turn, None
        if turn is None:
            return None
        s = self.state
        for call in list(s.pending):  # a call the framework did not run (its own validation refused it)
            body = refusal("not_executed", message="the framework did not run this call")
            record(s, self.log, call, body, key=None)
            turn.results.append(body)
        if stop := end_turn(s, self.log, self.guards, turn.calls, turn.results):
            raise self._stop(stop)
        return deliver_note(s)

    # -- the end -----------------------------------------------------------------------------------
    def finish(self, stop: Stop | None = None, *, error: BaseException | None = None,
               cancelled: bool = False) -> RunResult:
        """The stop line and the ledger (once: later calls return the same result). `stop` None: the
        framework ended its run, with the answer the last reply gave; `error`: the framework's run
        raised it (its own limit: `framework_limit`; else `internal_error`); `cancelled`: its task
        was cancelled."""
        if self.result is not None:
            return self.result
        if cancelled:
            stop = Stop(StopReason.CANCELLED, "cancelled: the task running the framework's agent was cancelled")
        elif error is not None and self.answer is None:
            stop = self._limit(error) or Stop(StopReason.INTERNAL_ERROR, f"the framework's run raised "
                                              f"{type(error).__name__}: {error}",
                                              {"traceback": "".join(traceback.format_exception(error))})
        elif stop is None:
            stop = self.answer or Stop(StopReason.EMPTY_ANSWER, "the framework ended its run with no answer")
        self.result = finish(self.state, self.log, stop, self.final)
        self.fence.results.append(self.result)
        return self.result

    def _limit(self, error: BaseException) -> Stop | None:
        """The framework's own limit `error` reports, as its stop; None for any other error."""
        return self.limit_of(error) if self.limit_of is not None else None

    def _stop(self, stop: Stop) -> FenceStop:
        return self.stop_error(stop, self.finish(stop))

    def _refuse_if_finished(self) -> None:
        if self.result is not None:  # the run has stopped: nothing more is asked or run
            raise self.stop_error(self.result.stop, self.result)


def _bridged(coro: Coroutine[Any, Any, T]) -> T:
    """A step from sync code through the one bridge; a Ctrl-C (which ended the run `cancelled`) is
    raised on as KeyboardInterrupt, as sync code expects."""
    try:
        return run_sync(coro)
    except asyncio.CancelledError as exc:
        if exc.args == (CTRL_C,):
            raise KeyboardInterrupt from None
        raise


@dataclass(frozen=True, slots=True)
class _Raised:
    exc: BaseException


@functools.cache  # importlib.metadata reads the installed distributions: ~1 ms a call
def versions(*dists: str) -> str | None:
    """The installed versions of a framework's distributions, for the log header ("1.5.2 (core
    1.8.3)" for two), or None when one is not installed as a distribution."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = [version(d) for d in dists]
    except PackageNotFoundError:  # pragma: no cover - installed some other way
        return None
    return found[0] + "".join(f" ({d.split('-')[-1]} {v})" for d, v in zip(dists[1:], found[1:]))
