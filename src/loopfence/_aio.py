"""Where the ring runs: `arun()` on an event loop; `run_sync()` the one bridge from sync code.

- `run_sync(coro)`: runs `coro` on an event loop of its own (`asyncio.Runner` on this thread, or on
  a helper thread when a loop is already running here) and returns its value. On the main thread
  the first Ctrl-C is one `task.cancel(CTRL_C)` (the run ends `cancelled`), a second raises
  KeyboardInterrupt. `run()`, `batch()`, a sync `Executor.execute`, a fence's sync hooks use it.
  `KeptLoop`: the same bridge over one loop kept from call to call (an `Agent`'s sync calls), so
  what lives on that loop (a model's connection pool) lasts.
- `in_thread(fn, *args)`: a blocking call (a sync model, a sync tool, an approval prompt) on the one
  bounded pool of daemon worker threads, in a copy of the caller's context, awaited. When the
  awaiting is cancelled (a deadline, Ctrl-C) the run goes on without it: a job not yet started
  never starts; one running finishes unobserved (Python threads cannot be killed).
- `within(deadline, aw)`: `aw` awaited until the monotonic `deadline` (None: unbounded); past it
  the awaiting is cancelled and `Expired` is raised (a tool's timeout, a hook's wait). The run's
  own wall clock is one scope around the ring (`_steps.on_the_clock`).
- `prefers_async(obj, "complete", "acomplete")`: which of an adapter's two forms to use (the most
  derived one: a subclass that overrides only `complete` keeps its override).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import queue
import signal
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["Expired", "within", "waited", "in_thread", "run_sync", "KeptLoop", "loop_running", "checkpoint",
           "prefers_async", "Meter", "METER", "CTRL_C", "MAX_THREADS", "worker_threads"]

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


async def waited(aw: Awaitable[T]) -> T:
    """`aw` awaited, its time left out of the run's CPU."""
    meter = METER.get()
    if meter is None:
        return await aw
    meter.pause()
    try:
        return await aw
    finally:
        meter.resume()


async def within(deadline: float | None, aw: Awaitable[T]) -> T:
    """Await `aw`; past the monotonic `deadline` cancel it and raise Expired (None: no deadline)."""
    if deadline is None:
        return await waited(aw)
    left = deadline - time.monotonic()
    if left <= 0:
        if isinstance(aw, Coroutine):
            aw.close()  # never started
        raise Expired
    scope = asyncio.timeout(left)
    try:
        async with scope:
            return await waited(aw)
    except TimeoutError:
        if scope.expired():
            raise Expired from None
        raise  # the operation's own TimeoutError


async def checkpoint() -> None:
    """Before an operation starts: a cancel asked for while the ring ran its own code (Ctrl-C, the
    wall clock) is taken here, so that a call never started is answered not_executed."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        await asyncio.sleep(0)


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
    job from the queue). Daemon: a hung tool never keeps the process from exiting."""

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


# -- the bridge ------------------------------------------------------------------------------------
def run_sync(coro: Coroutine[Any, Any, T], kept: asyncio.Runner | None = None) -> T:
    """Run `coro` to its end from sync code on an event loop of its own: `asyncio.Runner` here (or
    `kept`'s, left open), or on a helper thread when this thread is already running a loop. On the
    main thread the first Ctrl-C cancels its task (`CTRL_C`: it ends what it was doing,
    CancelledError unless it returns), a second raises KeyboardInterrupt."""
    task: list[asyncio.Task[T]] = []

    async def main() -> T:
        task.append(asyncio.current_task())  # type: ignore[arg-type]
        return await coro

    def cancel() -> None:  # on the loop's thread
        if task and not task[0].done():
            task[0].cancel(CTRL_C)

    if not loop_running():
        return _here(main(), cancel, kept)
    ctx = contextvars.copy_context()
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    loop: list[asyncio.AbstractEventLoop] = []

    def helper() -> None:
        with asyncio.Runner() as runner:
            loop.append(runner.get_loop())
            try:
                done.set_result(runner.run(main(), context=ctx))
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                done.set_exception(exc)

    threading.Thread(target=helper, name="loopfence-run", daemon=True).start()
    pressed = False
    while True:
        try:
            return done.result()
        except KeyboardInterrupt:
            if pressed or not loop:
                raise
            pressed = True
            loop[0].call_soon_threadsafe(cancel)


class KeptLoop:
    """One event loop kept for a series of sync calls (an `Agent`'s), made on first use: `run(make)`
    is `run_sync(make())` on it. Busy (a loop running on the calling thread, or another thread's
    call on it): that call gets a loop of its own, as `run_sync` gives."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None
        self._lock = threading.Lock()

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if loop_running() or not self._lock.acquire(blocking=False):
            return run_sync(make())
        try:
            if self._runner is None:
                self._runner = asyncio.Runner()
                weakref.finalize(self, _shut, self._runner)  # never closed: its loop, at least
            return run_sync(make(), self._runner)
        finally:
            self._lock.release()

    def close(self, last: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> None:
        """Run `last()` on the loop (closing what lives there), then close it (on a helper thread
        when called from async code: the loop cannot run on a thread running another)."""
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            _shut(runner, last)


def _shut(runner: asyncio.Runner, last: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> None:
    """Run `last()` on the runner's loop, then close it; on a helper thread when a loop is running
    on this one (a loop cannot run on a thread running another: an agent dropped in async code)."""
    def shut() -> None:
        try:
            if last is not None:
                runner.run(last())
        finally:
            runner.close()

    if loop_running():
        helper = threading.Thread(target=shut, name="loopfence-loop-close")
        helper.start()
        helper.join()
    else:
        shut()


def loop_running() -> bool:
    """True when an event loop is running on this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _here(main: Coroutine[Any, Any, T], cancel: Callable[[], None], kept: asyncio.Runner | None) -> T:
    """`main` on an asyncio.Runner on this thread (`kept`, left open, or a new one); on the main
    thread the first Ctrl-C is `cancel()` (the loop's own signal handling), a second raises
    KeyboardInterrupt."""
    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with (contextlib.nullcontext(kept) if kept is not None else asyncio.Runner()) as runner:
        loop = runner.get_loop()

        def on_sigint() -> None:
            loop.remove_signal_handler(signal.SIGINT)  # restores the default: a second Ctrl-C raises
            cancel()

        if ours:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return runner.run(main)
        finally:
            if ours:
                loop.remove_signal_handler(signal.SIGINT)


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
