"""run(): the ring on a runner thread, its blocking operations right there, a watchdog for deadlines.

A sync tool or a sync model handed to a worker thread costs two cross-thread wake-ups per step
(measured: ~190 µs a round trip on the 2-core VMs this project runs on, more than the rest of a
step). Under `run()` the run's task has an event loop of its own on a runner thread, so a blocking
operation (`_aio.Blocking`) runs there, in a loop callback, while the task waits on a future. Because
the task is suspended, not running, whoever *claims* the operation first owns the rest of the run:

- the runner, when the operation returns (the common case: no wake-up at all);
- the watchdog, when the operation's deadline passes: the task's coroutine is resumed on a fresh
  runner with a fresh loop, where the operation raises `Expired`; the old runner finishes the
  operation unobserved, sees that it lost, and abandons its loop;
- the caller's thread on Ctrl-C: the same, with the Ctrl-C cancel as the outcome.

The caller waits once per run. Under `arun()` (the user's loop, shared with other work) and for
any task other than the run's own, a `Blocking` goes to the worker pool (`in_thread`) instead.
While the operation runs inline, no event loop is running on the thread (as on a worker), so a
sync tool may call `asyncio.run()` itself.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["Drive", "DRIVE", "drive_sync", "close_loop", "watchdog_threads"]

T = TypeVar("T")
_INF = float("inf")


class _Op:
    """One inline operation: the first to `claim` it decides its outcome and continues the run."""

    __slots__ = ("fn", "args", "mu", "how", "value", "error", "cpu")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.mu = threading.Lock()
        self.how = ""  # "done": the runner; "taken": the run moved on; "dropped": the task left it
        self.value: Any = None
        self.error: BaseException | None = None
        self.cpu = 0.0

    def claim(self, how: str) -> bool:
        """True for the first caller only; after a False, `how` says who won."""
        with self.mu:
            if self.how:
                return False
            self.how = how
            return True


class _Suspend:
    """Await a future without Future.__await__'s check that it is done: a takeover resumes the
    coroutine (on another loop) while the future stays pending forever."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[Any]) -> None:
        self.fut = fut

    def __await__(self) -> Generator[Any, None, None]:
        self.fut._asyncio_future_blocking = True
        yield self.fut


class Drive:
    """One run() being driven: its coroutine, context, the loop and task of its current runner."""

    def __init__(self, coro: Coroutine[Any, Any, Any], ctx: contextvars.Context) -> None:
        self.coro, self.ctx = coro, ctx
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.op: _Op | None = None  # the inline operation in flight
        self.pressed = False  # Ctrl-C arrived (the ring checks before it starts an operation)
        self.done = _thread.allocate_lock()  # held until the run ends (a plain lock: a Ctrl-C
        self.done.acquire()  # landing in its wait leaves nothing half-done, unlike an Event's)
        self.value: Any = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.generations = 0
        self.finished = False
        self.on_end: Callable[[], None] | None = None  # wakes a caller waiting in select()

    # -- runners ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.generations += 1
        _thread.start_new_thread(self._generation, ())  # no wait for it to start (Ctrl-C may land)

    def _generation(self) -> None:
        """Drive the coroutine from where it is to its end (or until this runner loses an
        operation to a takeover) on a fresh event loop."""
        loop = asyncio.new_event_loop()
        task = loop.create_task(self.coro, context=self.ctx)
        with self.lock:
            self.loop, self.task = loop, task
        lost = False
        try:
            self.value = loop.run_until_complete(task)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            lost = getattr(loop, "_loopfence_lost", False)
            if not lost:
                self.error = exc
        finally:
            if lost:
                task._log_destroy_pending = False  # type: ignore[attr-defined]  # it lives on elsewhere
                loop.close()
            else:
                close_loop(loop)
                self.finished = True
                self.done.release()
                if (wake := self.on_end) is not None:
                    wake()

    # -- inline operations -----------------------------------------------------------------------
    async def inline(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float | None) -> _Op:
        """Run `fn(*args)` on this runner's thread while the task waits; past `deadline` the
        watchdog moves the run to a new runner, where this returns the operation `taken` (its
        `error` None for a deadline, the cancel for Ctrl-C). Otherwise `done`: its value or error."""
        loop = asyncio.get_running_loop()
        op = _Op(fn, args)
        fut = loop.create_future()
        self.op = op
        loop.call_soon(self._perform, loop, op, fut)
        if deadline is not None:
            _WATCHDOG.arm(op, deadline, self)
        try:
            await _Suspend(fut)
        except BaseException:  # cancelled on this loop: the operation's outcome is no longer awaited
            op.claim("dropped")
            raise
        finally:
            self.op = None
            if deadline is not None:
                _WATCHDOG.disarm(op)
        return op

    def _perform(self, loop: asyncio.AbstractEventLoop, op: _Op, fut: asyncio.Future[Any]) -> None:
        """The loop callback: the operation itself, unless someone claimed it first."""
        if op.how:  # taken before it started (its deadline, Ctrl-C) or dropped
            if op.how == "taken":
                self._abandon(loop)
            return
        asyncio.events._set_running_loop(None)  # as on a worker: the tool may run its own loop
        start = time.thread_time()
        value, error = None, None
        try:
            value = op.fn(*op.args)
        except BaseException as exc:  # noqa: BLE001 - raised again where the operation is awaited
            error = exc
        finally:
            asyncio.events._set_running_loop(loop)
        op.cpu = time.thread_time() - start
        if op.claim("done"):
            op.value, op.error = value, error
            if not fut.done():
                fut.set_result(None)
        elif op.how == "taken":
            self._abandon(loop)

    @staticmethod
    def _abandon(loop: asyncio.AbstractEventLoop) -> None:
        """The run went on without this runner: stop its loop, never to run this task again."""
        loop._loopfence_lost = True  # type: ignore[attr-defined]
        loop.stop()

    def take_over(self, op: _Op, error: BaseException | None) -> None:
        """After claiming `op` ("taken"): the run goes on on a new runner; the operation raises
        `error` there (None: Expired)."""
        op.error = error
        self.start()

    # -- Ctrl-C ----------------------------------------------------------------------------------
    def interrupt(self, error: BaseException) -> None:
        """Ctrl-C from the caller's thread: an inline operation in flight is taken over with
        `error` as its outcome; otherwise the task is cancelled where it waits."""
        self.pressed = True
        with self.lock:
            op, loop, task = self.op, self.loop, self.task
        if op is not None and op.claim("taken"):
            self.take_over(op, error)
            return
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(_cancel, task, error.args[0] if error.args else None)
            except RuntimeError:  # that loop is closed: the run is already ending
                pass


def _cancel(task: asyncio.Task[Any], msg: Any) -> None:
    if not task.done():
        task.cancel(msg)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what was left on a loop (a second Ctrl-C left the run's task behind: it still writes
    its stop), then close it."""
    try:
        left = asyncio.all_tasks(loop)
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


DRIVE: contextvars.ContextVar[Drive | None] = contextvars.ContextVar("loopfence_drive", default=None)
"""The run() driving the task in this context."""


def drive_sync(coro: Coroutine[Any, Any, T], cancel_error: Callable[[], BaseException]) -> T:
    """Run `coro` (a run's task) to its end on a runner thread while this thread waits; a Ctrl-C
    here interrupts the run (`cancel_error()` is its outcome), a second raises KeyboardInterrupt."""
    d = Drive(coro, contextvars.copy_context())
    d.ctx.run(DRIVE.set, d)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        with _CtrlC(d, cancel_error) as ctrl:
            d.start()
            ctrl.wait()
    else:  # not ours to handle: KeyboardInterrupt, if it comes here, interrupts the run
        while True:
            try:
                if not d.generations:
                    d.start()
                d.done.acquire()
                break
            except KeyboardInterrupt:
                if d.pressed:
                    raise
                d.interrupt(cancel_error())
    if d.error is not None:
        raise d.error
    return d.value  # type: ignore[no-any-return]


class _CtrlC:
    """On the main thread: the first Ctrl-C interrupts the run (a handler that raises nothing: an
    exception raised inside a wait can leave a lock held), a second raises KeyboardInterrupt. The
    thread waits in select() on the signal wakeup fd and the run's end, so a signal the kernel
    handed to another thread still brings it back to run the handler at once."""

    def __init__(self, d: Drive, cancel_error: Callable[[], BaseException]) -> None:
        self.d, self.cancel_error = d, cancel_error
        self.sig_r, self.sig_w = socket.socketpair()
        self.end_r, self.end_w = socket.socketpair()
        self.old_fd = -1

    def __enter__(self) -> _CtrlC:
        for sock in (self.sig_r, self.sig_w, self.end_r, self.end_w):
            sock.setblocking(False)
        self.d.on_end = self._ended
        self.old_fd = signal.set_wakeup_fd(self.sig_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(self.old_fd)
        self.d.on_end = None
        for sock in (self.sig_r, self.sig_w, self.end_r, self.end_w):
            sock.close()

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.d.pressed:
            raise KeyboardInterrupt
        self.d.interrupt(self.cancel_error())

    def _ended(self) -> None:
        try:
            self.end_w.send(b"x")
        except OSError:  # closed: the caller has gone (a second Ctrl-C)
            pass

    def wait(self) -> None:
        while not self.d.finished:
            ready, _, _ = select.select([self.sig_r, self.end_r], [], [])
            if self.sig_r in ready:
                try:
                    while self.sig_r.recv(4096):
                        pass
                except OSError:
                    pass


# -- the watchdog ----------------------------------------------------------------------------------
class _Watchdog:
    """One thread for every inline operation's deadline. Arming costs a lock, not a wake-up: the
    thread is woken only when a deadline comes before the one it sleeps until."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # arm/disarm take it directly (a Condition's `with` is Python code)
        self.cond = threading.Condition(self.lock)
        self.active: dict[_Op, tuple[float, Drive]] = {}
        self.wake_at = _INF
        self.thread: threading.Thread | None = None

    def arm(self, op: _Op, deadline: float, d: Drive) -> None:
        with self.lock:
            self.active[op] = (deadline, d)
            if deadline < self.wake_at:
                self.wake_at = deadline
                if self.thread is None:
                    self.thread = threading.Thread(target=self._watch, daemon=True, name="loopfence-watchdog")
                    self.thread.start()
                self.cond.notify()

    def disarm(self, op: _Op) -> None:
        with self.lock:
            self.active.pop(op, None)

    def _watch(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                due = [(op, d) for op, (at, d) in self.active.items() if at <= now]
                for op, _ in due:
                    del self.active[op]
                if not due:
                    self.wake_at = min((at for at, _ in self.active.values()), default=_INF)
                    self.cond.wait(None if self.wake_at == _INF else self.wake_at - now)
                    continue
            for op, d in due:
                if op.claim("taken"):
                    d.take_over(op, None)


_WATCHDOG = _Watchdog()


def watchdog_threads() -> int:
    """1 once any inline operation had a deadline, else 0."""
    return 0 if _WATCHDOG.thread is None else 1
