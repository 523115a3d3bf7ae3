"""Where the ring runs: on an asyncio event loop, every operation awaited under one deadline.

- `within(deadline, aw)`: the one timeout path of the package. `aw` is awaited until the monotonic
  `deadline` (None: unbounded); past it the awaiting is cancelled and `Expired` is raised. A
  deadline already passed starts nothing.
- `Blocking(fn, *args)`: a blocking call the ring makes (a sync model, a sync tool): under run()
  it runs inline on the run's own runner thread (see _runner), elsewhere as `in_thread`.
- `in_thread(fn, *args)`: a blocking call (a model with only a sync `complete`, a sync tool, an
  approval prompt) on a bounded pool of daemon worker threads, in a copy of the caller's context.
  When the awaiting is cancelled (timeout, Ctrl-C, task cancel) the run goes on without it: a job
  not yet started never starts; one running finishes unobserved (Python threads cannot be killed).
- `run_sync(coro)`: the sync bridge for what is not a run (a sync `Executor.execute`, `batch()`):
  `drive_sync`, as under `run()`. Never "event loop is already running"; on the main thread,
  Ctrl-C cancels the task (it ends what it was doing), a second raises KeyboardInterrupt.
- `prefers_async(obj, "complete", "acomplete")`: which of an adapter's two forms to use (the most
  derived one: a subclass that overrides only `complete` keeps its override).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import CoroutineType
from typing import Any, TypeVar

from ._runner import DRIVE, Drive, drive_sync

__all__ = ["Blocking", "drive_sync", "Expired", "within", "in_thread", "run_sync", "interrupted", "prefers_async", "Meter",
           "METER", "CTRL_C", "MAX_THREADS", "worker_threads"]

T = TypeVar("T")
CTRL_C = "interrupted (Ctrl-C)"  # the message a Ctrl-C cancels the run's task with
MAX_THREADS = 64  # worker threads for blocking operations, shared by every run in the process


class Expired(Exception):
    """The deadline passed before the operation finished; the run goes on without it."""


# -- metering: CPU of a run's own code on the loop thread, and of its jobs on workers ---------------
class Meter:
    """CPU seconds of one run: its ring's time on the loop thread between awaits, plus the worker
    time of its blocking operations (an async adapter's CPU shares the loop and is not counted)."""

    __slots__ = ("cpu", "_mark", "_depth")

    def __init__(self) -> None:
        self.cpu = 0.0
        self._mark = time.thread_time()
        self._depth = 0

    def pause(self) -> None:
        if self._depth == 0:
            self.cpu += time.thread_time() - self._mark
        self._depth += 1

    def resume(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._mark = time.thread_time()


METER: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("loopfence_meter", default=None)
"""The Meter of the run driven in this (task's) context."""


# -- the one deadline ------------------------------------------------------------------------------
async def within(deadline: float | None, aw: Awaitable[T]) -> T:
    """Await `aw`; past the monotonic `deadline` cancel it and raise Expired (None: no deadline)."""
    meter = METER.get()
    if meter is not None:
        meter.pause()
    try:
        if isinstance(aw, Blocking):  # a blocking call: inline under run(), else on a worker thread
            d = aw.driver()
            if d is not None:
                return await _inline(d, aw, deadline)  # type: ignore[no-any-return]
            aw = in_thread(aw.fn, *aw.args)
        if deadline is None:
            return await aw
        left = deadline - time.monotonic()
        if left <= 0:
            if isinstance(aw, CoroutineType):
                aw.close()  # never started
            raise Expired
        if isinstance(aw, CoroutineType):  # its synchronous start needs no timer (nothing could cut it)
            try:
                first = aw.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            aw = _Started(aw, first)
        scope = asyncio.timeout(left)
        try:
            async with scope:
                return await aw
        except TimeoutError:
            if scope.expired():
                raise Expired from None
            raise  # the operation's own TimeoutError
    finally:
        if meter is not None:
            meter.resume()


class _Started:
    """The rest of a coroutine already run up to its first suspension (it yielded `first`): awaiting
    this goes on exactly as `await coro` would have (sends, throws and close passed through)."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self.coro, self.first = coro, first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, out = self.coro, self.first
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancel (or any throw) goes to the coroutine
                try:
                    out = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as done:
                    return done.value


class Blocking:
    """`fn(*args)`, a blocking call the ring makes, to await: `within(deadline, Blocking(...))`
    bounds it. Under run() it runs inline on the run's own runner thread (see _runner), elsewhere
    on the worker pool (`in_thread`)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def driver(self) -> Drive | None:
        """The run() that may run this call inline: it drives the task awaiting it."""
        d = DRIVE.get()
        return d if d is not None and d.task is asyncio.current_task() else None

    def __await__(self) -> Generator[Any, None, Any]:
        return (yield from within(None, self).__await__())


async def _inline(d: Drive, aw: Blocking, deadline: float | None) -> Any:
    if deadline is not None and time.monotonic() >= deadline:
        raise Expired  # never started
    op = await d.inline(aw.fn, aw.args, deadline)
    meter = METER.get()
    if meter is not None:
        meter.cpu += op.cpu
    if op.how == "taken" and op.error is None:
        raise Expired  # the run went on without it, on a new runner
    if op.error is not None:
        raise op.error
    return op.value


# -- the worker pool -------------------------------------------------------------------------------
class _Job:
    __slots__ = ("fn", "args", "ctx", "loop", "future", "abandoned", "cpu")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop) -> None:
        self.fn, self.args, self.loop = fn, args, loop
        self.ctx = contextvars.copy_context()
        self.future: asyncio.Future[Any] = loop.create_future()
        self.abandoned = False
        self.cpu = 0.0

    def run(self) -> None:
        if self.abandoned:  # its deadline passed or its run was cancelled while it waited
            return
        start = time.thread_time()
        value, error = None, None
        try:
            value = self.ctx.run(self.fn, *self.args)
        except BaseException as exc:  # noqa: BLE001 - raised again where the job is awaited
            error = exc
        self.cpu = time.thread_time() - start
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, value, error)
        except RuntimeError:  # the loop is closed: the run ended without this job
            pass


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    elif isinstance(error, StopIteration):  # a future cannot carry one
        future.set_exception(RuntimeError(f"StopIteration: {error}"))
    else:
        future.set_exception(error)


class _Pool:
    """At most MAX_THREADS daemon threads, started on demand and reused (an idle one takes the next
    job). Daemon: a hung tool never keeps the process from exiting."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.idle = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.threads = 0

    def submit(self, job: _Job) -> None:
        self.jobs.put(job)
        if self.idle.acquire(blocking=False):
            return
        with self.lock:
            if self.threads < self.size:
                self.threads += 1
                threading.Thread(target=self._work, daemon=True, name=f"loopfence-worker-{self.threads}").start()

    def _work(self) -> None:
        while True:
            self.jobs.get().run()
            self.idle.release()


_POOL = _Pool(MAX_THREADS)


def worker_threads() -> int:
    """How many worker threads the pool has started (at most MAX_THREADS)."""
    return _POOL.threads


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a worker thread, awaited. Cancelled: the run goes on without it."""
    job = _Job(fn, args, asyncio.get_running_loop())
    _POOL.submit(job)
    try:
        return await job.future  # type: ignore[no-any-return]
    finally:
        job.abandoned = True  # not started yet: it never will be
        meter = METER.get()
        if meter is not None:
            meter.cpu += job.cpu


# -- which form of an adapter --------------------------------------------------------------------
def prefers_async(obj: Any, sync_name: str, async_name: str) -> bool:
    """Use `obj.<async_name>`: it exists and is defined at least as far down the class hierarchy as
    `obj.<sync_name>` (a subclass overriding only the sync form keeps its override)."""
    if not callable(getattr(obj, async_name, None)):
        return False
    if async_name in getattr(obj, "__dict__", ()):
        return True
    mro = type(obj).__mro__
    a = next((k for k in mro if async_name in k.__dict__), None)
    if a is None:
        return False
    s = next((k for k in mro if sync_name in k.__dict__), None)
    return s is None or issubclass(a, s)


def interrupted() -> bool:
    """Ctrl-C arrived for the run() driving this context (checked before each operation starts, so
    that a call never started is answered not_executed rather than outcome_unknown)."""
    d = DRIVE.get()
    return d is not None and d.pressed


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end from sync code, as run() drives a run (`drive_sync`: on a runner thread
    of its own, so never "event loop is already running"). On the main thread the first Ctrl-C
    cancels it (CancelledError, after it has ended what it was doing), a second raises
    KeyboardInterrupt."""
    return drive_sync(coro, lambda: asyncio.CancelledError(CTRL_C))
