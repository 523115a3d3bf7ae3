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
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["Op", "Slot", "run_to_end", "current_slot", "interrupted", "interruptible"]

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

    __slots__ = ("_won", "deadline", "on_timeout")

    def __init__(self) -> None:
        self._won = _thread.allocate_lock()
        self.deadline: float | None = None  # monotonic; set by `arm`
        self.on_timeout: Callable[[], Any] | None = None

    def claim(self) -> bool:
        return self._won.acquire(False)

    def arm(self, deadline: float, on_timeout: Callable[[], Any]) -> None:
        """Past `deadline`, the watchdog claims this slot and the run goes on with `on_timeout()`."""
        self.on_timeout = on_timeout
        _WATCHDOG.arm(_here.ctl, self, deadline)


class _Ctl:
    """One run being driven: its generator, the operation in flight, and how it ended."""

    __slots__ = ("gen", "slot", "interrupted", "finished", "done", "result", "error", "cpu_s")

    def __init__(self, gen: Generator[Op, Any, Any]) -> None:
        self.gen = gen
        self.slot: Slot | None = None
        self.interrupted = False
        self.finished = False
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self.cpu_s = 0.0


class _Here(threading.local):
    ctl: _Ctl | None = None
    slot: Slot | None = None


_here = _Here()


def current_slot() -> Slot | None:
    """The slot of the operation this thread is performing for a run, if any: a tool executed under
    it may `arm` a deadline instead of handing itself to another thread."""
    return _here.slot


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

    def work() -> None:
        try:
            box["value"] = fn()
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
            _drive(ctl, None, KeyboardInterrupt())
        _wait(ctl)
    if ctl.error is not None:
        raise ctl.error
    return ctl.result, ctl.cpu_s


def _wait(ctl: _Ctl) -> None:
    # The main thread wakes now and then: a SIGINT the kernel gave to another thread is only
    # handled (as KeyboardInterrupt, on the main thread) once the main thread runs again.
    timeout = _MAIN_WAKE_S if threading.current_thread() is threading.main_thread() else -1
    while not ctl.finished:
        ctl.done.acquire(timeout=timeout)


def _drive(ctl: _Ctl, value: Any, exc: BaseException | None) -> None:
    """Send outcomes into the generator and perform what it yields, until it ends or another
    thread claims the operation in flight."""
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
            slot = ctl.slot = Slot()
            if ctl.interrupted:
                if not slot.claim():
                    return  # the caller took it over
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
                return  # timed out or interrupted: the run went on without this thread
    finally:
        ctl.cpu_s += time.thread_time() - cpu
        _here.ctl, _here.slot = outer
    ctl.slot = None
    _WATCHDOG.forget(ctl)
    ctl.finished = True
    ctl.done.release()


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
            _drive(*job)
            _IDLE.append(self)

    def start(self, ctl: _Ctl, value: Any, exc: BaseException | None) -> None:
        self.job = (ctl, value, exc)
        self._go.release()


_IDLE: list[_Runner] = []  # list.pop/append are atomic: concurrent runs share the pool safely


def _submit(ctl: _Ctl, value: Any, exc: BaseException | None) -> None:
    (_IDLE.pop() if _IDLE else _Runner()).start(ctl, value, exc)


class _Watchdog:
    """One thread for every run's deadlines. It sleeps until the earliest armed deadline; arming a
    later one (every step of a run with a fixed timeout) does not wake it."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._runs: set[_Ctl] = set()
        self._target = _INF
        self._thread: threading.Thread | None = None

    def arm(self, ctl: _Ctl | None, slot: Slot, deadline: float) -> None:
        if ctl is None:
            raise RuntimeError("Slot.arm outside a driven run")
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
                assert slot.on_timeout is not None
                try:
                    _submit(ctl, slot.on_timeout(), None)
                except BaseException as err:  # noqa: BLE001 - the ring decides what an error means
                    _submit(ctl, None, err)


_WATCHDOG = _Watchdog()
