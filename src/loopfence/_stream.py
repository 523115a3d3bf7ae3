"""`stream()`: a run as an iterator of its typed events, as they are written: `async for` on a
running event loop, plain `for` in sync code (the run then goes on a thread with a loop of its own)."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from ._aio import run_sync
from ._loop import RunSettings, arun_with
from ._stops import RunResult
from ._log._schema import LogEvent, StopLine

__all__ = ["RunStream"]

T = TypeVar("T")
Bridge = Callable[[Callable[[], Coroutine[Any, Any, T]]], T]  # runs a coroutine to its end from sync code


def _fresh_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_sync(make())


class RunStream:
    """`async for event in agent.stream(task)` (or `stream(task, ...)`): header, request, reply, call, result, … ending with
    the stop. Then `.result` is the run's RunResult (and `await s.finish()` returns it). Leaving
    early: `async with stream(...) as s` (or `await s.aclose()`) cancels the run and waits for its
    stop; a cancelled consumer (a timeout around the loop) cancels it too, and so does dropping the
    stream after a `break`. An `on_event=` callback is called with each event as well.

    `for event in stream(task, ...)` does the same from sync code: the run goes on a thread of its
    own. Leaving the loop early (break, an exception) cancels the run, which ends `cancelled` with its
    stop in the log; Ctrl-C while waiting for an event does the same, and the events go on to that
    stop (a second Ctrl-C raises KeyboardInterrupt). A stream is iterated once, one way or the other.
    """

    def __init__(self, task: str, settings: RunSettings, bridge: Bridge[Any] = _fresh_loop) -> None:
        settings = RunSettings(settings)
        also = settings.pop("on_event", None)  # the caller's own callback: called too, as events are queued
        if also is not None and (inspect.iscoroutinefunction(also) or not callable(also)):
            raise TypeError("on_event must be a plain function (the stream itself is the async way)")
        self._task, self._settings = task, settings
        self._bridge = bridge  # the sync iteration's loop: an Agent's own, or a fresh one
        self._queue: asyncio.Queue[LogEvent] = asyncio.Queue()
        self._also = also
        self._run: asyncio.Task[RunResult] | None = None
        self._done = False
        self.result: RunResult | None = None

    def _start(self) -> asyncio.Task[RunResult]:
        if self._run is None:  # the run holds no reference to the stream, so that dropping it can end the run
            on_event = _tee(self._queue.put_nowait, self._also)
            self._run = asyncio.ensure_future(arun_with(self._task, {**self._settings, "on_event": on_event}))
            weakref.finalize(self, _cancel, self._run)  # the stream dropped mid-run (a break): the run ends
        return self._run

    def __aiter__(self) -> RunStream:
        return self

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> LogEvent:
        if self._done:
            raise StopAsyncIteration
        run = self._start()
        get = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait((get, run), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the consumer was cancelled (a timeout): so is the run
            get.cancel()
            run.cancel()
            self._done = True
            raise
        if not get.done():  # the run ended without a further event: it raised (LogWriteError, a cancel)
            get.cancel()
            self._done = True
            await self._run  # raises what the run raised
            raise StopAsyncIteration
        event = get.result()
        if isinstance(event, StopLine):
            self._done = True
            await self.finish()
        return event

    async def finish(self) -> RunResult:
        """The run to its end (the events not yet taken are dropped): its result."""
        self.result = await self._start()
        return self.result

    async def aclose(self) -> None:
        """Stop early: the run is cancelled (it ends `cancelled`, its stop in the log). `async with
        stream(...) as s:` does this on leaving the block."""
        self._done = True
        if self._run is not None and not self._run.done():
            self._run.cancel()
            try:
                await self._run
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():  # the cancel was for the caller too
                    raise


    def __iter__(self) -> Iterator[LogEvent]:
        if self._run is not None or self._done:
            raise RuntimeError("this stream is already being iterated (a stream is iterated once)")
        self._done = True
        return _events_on_a_thread(self)


_END = object()


def _tee(put: Callable[[LogEvent], Any], also: Callable[[LogEvent], Any] | None) -> Callable[[LogEvent], None]:
    """Each event to the stream's queue, and to the caller's own on_event, if any."""
    if also is None:
        return put

    def both(event: LogEvent) -> None:
        put(event)
        also(event)
    return both


def _cancel(run: asyncio.Task[Any]) -> None:
    if not run.done():
        try:
            run.cancel()
        except RuntimeError:  # its loop is closed: nothing runs it any more
            pass


def _events_on_a_thread(rs: RunStream) -> Iterator[LogEvent]:
    """The sync iteration: the run through the stream's bridge (the agent's loop, or a fresh one) on a
    thread of its own, events through a queue."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    handle: list[Any] = []  # (loop, task) once the run has started
    failed: list[BaseException] = []

    async def go() -> RunResult:
        handle.append((asyncio.get_running_loop(), asyncio.current_task()))
        return await arun_with(rs._task, {**rs._settings, "on_event": _tee(q.put, rs._also)})

    def main() -> None:
        try:
            rs.result = rs._bridge(go)
        except BaseException as exc:  # noqa: BLE001 - handed to the iterating thread
            failed.append(exc)
        finally:
            q.put(_END)

    def cancel() -> None:
        if handle:
            loop, task = handle[0]
            loop.call_soon_threadsafe(task.cancel)

    runner = threading.Thread(target=main, name="loopfence-stream", daemon=True)
    runner.start()
    cancelled = stopped = False
    try:
        while True:
            try:
                item = q.get()
            except KeyboardInterrupt:
                if cancelled:
                    raise
                cancelled = True
                cancel()  # the run ends `cancelled`; its remaining events, then the stop, still come
                continue
            if item is _END:
                break
            stopped = isinstance(item, StopLine)
            yield item
    finally:
        if runner.is_alive() and not stopped:  # left early: cancelled, its stop written before we return
            cancelled = True
            while not handle and runner.is_alive():
                runner.join(0.01)
            cancel()
            runner.join()
    if failed and not (cancelled and isinstance(failed[0], asyncio.CancelledError)):
        raise failed[0]

