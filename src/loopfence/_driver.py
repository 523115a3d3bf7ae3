"""Where the ring runs: on a runner thread, with the blocking work (model calls, tools) done on that
same thread, and one watchdog thread for every run's tool timeouts.

Why: a tool timeout must stop the *waiting* even when the tool cannot be stopped. Handing each tool
to a worker thread does that, but costs two cross-thread wake-ups per call (most of a step's cost).
Here the ring is a generator that yields its blocking operations (`Op`s); the runner performs each
one and sends the outcome back. While an operation runs, the generator is suspended, so whoever
*claims* the operation's `Slot` first owns the rest of the run:

- the runner, when the operation returns (the common case: no wake-up at all);
- the watchdog, when the operation's deadline passes: it sends the timeout result into the
  generator on a fresh runner; the old runner finishes the tool unobserved and goes back to the pool;
- the caller's thread on Ctrl-C: it throws KeyboardInterrupt into the generator and finishes there.

The caller waits once per run (two wake-ups per run, not per call).
"""

from __future__ import annotations

import _thread
import contextvars
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["Op", "Slot", "run_to_end", "take_slot", "interrupted", "interruptible"]

_INF = float("inf")
_MAIN_WAKE_S = 0.25


class Op:
    """A blocking operation the ring asks its runner to perform: `run()` returns what the ring's
    `yield` evaluates to, or raises what the ring's `yield` raises."""

    __slots__ = ()

    def run(self) -> Any:
        raise NotImplementedError


class Slot:
    """One operation in flight. `claim()` is true for exactly one caller: that caller continues the run."""

    __slots__ = ("_won", "ctl", "deadline", "on_timeout", "on_cancel")

    def __init__(self, ctl: _Ctl | None = None) -> None:
        self._won = _thread.allocate_lock()
        self.ctl = ctl
        self.deadline: float | None = None  # monotonic; set by `arm`
        self.on_timeout: Callable[[], Any] | None = None  # its value (or error) goes to the ring
        self.on_cancel: Callable[[], None] | None = None  # stops the work when Ctrl-C takes over

    def claim(self) -> bool:
        return self._won.acquire(False)

    def arm(self, deadline: float, on_timeout: Callable[[], Any]) -> None:
        """Past `deadline`, the watchdog claims this slot and the run goes on with `on_timeout()`
        (its return value, or what it raises, is what the ring's operation gives)."""
        if self.ctl is None:
            raise RuntimeError("Slot.arm outside a driven run")
        self.on_timeout = on_timeout
        _WATCHDOG.arm(self.ctl, self, deadline)

    def disarm(self) -> None:
        self.deadline = None

    def cancel(self) -> None:
        """Stop the operation's work, if it said how (the one that claimed the slot calls this)."""
        if self.on_cancel is not None:
            try:
                self.on_cancel()
            except Exception:  # noqa: BLE001, S110 - best effort: the run ends cancelled anyway
                pass


class _Ctl:
    """One run being driven: its generator, the operation in flight, and how it ended."""

    __slots__ = ("gen", "context", "slot", "interrupted", "finished", "done", "result", "error", "cpu")

    def __init__(self, gen: Generator[Op, Any, Any]) -> None:
        self.gen = gen
        self.context = contextvars.copy_context()  # the caller's context vars, on every runner
        self.slot: Slot | None = None
        self.interrupted = False
        self.finished = False
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self.cpu: list[float] = []  # CPU seconds per thread segment (appends are atomic)

    def finish(self) -> None:
        self.slot = None
        _WATCHDOG.forget(self)
        self.finished = True
        self.done.release()

    def fail(self, err: BaseException) -> None:
        """The run cannot go on (no thread to drive it): the caller gets `err`."""
        self.error = err
        self.finish()


class _Here(threading.local):
    ctl: _Ctl | None = None
    slot: Slot | None = None


_here = _Here()


def take_slot() -> Slot | None:
    """The slot of the operation this thread is performing for a run, if any, handed out once: the
    code that performs the operation (the executor, a model adapter) may `arm` a deadline on it or
    set `on_cancel`; code it calls in turn (a tool that itself calls a model) gets None."""
    slot, _here.slot = _here.slot, None
    return slot


def interrupted() -> bool:
    """Ctrl-C arrived for the run this thread is driving (the ring checks before logging an intent,
    so that a call it never started is answered not_executed rather than outcome_unknown)."""
    ctl = _here.ctl
    return ctl is not None and ctl.interrupted


def interruptible(fn: Callable[[], Any], poll_s: float = 0.1) -> Any:
    """Call a blocking `fn` (a terminal prompt) from the ring's own logic so that Ctrl-C still ends
    the run: outside a driven run this is just `fn()`; inside, `fn` runs on a helper thread and a
    Ctrl-C for this run raises KeyboardInterrupt here (the helper is left blocked)."""
    if _here.ctl is None:
        return fn()
    box: dict[str, Any] = {}
    done = threading.Event()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            box["value"] = context.run(fn)
        except BaseException as err:  # noqa: BLE001 - raised again on the ring's thread
            box["error"] = err
        finally:
            done.set()

    threading.Thread(target=work, daemon=True, name="loopfence-prompt").start()
    while not done.wait(poll_s):
        if interrupted():
            raise KeyboardInterrupt
    if "error" in box:
        raise box["error"]
    return box.get("value")


def run_to_end(gen: Generator[Op, Any, Any]) -> tuple[Any, float]:
    """Drive `gen` on a runner thread; this thread waits. Returns (its return value, CPU seconds
    spent by the threads that drove it). Ctrl-C while waiting is thrown into the ring at its current
    operation (a second Ctrl-C abandons the run)."""
    ctl = _Ctl(gen)
    _submit(ctl, None, None)
    try:
        _wait(ctl)
    except KeyboardInterrupt:
        if ctl.finished:
            raise  # it came as the run ended: nothing left to stop, and the log is complete
        ctl.interrupted = True  # the runner checks this before each operation...
        slot = ctl.slot  # ...and an operation in flight is taken over here
        if slot is not None and slot.claim():
            slot.cancel()
            if _drive(ctl, None, KeyboardInterrupt()):
                ctl.finish()
        _wait(ctl)
    if ctl.error is not None:
        raise ctl.error
    return ctl.result, sum(ctl.cpu)


def _wait(ctl: _Ctl) -> None:
    # The main thread wakes now and then: a SIGINT the kernel gave to another thread is only
    # handled (as KeyboardInterrupt, on the main thread) once the main thread runs again.
    timeout = _MAIN_WAKE_S if threading.current_thread() is threading.main_thread() else -1
    while not ctl.finished:
        ctl.done.acquire(timeout=timeout)


def _drive(ctl: _Ctl, value: Any, exc: BaseException | None) -> bool:
    """Send outcomes into the generator and perform what it yields, until it ends (True: the
    caller then calls ctl.finish()) or another thread claims the operation in flight (False)."""
    outer = (_here.ctl, _here.slot)
    _here.ctl = ctl
    cpu = time.thread_time()
    gen = ctl.gen
    try:
        while True:
            try:
                op = gen.throw(exc) if exc is not None else gen.send(value)
            except StopIteration as end:
                ctl.result = end.value
                break
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                ctl.error = err
                break
            value, exc = None, None
            slot = ctl.slot = Slot(ctl)
            if ctl.interrupted:
                if not slot.claim():
                    return False  # the caller took it over
                exc = KeyboardInterrupt()
                continue
            _here.slot = slot
            try:
                value = op.run()
            except BaseException as err:  # noqa: BLE001 - thrown into the ring at its yield
                exc = err
            finally:
                _here.slot = None
            if not slot.claim():
                return False  # timed out or interrupted: the run went on without this thread
    finally:
        ctl.cpu.append(time.thread_time() - cpu)
        _here.ctl, _here.slot = outer
    return True


class _Runner:
    """A reusable daemon thread that drives runs."""

    def __init__(self) -> None:
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self.job: tuple[_Ctl, Any, BaseException | None] | None = None
        threading.Thread(target=self._loop, daemon=True, name="loopfence-ring").start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            job, self.job = self.job, None
            assert job is not None
            ctl = job[0]
            try:  # in a copy: the thread it went on from may still be inside the original
                ended = ctl.context.copy().run(_drive, *job)
            except BaseException as err:  # noqa: BLE001 - never lose the run, never lose the thread
                ctl.error, ended = err, True
            _IDLE.append(self)  # back in the pool before the caller wakes: a next run reuses it
            if ended:
                ctl.finish()

    def start(self, ctl: _Ctl, value: Any, exc: BaseException | None) -> None:
        self.job = (ctl, value, exc)
        self._go.release()


_IDLE: list[_Runner] = []  # list.pop/append are atomic: concurrent runs share the pool safely


def _submit(ctl: _Ctl, value: Any, exc: BaseException | None) -> None:
    try:
        runner = _IDLE.pop()
    except IndexError:  # (not `if _IDLE`: another thread may take the last one in between)
        runner = _Runner()
    runner.start(ctl, value, exc)


class _Watchdog:
    """One thread for every run's deadlines. It sleeps until the earliest armed deadline; arming a
    later one (every step of a run with a fixed timeout) does not wake it."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._runs: set[_Ctl] = set()
        self._target = _INF
        self._thread: threading.Thread | None = None

    def arm(self, ctl: _Ctl, slot: Slot, deadline: float) -> None:
        if slot._won.locked() or ctl.finished:
            return  # the operation is over (an abandoned tool arming late): nothing to watch
        with self._cond:
            slot.deadline = deadline
            self._runs.add(ctl)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="loopfence-watchdog")
                self._thread.start()
            if deadline < self._target:
                self._target = deadline
                self._cond.notify()

    def forget(self, ctl: _Ctl) -> None:
        if ctl in self._runs:
            with self._cond:
                self._runs.discard(ctl)

    def _loop(self) -> None:
        while True:
            expired: list[tuple[_Ctl, Slot]] = []
            with self._cond:
                now = time.monotonic()
                target = _INF
                for ctl in self._runs:
                    slot = ctl.slot
                    if slot is None or slot.deadline is None:
                        continue
                    if slot.deadline > now:
                        target = min(target, slot.deadline)
                    elif slot.claim():
                        expired.append((ctl, slot))
                self._target = target
                if not expired:
                    self._cond.wait(None if target == _INF else target - now)
                    continue
            for ctl, slot in expired:  # the run goes on, on a fresh runner, with the timeout result
                value, exc = None, None
                try:
                    value = slot.on_timeout() if slot.on_timeout is not None else None
                except BaseException as err:  # noqa: BLE001 - the ring decides what an error means
                    exc = err
                try:
                    _submit(ctl, value, exc)
                except BaseException as err:  # noqa: BLE001 - e.g. no thread can be started
                    ctl.fail(err)


_WATCHDOG = _Watchdog()
