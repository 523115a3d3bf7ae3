"""Running one tool call: timeout, structured errors, honest truncation, the read-only cache.

Errors raised inside a tool never escape: they become `{"ok": false, "error": kind, ...}` results.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pydantic import BaseModel, ValidationError

from .._driver import Slot, take_slot
from .._json import canonical_json, fingerprint, loggable
from ._registry import Tool, ToolKind

__all__ = ["ToolResult", "ToolOutput", "Executor", "ResultCache", "error_result", "refusal",
           "DEFAULT_RESULT_CAP", "time_left", "SELF_TIMED_GRACE_S"]

DEFAULT_RESULT_CAP = 16_000
SELF_TIMED_GRACE_S = 3.0  # a self-timed tool (run_command) gets this long past its timeout to report
_call = threading.local()  # the deadline of the tool call running in this thread


def time_left() -> float | None:
    """Seconds the current tool call has left (tool_timeout_s, bounded by the run's wall clock);
    None when unbounded. A self-timed tool caps its own timeout with this."""
    deadline = getattr(_call, "deadline", None)
    return None if deadline is None else max(0.0, deadline - time.monotonic())


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
    """Runs a tool under a timeout and turns whatever happens into a ToolResult."""

    def __init__(self, result_cap: int | None = DEFAULT_RESULT_CAP) -> None:
        self.result_cap = result_cap

    def execute(self, t: Tool, args: dict[str, Any], timeout_s: float | None) -> ToolResult:
        start = time.monotonic()
        slot = take_slot()  # set when the ring's runner performs this call (None for nested calls)
        if t.isolation == "process":
            from ._process import run_in_process  # local import: only process tools pay for it

            # a Ctrl-C that takes the run over kills the child's tree through slot.on_cancel
            told = None if slot is None else partial(setattr, slot, "on_cancel")
            status, value = run_in_process(t.fn, args, timeout_s, on_start=told)
        elif t.isolation == "inline":
            status, value = _run_in_thread(t.fn, args, None)
        else:
            grace = SELF_TIMED_GRACE_S if t.self_timed and timeout_s is not None else 0.0
            if slot is not None and timeout_s is not None:  # the ring's runner: no hand-off
                status, value = _run_here(t.fn, args, slot, start + timeout_s, grace,
                                          lambda: self._timed_out(t, timeout_s, time.monotonic() - start))
            else:
                status, value = _run_in_thread(t.fn, args, timeout_s, grace)
        duration = time.monotonic() - start
        if status == "timeout":
            return self._timed_out(t, timeout_s, duration)
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

    def _timed_out(self, t: Tool, timeout_s: float | None, duration: float) -> ToolResult:
        stopped = "the work was stopped" if t.isolation == "process" else \
            "the waiting was stopped; an in-thread tool cannot be killed and may still be running"
        res = error_result("timeout", tool=t.name, timeout_s=timeout_s, message=(
            f"{t.name} did not finish within {timeout_s:g}s; {stopped}"))
        return replace(res, duration_s=duration, untrusted=t.untrusted)


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
    if isinstance(exc, PermissionError):
        return "permission_denied"
    if isinstance(exc, IsADirectoryError):
        return "is_a_directory"
    if isinstance(exc, (UnicodeDecodeError, ValueError, TypeError)):
        return "invalid_value"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "tool_error"


def _run_here(fn: Any, args: dict[str, Any], slot: Slot, deadline: float, grace: float,
              on_timeout: Any) -> tuple[str, Any]:
    """Run on this (the ring's) thread; past the deadline the watchdog answers the ring with
    `on_timeout()` and the run goes on elsewhere while this thread finishes the tool unobserved."""
    slot.arm(deadline + grace, on_timeout)
    outer, _call.deadline = getattr(_call, "deadline", None), deadline
    try:
        return _invoke(fn, args)
    finally:
        _call.deadline = outer


def _invoke(fn: Any, args: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", fn(**args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a raising tool (even SystemExit) is data
        return "error", exc


def _run_in_thread(fn: Any, args: dict[str, Any], timeout_s: float | None,
                   grace: float = 0.0) -> tuple[str, Any]:
    if timeout_s is None:
        return _invoke(fn, args)
    try:
        worker = _IDLE.pop()
    except IndexError:  # (not `if _IDLE`: another thread may take the last one in between)
        worker = _Worker()
    deadline = time.monotonic() + timeout_s
    worker.jobs.put((fn, args, deadline))
    try:
        outcome = worker.results.get(timeout=max(timeout_s, 0.0) + grace)
    except queue.Empty:
        return "timeout", None  # the worker is abandoned: it may still be running the tool
    _IDLE.append(worker)
    return outcome


class _Worker:
    """A reusable daemon thread for in-thread tools: starting a thread per call costs more than
    the rest of a step. A worker whose tool timed out is never reused."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Any, dict[str, Any], float]] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="loopfence-tool").start()

    def _loop(self) -> None:
        while True:
            fn, args, deadline = self.jobs.get()
            _call.deadline = deadline
            try:
                outcome: tuple[str, Any] = ("ok", fn(**args))
            except BaseException as exc:  # noqa: BLE001 - a raising tool is data
                outcome = ("error", exc)
            _call.deadline = None
            self.results.put(outcome)


_IDLE: list[_Worker] = []  # list.pop/append are atomic: concurrent runs share the pool safely


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

