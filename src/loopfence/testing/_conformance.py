"""Adapter conformance for models: `check_model(model)`, a short suite for a custom adapter's tests.

    from loopfence.testing import check_model

    def test_my_adapter_conforms():
        report = check_model(MyModel(...), slow=..., failing=[MyModel(base_url=DEAD)])
        print(report)   # what was checked, what was skipped and why

Plain asserts: the first check that fails raises AssertionError naming it ("check_model[cancel]:
..."). The checks, in this order:

  protocol   `complete` and `describe` exist; `describe()` is a JSON object; `acomplete` and
             `acount_tokens`, when present, are `async def`
  complete   `complete(request)` returns a well-formed, complete Reply for a trivial request
  acomplete  `await acomplete(request)` does too (on an event loop of the kit's own)
  cancel     cancelling `acomplete` in flight: it returns within `grace_s`, CancelledError
             propagates (not swallowed, not turned into a reply), and it leaves nothing running
             (no task it started, no worker thread the loop's shutdown must wait for). Needs a
             request still in flight after `cancel_after` seconds: `slow` is a Request for this
             adapter, or a twin adapter (same class) that is slow, e.g. one whose test server
             stalls; without it, a reply that comes first skips the check
  deadline   a request whose `deadline` has passed gets a Reply or a StopError, nothing else
  failures   each adapter in `failing` (set up to fail: an endpoint that is down, answers 500,
             sends garbage) raises StopError with a named reason or returns an incomplete Reply
             with its problem, from `complete` and `acomplete` alike, never another exception

The kit's event loop is its own; at its end the kit awaits the adapter's `aclose()`, if it has one,
so no connection outlives that loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._messages import Reply, Request, ToolCall, Usage
from .._stops import StopError, StopReason

__all__ = ["Conformance", "ConformanceError", "check_model", "trivial_request", "well_formed"]


@dataclass(slots=True)
class Conformance:
    """What a check_* run checked (`passed`) and left out (`skipped`: check -> why)."""

    subject: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{self.subject}: passed {', '.join(self.passed) or 'nothing'}"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


class ConformanceError(AssertionError):
    """A check failed; the message names it: "check_model[cancel]: ..."."""


class _Fail:
    """Makes the ConformanceError named after the check."""

    def __init__(self, kit: str) -> None:
        self.kit = kit

    def __call__(self, check: str, message: str) -> ConformanceError:
        return ConformanceError(f"{self.kit}[{check}]: {message}")


def trivial_request(deadline: float | None = None) -> Request:
    return Request([{"role": "user", "content": "Say hi."}], [], {"max_tokens": 16}, deadline)


def well_formed(reply: Any) -> str | None:
    """None for a well-formed Reply, else what is wrong with it."""
    if not isinstance(reply, Reply):
        return f"returned {type(reply).__name__}, not a loopfence Reply"
    if reply.content is not None and not isinstance(reply.content, str):
        return f"content is {type(reply.content).__name__}, not str or None"
    if not isinstance(reply.tool_calls, tuple) or not all(isinstance(c, ToolCall) for c in reply.tool_calls):
        return "tool_calls is not a tuple of ToolCall"
    for c in reply.tool_calls:
        if not isinstance(c.id, str) or not isinstance(c.name, str) or not c.name:
            return f"tool call {c!r} lacks a str id or a name"
    if reply.finish_reason is not None and not isinstance(reply.finish_reason, str):
        return "finish_reason is not str or None"
    if reply.usage is not None and not isinstance(reply.usage, Usage):
        return "usage is not a Usage or None"
    if not isinstance(reply.raw, dict):
        return "raw is not a dict"
    try:
        json.dumps(reply.raw, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"raw cannot be logged as JSON: {exc}"
    if not isinstance(reply.complete, bool):
        return "complete is not a bool"
    if not reply.complete and not (isinstance(reply.problem, str) and reply.problem):
        return "an incomplete reply must say why (problem)"
    return None


def check_model(model: Any, request: Request | None = None, *, slow: Any = None, failing: Iterable[Any] = (),
                cancel_after: float = 0.05, grace_s: float = 2.0) -> Conformance:
    """Check a Model adapter (see the module docstring). Returns what was checked; raises
    AssertionError naming the first check that fails."""
    fail = _Fail("check_model")
    request = request or trivial_request()
    report = Conformance(f"check_model({type(model).__name__})")
    has_async = _protocol(model, fail)
    report.passed.append("protocol")
    _expect_reply(fail, "complete", _call(lambda: model.complete(request)), complete=True)
    report.passed.append("complete")
    if has_async:
        _expect_reply(fail, "acomplete", _run(model, lambda: model.acomplete(request), grace_s, fail, "acomplete"),
                      complete=True)
        report.passed.append("acomplete")
        target, slow_request = (model, slow) if isinstance(slow, Request) else (slow or model, request)
        if not _protocol(target, fail):
            raise fail("cancel", f"slow={type(target).__name__} has no acomplete")
        skipped = _run(target, lambda: _cancel(target, slow_request, slow is not None, cancel_after, grace_s, fail),
                       grace_s, fail, "cancel")
        if isinstance(skipped, BaseException):
            raise fail("cancel", f"raised {type(skipped).__name__}: {skipped}")
        if isinstance(skipped, str):
            report.skipped["cancel"] = skipped
        else:
            report.passed.append("cancel")
    else:
        report.skipped["acomplete"] = report.skipped["cancel"] = (
            "no acomplete: the ring runs complete() in a worker thread and goes on without it at the "
            "deadline (a sync call cannot be cancelled)")
    late = trivial_request(deadline=time.monotonic() - 1.0)
    _expect_reply(fail, "deadline", _call(lambda: model.complete(late)), complete=None)
    report.passed.append("deadline")
    for n, bad in enumerate(failing, 1):
        _expect_failure(fail, f"failures #{n} complete", _call(lambda: bad.complete(request)))
        if _protocol(bad, fail):
            _expect_failure(fail, f"failures #{n} acomplete",
                            _run(bad, lambda: bad.acomplete(request), grace_s, fail, f"failures #{n}"))
        report.passed.append(f"failures #{n}")
    return report


def _protocol(model: Any, fail: _Fail) -> bool:
    for name in ("complete", "describe"):
        if not callable(getattr(model, name, None)):
            raise fail("protocol", f"{type(model).__name__} has no {name}() method")
    described = _call(model.describe)
    if isinstance(described, BaseException):
        raise fail("protocol", f"describe() raised {type(described).__name__}: {described}")
    if not isinstance(described, dict):
        raise fail("protocol", f"describe() returned {type(described).__name__}, not a dict")
    try:
        json.dumps(described, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise fail("protocol", f"describe() cannot be logged as JSON: {exc}") from None
    for name in ("acomplete", "acount_tokens"):
        fn = getattr(model, name, None)
        if fn is not None and not inspect.iscoroutinefunction(fn):
            raise fail("protocol", f"{name} must be `async def` (the ring awaits it)")
    return getattr(model, "acomplete", None) is not None


def _call(fn: Callable[[], Any]) -> Any:
    """fn()'s value, or the exception it raised (a BaseException too: SystemExit is a finding);
    a failed check of the kit's own propagates."""
    try:
        return fn()
    except ConformanceError:
        raise
    except BaseException as exc:  # noqa: BLE001 - judged by the caller
        return exc


def _run(model: Any, make: Callable[[], Coroutine[Any, Any, Any]], grace_s: float, fail: _Fail,
         check: str) -> Any:
    """make() on a fresh event loop (then the model's aclose(), if any); its value or exception.
    Fails when the loop's shutdown waits longer than grace_s (work left running in a thread)."""
    ended: list[float] = []

    async def main() -> Any:
        try:
            return await make()
        finally:
            aclose = getattr(model, "aclose", None)
            if aclose is not None and inspect.iscoroutinefunction(aclose):
                await aclose()
            ended.append(time.monotonic())

    out = _call(lambda: asyncio.run(main()))
    if ended and time.monotonic() - ended[0] > grace_s:
        raise fail(check, f"the event loop took {time.monotonic() - ended[0]:.1f}s to shut down: work was "
                   "left running in a worker thread (run_in_executor / to_thread)")
    return out


async def _cancel(model: Any, request: Request, slow: bool, cancel_after: float, grace_s: float,
                  fail: _Fail) -> str | None:
    """Cancel acomplete in flight; a reason the check was skipped, or None when it passed."""
    before = asyncio.all_tasks()
    threads = set(threading.enumerate())
    task = asyncio.ensure_future(model.acomplete(request))
    await asyncio.sleep(cancel_after)
    if task.done():
        outcome = task.exception() if not task.cancelled() else None
        if slow:
            raise fail("cancel", f"the slow request ended within cancel_after={cancel_after}s "
                       f"({type(outcome).__name__ if outcome else 'a reply'}): nothing was in flight to cancel")
        return f"the reply came within cancel_after={cancel_after}s: pass slow= to cancel one in flight"
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    if not done:
        raise fail("cancel", f"acomplete was still running {grace_s}s after it was cancelled")
    if not task.cancelled():
        got = task.exception()
        what = f"raised {type(got).__name__}: {got}" if got is not None else "returned a reply"
        raise fail("cancel", f"acomplete swallowed the cancel and {what}; CancelledError must propagate")
    await asyncio.sleep(0.05)  # let what the cancel closed finish closing
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() - before if t is not me and not t.done()]
    if left:
        raise fail("cancel", f"acomplete left {len(left)} task(s) running after the cancel: {left[:3]}")
    alive = [t.name for t in set(threading.enumerate()) - threads if t.is_alive() and not t.daemon]
    if alive:
        raise fail("cancel", f"acomplete left non-daemon thread(s) running after the cancel: {alive}")
    return None


def _expect_reply(fail: _Fail, check: str, out: Any, *, complete: bool | None) -> None:
    """A well-formed Reply (complete when asked for); with complete=None a StopError also does."""
    if isinstance(out, StopError):
        if complete is None and _named(out):
            return
        raise fail(check, f"stopped {out.stop.reason}: {out.stop.detail} (a trivial request must get a reply)")
    if isinstance(out, BaseException):
        raise fail(check, f"raised {type(out).__name__}: {out} (an adapter returns a Reply or raises StopError)")
    problem = well_formed(out)
    if problem:
        raise fail(check, problem)
    if complete and not out.complete:
        raise fail(check, f"the reply is incomplete: {out.problem}")


def _expect_failure(fail: _Fail, check: str, out: Any) -> None:
    if isinstance(out, StopError):
        if not _named(out):
            raise fail(check, f"StopError without a named reason or detail: {out!r}")
        return
    if isinstance(out, BaseException):
        raise fail(check, f"raised {type(out).__name__}: {out}; map it to StopError (a named stop)")
    problem = well_formed(out)
    if problem:
        raise fail(check, problem)
    if out.complete:
        raise fail(check, "a failing adapter returned a complete reply: the failure was not surfaced")


def _named(exc: StopError) -> bool:
    return isinstance(exc.stop.reason, StopReason) and bool(exc.stop.detail)
