"""`stream()`: a run as an iterator of its typed events, as they are written: `async for` on a
running event loop, plain `for` in sync code (the run then goes on a thread with a loop of its own)."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ._aio import run_sync
from ._conversation import Task
from ._loop import RunSettings, arun_with
from ._stops import RunResult
from ._log._schema import LogEvent, StopLine
from .models._base import ON_TEXT

__all__ = ["RunStream", "TextDelta"]

T = TypeVar("T")
Bridge = Callable[[Callable[[], Coroutine[Any, Any, T]]], T]  # runs a coroutine to its end from sync code


def _fresh_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_sync(make())


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of step `step`'s reply text, yielded by `stream()` as the model writes it (a
    streaming `OpenAIModel`, the embedded `LocalModel`), between that step's request and reply
    events. Not a log line: the reply event records the whole reply, and the pieces of a reply
    concatenate to its text. A tool call's arguments are not text; a reply cut short by a stop
    (the run's deadline, a cancel) may leave pieces with no reply after them."""

    step: int
    text: str
    event: ClassVar[str] = "text_delta"


Event = LogEvent | TextDelta


class RunStream:
    """`async for event in agent.stream(task)` (or `stream(task, ...)`): header, request, reply, call, result, … ending with
    the stop. Then `.result` is the run's RunResult (and `await s.finish()` returns it). Leaving
    early: `async with stream(...) as s` (or `await s.aclose()`) cancels the run and waits for its
    stop; a cancelled consumer (a timeout around the loop) cancels it too, and so does dropping the
    stream after a `break`. An `on_event=` callback is called with each event as well.

    When the model streams, `TextDelta` pieces of its reply's text come between the log events, as
they arrive (`isinstance(event, TextDelta)`, or `event.event == "text_delta"`).

    `for event in stream(task, ...)` does the same from sync code: the run goes on a thread of its
    own. Leaving the loop early (break, an exception) cancels the run, which ends `cancelled` with its
    stop in the log; Ctrl-C while waiting for an event does the same, and the events go on to that
    stop (a second Ctrl-C raises KeyboardInterrupt). A stream is iterated once, one way or the other.
    """

    def __init__(self, task: Task, settings: RunSettings, bridge: Bridge[Any] = _fresh_loop) -> None:
        settings = RunSettings(settings)
        also = settings.pop("on_event", None)  # the caller's own callback: called too, as events are queued
        if also is not None and (inspect.iscoroutinefunction(also) or not callable(also)):
            raise TypeError("on_event must be a plain function (the stream itself is the async way)")
        self._task, self._settings = task, settings
        self._bridge = bridge  # the sync iteration's loop: an Agent's own, or a fresh one
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._also = also
        self._run: asyncio.Task[RunResult] | None = None
        self._done = False
        self.result: RunResult | None = None

    def _start(self) -> asyncio.Task[RunResult]:
        if self._run is None:  # the run holds no reference to the stream, so that dropping it can end the run
            put = self._queue.put_nowait
            on_event = _tee(put, self._also)
            self._run = asyncio.ensure_future(_with_text(_text_on_loop(put, asyncio.get_running_loop()),
                                                         arun_with(self._task, {**self._settings, "on_event": on_event})))
            weakref.finalize(self, _cancel, self._run)  # the stream dropped mid-run (a break): the run ends
        return self._run

    def __aiter__(self) -> RunStream:
        return self

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> Event:
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


    def __iter__(self) -> Iterator[Event]:
        if self._run is not None or self._done:
            raise RuntimeError("this stream is already being iterated (a stream is iterated once)")
        self._done = True
        return _events_on_a_thread(self)


_END = object()


async def _with_text(report: Callable[[int, str], None], run: Coroutine[Any, Any, RunResult]) -> RunResult:
    """The run, its model's text reported to `report` (ON_TEXT is set in this task's own context)."""
    ON_TEXT.set(report)
    return await run


def _text_on_loop(put: Callable[[Event], Any], loop: asyncio.AbstractEventLoop) -> Callable[[int, str], None]:
    """Text pieces into the stream's queue: from the loop's thread at once, from an adapter's own
    thread (a sync model's worker, a model's own loop) through the loop, in the order they come."""

    def report(step: int, text: str) -> None:
        delta = TextDelta(step, text)
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            put(delta)
        else:
            try:
                loop.call_soon_threadsafe(put, delta)
            except RuntimeError:  # the loop is closed: the run is over
                pass
    return report


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


def _events_on_a_thread(rs: RunStream) -> Iterator[Event]:
    """The sync iteration: the run through the stream's bridge (the agent's loop, or a fresh one) on a
    thread of its own, events through a queue."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    handle: list[Any] = []  # (loop, task) once the run has started
    failed: list[BaseException] = []

    async def go() -> RunResult:
        handle.append((asyncio.get_running_loop(), asyncio.current_task()))
        def text(step: int, piece: str) -> None:  # a thread-safe queue: from any thread, in order
            q.put(TextDelta(step, piece))
        return await _with_text(text, arun_with(rs._task, {**rs._settings, "on_event": _tee(q.put, rs._also)}))

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
            if stopped:  # a piece of text after the stop (an abandoned request's): not this run's any more
                continue
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

