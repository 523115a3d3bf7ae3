"""Sync calls of an async adapter: `SyncLoop.run(make)` runs the coroutine `make()` to its end.

The coroutine runs on the adapter's own event loop, on a daemon thread of its own, started on first
use and kept: what lives on that loop (the model's HTTP client and its keep-alive connections) lasts
from one sync call to the next (a fresh loop per call paid for a new client and a new connection
every time: about 6 ms of CPU a call). The coroutine runs in a copy of the caller's context
(contextvars, e.g. the ring's retry reporter), and this thread waits; it never re-enters a loop
running here, so sync code called from async code (a notebook cell) works too, blocking that loop
as any sync call does. An exception raised while waiting (KeyboardInterrupt) cancels the coroutine
(a request in flight is closed) before it propagates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["SyncLoop"]

T = TypeVar("T")


class SyncLoop:
    """One adapter's event loop on a thread of its own, for its sync calls."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`make()` run to its end on this loop, in a copy of the caller's context."""
        loop = self._running()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def start() -> None:  # on the loop's thread, in the caller's context
            if not done.set_running_or_notify_cancel():
                return
            task = loop.create_task(make())
            tasks.append(task)
            task.add_done_callback(lambda t: _settle(t, done))

        loop.call_soon_threadsafe(start, context=contextvars.copy_context())
        try:
            return done.result()
        except BaseException:
            if not done.done():  # interrupted while waiting: the coroutine is cancelled
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
                done.cancel()
            raise

    def close(self, last: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> None:
        """Run `last()` there (closing what lives on the loop), then stop the loop and its thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def _settle(task: asyncio.Task[T], done: concurrent.futures.Future[T]) -> None:
    if done.done():
        return
    if task.cancelled():
        done.cancel()
    elif (exc := task.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(task.result())
