"""A fenced run's steps driven from sync code without an event loop (a framework whose hooks are
plain functions: LangChain's `invoke`).

The fence's steps wait on nothing but the framework's own blocking call (its model request, its
tool), so `drive(coro)` runs one step's coroutine to its end right on the calling thread, and the
one blocking call it awaits (`Offload`) runs on a worker thread while this thread waits for it on a
lock, up to the call's deadline (with none, right here): one hand-off there and one back, where an event loop's thread
pool costs several (its self-pipe, its selector, a task wake-up: measured ~4x the CPU on the 2-core
VMs this project runs on). Past the deadline the waiting stops (`Expired`, or the call's own `late`,
is thrown into the step where it awaited the call) and the worker finishes the call unobserved, as `_aio.in_thread` does.

A Ctrl-C while this thread waits cancels the step (CancelledError thrown in at the call: it writes
what a cancel writes) and is raised on.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

from .._aio import Expired

__all__ = ["Offload", "drive", "worker_threads"]

T = TypeVar("T")
KEEP_IDLE = 4  # idle worker threads kept for the next call; a worker finishing past that ends


class Offload:
    """`fn(*args)`, a blocking call a step awaits, for `drive` to run on a worker until `deadline`
    (monotonic), past which `late()` is thrown in where it was awaited; with no deadline it runs
    right on the driving thread (nothing could cut it). Awaited anywhere but under `drive`: a
    RuntimeError."""

    __slots__ = ("fn", "args", "deadline", "late")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float | None,
                 late: type[BaseException] = Expired) -> None:
        self.fn, self.args, self.deadline, self.late = fn, args, deadline, late

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self)


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on this thread; each `Offload` it awaits runs on a worker thread while
    this thread waits (past its deadline: `Expired` is thrown in where it was awaited)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            asked = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        value, error = None, None
        if not isinstance(asked, Offload):
            coro.close()
            raise RuntimeError(f"a fenced step awaited {asked!r} outside an event loop")
        try:
            value = asked.fn(*asked.args) if asked.deadline is None else _WORKERS.call(asked)
        except KeyboardInterrupt:
            _cancel(coro)
            raise
        except BaseException as exc:  # noqa: BLE001 - the call's own exception, or Expired: raised in the step
            error = exc


def _cancel(coro: Coroutine[Any, Any, Any]) -> None:
    """The step is cancelled where it waits: it writes what a cancel writes, and ends."""
    try:
        coro.throw(asyncio.CancelledError())
    except (asyncio.CancelledError, StopIteration):
        pass
    finally:
        coro.close()


class _Job:
    __slots__ = ("fn", "args", "ctx", "done", "value", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.ctx = contextvars.copy_context()  # the caller's context (a framework's callbacks, tracing)
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None


class _Worker:
    """One daemon thread waiting on its own lock for the next job."""

    __slots__ = ("go", "job", "pool")

    def __init__(self, pool: _Workers) -> None:
        self.go = _thread.allocate_lock()
        self.go.acquire()
        self.job: _Job | None = None
        self.pool = pool
        threading.Thread(target=self._work, daemon=True, name="loopfence-fence-worker").start()

    def _work(self) -> None:
        while True:
            self.go.acquire()
            job = self.job
            assert job is not None
            self.job = None
            try:
                job.value = job.ctx.run(job.fn, *job.args)
            except BaseException as exc:  # noqa: BLE001 - raised again on the waiting thread
                job.error = exc
            kept = self.pool.idle_again(self)  # first: the waiting thread then wakes to a free GIL sooner
            job.done.release()
            if not kept:
                return


class _Workers:
    """The worker threads, shared by every fenced run in the process: an idle one takes the next
    job (a new one starts when none is idle); at most KEEP_IDLE wait idle."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.idle: list[_Worker] = []
        self.mu = threading.Lock()
        self.started = 0

    def call(self, op: Offload) -> Any:
        """`op` on a worker, waited for until its deadline."""
        deadline = op.deadline
        assert deadline is not None
        if time.monotonic() >= deadline:
            raise op.late()  # never started
        job = _Job(op.fn, op.args)
        with self.mu:
            worker = self.idle.pop() if self.idle else None
            if worker is None:
                self.started += 1
        if worker is None:
            worker = _Worker(self)
        worker.job = job
        worker.go.release()
        if not job.done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise op.late()  # the worker finishes it unobserved
        if job.error is not None:
            raise job.error
        return job.value

    def idle_again(self, worker: _Worker) -> bool:
        with self.mu:
            if len(self.idle) >= self.keep:
                return False
            self.idle.append(worker)
            return True


_WORKERS = _Workers(KEEP_IDLE)


def worker_threads() -> int:
    """How many worker threads fenced runs have started in this process."""
    return _WORKERS.started
