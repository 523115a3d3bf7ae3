"""Running one tool call: timeout, structured errors, honest truncation, the read-only cache.

Errors raised inside a tool never escape: they become `{"ok": false, "error": kind, ...}` results.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from .._aio import Expired, in_thread, run_sync, within
from .._json import canonical_json, fingerprint, loggable
from ._registry import Tool, ToolKind

__all__ = ["ToolResult", "ToolOutput", "Executor", "ResultCache", "error_result", "refusal",
           "DEFAULT_RESULT_CAP", "time_left", "on_cancel", "SELF_TIMED_GRACE_S"]

DEFAULT_RESULT_CAP = 16_000
SELF_TIMED_GRACE_S = 3.0  # a self-timed tool (run_command) gets this long past its timeout to report


class _Call:
    """The tool call running in this context: its deadline (`time_left`) and how to stop its work
    (`on_cancel`) when the run goes on without it."""

    __slots__ = ("deadline", "hooks", "stopped", "lock")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.hooks: list[Callable[[], Any]] = []
        self.stopped = False
        self.lock = threading.Lock()

    def run(self, fn: Callable[..., Any], args: dict[str, Any]) -> tuple[str, Any]:
        """On the worker thread, in the job's own context copy (an async def in its own loop there)."""
        _CALL.set(self)
        status, value = _invoke(fn, args)
        if status == "ok" and inspect.iscoroutine(value):
            return _invoke(run_sync, {"coro": value})
        return status, value

    def add(self, hook: Callable[[], Any]) -> None:
        with self.lock:
            if not self.stopped:
                self.hooks.append(hook)
                return
        _quietly(hook)  # the run already went on without this call

    def stop(self) -> None:
        with self.lock:
            self.stopped, hooks = True, list(self.hooks)
        for hook in hooks:
            _quietly(hook)


def _quietly(hook: Callable[[], Any]) -> None:
    try:
        hook()
    except Exception:  # noqa: BLE001, S110 - best effort: the run goes on either way
        pass


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("loopfence_tool_call", default=None)


def time_left() -> float | None:
    """Seconds the current tool call has left (tool_timeout_s, bounded by the run's wall clock);
    None when unbounded. A self-timed tool caps its own timeout with this."""
    call = _CALL.get()
    deadline = None if call is None else call.deadline
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def on_cancel(hook: Callable[[], Any]) -> None:
    """Register how to stop the current tool call's work (e.g. kill its process group): called, from
    another thread, if the run goes on without the call (its timeout passed, or the run was
    cancelled). Outside a tool call it does nothing."""
    call = _CALL.get()
    if call is not None:
        call.add(hook)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the model receives for one call, and how it came to be."""

    content: str
    ok: bool
    decision: str = "executed"  # executed | reused | refused | rejected
    duration_s: float = 0.0
    error: str | None = None
    violation: str | None = None  # the result broke the tool's result model
    untrusted: bool = False

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.content)

    def as_reused(self) -> ToolResult:
        note = "\n[reused: same call as earlier in this run; result repeated, not executed again]"
        return ToolResult(self.content + note, self.ok, "reused", 0.0, self.error, None, self.untrusted)


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool may return to flag its result: e.g. an HTML page is untrusted content."""

    value: Any
    untrusted: bool = False


def refusal(error: str, **fields: Any) -> ToolResult:
    """A guard's or gate's "no" for one call: the model gets this result; the run goes on."""
    return error_result(error, "refused", **fields)


def error_result(error: str, decision: str = "executed", **fields: Any) -> ToolResult:
    """A structured failure the model can act on."""
    body = {"ok": False, "error": error, **fields}
    return ToolResult(loggable(json.dumps(body, ensure_ascii=False)), False, decision, error=error)


def _render(value: Any) -> tuple[str, bool, str | None]:
    """(content, ok, error kind): a dict with "ok": false is a failure named by its "error"."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, str):
        return value, True, None
    failed = isinstance(value, dict) and value.get("ok") is False
    error = str(value.get("error", "tool_error")) if failed else None
    try:
        return json.dumps(value, ensure_ascii=False), not failed, error
    except (TypeError, ValueError):
        return canonical_json(value), not failed, error


def cap_text(text: str, cap: int | None) -> str:
    if cap is None or len(text) <= cap:
        return text
    return f"{text[:cap]}\n[truncated: {len(text):,} characters, showing the first {cap:,}]"


class Executor:
    """Runs a tool under a timeout and turns whatever happens into a ToolResult.

    isolation "thread": a sync function on a worker thread (at the timeout the run goes on without
    it), an `async def` awaited and cancelled at the timeout; "process": a child process whose tree
    is killed at the timeout or on cancel; "inline": on the loop, no timeout.
    """

    def __init__(self, result_cap: int | None = DEFAULT_RESULT_CAP) -> None:
        self.result_cap = result_cap

    def execute(self, t: Tool, args: dict[str, Any], timeout_s: float | None) -> ToolResult:
        """The blocking form of `aexecute` (a tool that runs another tool, a script)."""
        return run_sync(self.aexecute(t, args, timeout_s))

    async def aexecute(self, t: Tool, args: dict[str, Any], timeout_s: float | None) -> ToolResult:
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        try:
            status, value = await _perform(t, args, deadline, timeout_s)
        except Expired:
            status, value = "timeout", None
        duration = time.monotonic() - start
        if status == "timeout":
            return self.timed_out(t, timeout_s, duration)
        if status == "error":
            exc = value
            fields: dict[str, Any] = {"message": f"{type(exc).__name__}: {exc}"}
            if t.kind is ToolKind.SIDE_EFFECT:
                fields["side_effects"] = "may have happened: the tool raised after it started"
            res = error_result(_error_kind(exc), **fields)
        else:
            untrusted = t.untrusted
            if isinstance(value, ToolOutput):
                value, untrusted = value.value, t.untrusted or value.untrusted
            violation = _check_result(t, value)
            content, ok, error = _render(value)
            return ToolResult(loggable(cap_text(content, self.result_cap)), ok, "executed", duration, error,
                              violation, untrusted)
        return replace(res, duration_s=duration, untrusted=t.untrusted)

    def timed_out(self, t: Tool, timeout_s: float | None, duration: float) -> ToolResult:
        """The result of a call to `t` cut at `timeout_s` after `duration` seconds (what the model is told)."""
        stopped = "the work was stopped" if t.isolation == "process" else \
            "it was cancelled" if t.isolation == "async" else \
            "the waiting was stopped; an in-thread tool cannot be killed and may still be running"
        res = error_result("timeout", tool=t.name, timeout_s=timeout_s, message=(
            f"{t.name} did not finish within {timeout_s:g}s; {stopped}"))
        return replace(res, duration_s=duration, untrusted=t.untrusted)


async def _perform(t: Tool, args: dict[str, Any], deadline: float | None,
                   timeout_s: float | None) -> tuple[str, Any]:
    """(status, value): "ok" and the return value, "error" and the exception, or "timeout"; Expired
    when the deadline passed first. Cancellation propagates after the work was stopped."""
    if t.isolation == "process":
        from ._process import arun_in_process  # local import: only process tools pay for it

        return await arun_in_process(t.fn, args, timeout_s)  # its clock starts with the child
    if t.isolation == "inline":
        return await _awaited(t.fn, args) if t.is_async else _invoke(t.fn, args)
    call = _Call(deadline)
    try:
        if t.isolation == "async":
            token = _CALL.set(call)
            try:
                return await within(deadline, _awaited(t.fn, args))
            finally:
                _CALL.reset(token)
        grace = SELF_TIMED_GRACE_S if t.self_timed and deadline is not None else 0.0
        return await within(None if deadline is None else deadline + grace, in_thread(call.run, t.fn, args))
    except BaseException:  # Expired, cancelled: the run goes on without it; stop what can be stopped
        call.stop()
        raise


async def _awaited(fn: Callable[..., Any], args: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", await fn(**args)
    except asyncio.CancelledError as exc:
        try:
            me = asyncio.current_task()
        except RuntimeError:  # driven with no event loop (a framework's sync path): the driver cancels
            me = None
        if me is None or me.cancelling():  # the run (its timeout, its caller) cancels the call
            raise
        return "error", exc  # something inside the tool was cancelled, not the run: the tool failed
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a raising tool (even SystemExit) is data
        return "error", exc


def _check_result(t: Tool, value: Any) -> str | None:
    if t.result_model is None:
        return None
    try:
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        t.result_model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "result"
        return f"{t.name} result does not match {t.result_model.__name__}: {loc}: {first.get('msg')}"
    return None


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing_file"
    if isinstance(exc, PermissionError):  # the OS said no, inside the tool: not the gate's permission_denied
        return "os_permission_error"
    if isinstance(exc, IsADirectoryError):
        return "is_a_directory"
    if isinstance(exc, (UnicodeDecodeError, ValueError, TypeError)):
        return "invalid_value"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "tool_error"


def _invoke(fn: Any, args: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", fn(**args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a raising tool (even SystemExit) is data
        return "error", exc


class ResultCache:
    """Read-only results by canonical key; any side-effect execution clears it."""

    def __init__(self) -> None:
        self._results: dict[str, ToolResult] = {}

    def get(self, key: str) -> ToolResult | None:
        return self._results.get(key)

    def record(self, t: Tool, key: str, result: ToolResult) -> None:
        if t.kind is ToolKind.READ_ONLY and result.decision == "executed":
            self._results[key] = result
        elif t.kind is ToolKind.SIDE_EFFECT and result.decision == "executed":
            self._results.clear()

