"""The JSONL run log: one event per line (compact JSON), written as it happens (see `hold`).

A killed process leaves a log readable up to its last complete line; so does a write that fails
(a full disk): `LogWriteError` then stops the run, and every later write refuses. Event kinds (field "event"):
header, request, reply, call, result, gate, resume, retry, stop. Every event carries `seq` (0-based line
number) and `t` (seconds since the run started, monotonic). Each event is its schema model
(_log/_schema.py), checked when it was built: the log holds only lines the reader accepts. A large
value is written once (_log/_large.py): a call's large arguments stay in the reply that brought them.
"""

from __future__ import annotations

import errno
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from .._keywords import keywords_checked
from .._json import line
from ._large import KEYED, shrink
from ._schema import EVENT_KINDS, FORMAT, VERSION, LogEvent, ReplyLine

E = TypeVar("E", bound=LogEvent)

__all__ = ["RunLog", "LogWriteError", "Abandoned", "FORMAT", "VERSION", "EVENT_KINDS", "E", "written"]


class LogWriteError(OSError):
    """The run log could not be written (a full disk, /dev/full): the run cannot go on unlogged."""

    def __init__(self, path: str, lines: int, why: str, *, opening: bool = False) -> None:
        tail = f"; its first {lines} lines are complete: `loopfence resume {path}` continues the run " \
            "once the log can be written" if lines else ""
        what = f"cannot open the run log {path}: {why} (nothing was run)" if opening else \
            f"cannot write the run log {path}: {why}; the run was stopped{tail}"
        super().__init__(what)
        self.path, self.lines = path, lines


def _open(path: str, mode: str) -> IO[bytes]:
    """The log file, unbuffered, its folder made if it is new (checked only then: a batch opens
    thousands); LogWriteError when it cannot be opened, before anything is run."""
    try:
        try:
            return open(path, mode, buffering=0)  # noqa: SIM115
        except FileNotFoundError:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return open(path, mode, buffering=0)  # noqa: SIM115
    except OSError as exc:
        why = exc.strerror or str(exc)
        error = LogWriteError(path, 0, why, opening=True)
        error.strerror = why  # what the CLI's one line says after the path (str(error) stays the message)
        raise error from None


class Abandoned(BaseException):
    """Ends the driving of a run with no stop line: the log is not this run's to finish (playback
    raises a subclass when the run it drives left the recording). BaseException: never a stop."""


_HELD = frozenset({"reply", "result"})  # what `hold` keeps back: each follows an operation's end


def written(ev: LogEvent) -> dict[str, Any]:
    """An event's fields as its line holds them: what its writer set (a field left at its default
    is left out, as older logs do), without the stamp."""
    return ev.model_dump(exclude_unset=True, exclude={"event", "seq", "t"})


@keywords_checked
class RunLog:
    """Append-only event writer. `path=None` keeps events in memory only (tests, benchmarks).

    It takes the schema's own event models (_log/_schema.py), built and so checked by whoever
    writes them, stamps each with its `seq` and `t`, serialises it, and hands the same object to
    `on_event` (the live stream, the console, OTel): one event, one record.
    """

    hold = False
    """True: a `reply` or `result` line is written with the next line (or at `flush()`/`close()`)
    rather than on its own. The ring holds while it runs and flushes before every operation it
    awaits (each `request` and `call` line goes out with what was held, before its operation
    starts), so the file is whole whenever the run waits: two writes a step instead of four."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, t0: float | None = None,
                 append: bool = False, seq: int = 0,
                 on_event: Callable[[LogEvent], None] | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.events: list[dict[str, Any]] = []
        self.keep = path is None
        self._t0 = time.monotonic() if t0 is None else t0
        self._seq = seq
        self.on_event = on_event  # each event, typed, as it is written
        self._fh: IO[bytes] | None = None
        self._broken: LogWriteError | None = None  # a write failed: every later write refuses
        self._held: list[bytes] = []  # lines kept back (`hold`), written with the next one
        self._written = seq  # lines known complete in the file
        self._observer_failed = False  # an on_event raised (warned once)
        self._reply_raw: Any = None  # the latest reply's raw response (where a call's arguments are)
        self._resting = False  # the file closed by `rest()`: the next line opens it again
        if self.path is not None:
            self._fh = _open(self.path, "ab" if append else "wb")

    @property
    def t0(self) -> float:
        """The monotonic time the log's `t` counts from."""
        return self._t0

    def write(self, ev: E) -> E:
        """The event as the log's next line: stamped, written (or held: `hold`), and passed on."""
        event = ev.event
        fields = written(ev)
        if isinstance(ev, ReplyLine):
            self._reply_raw = ev.raw
        elif event in KEYED:
            fields = shrink(event, fields, self._reply_raw)
        t = round(time.monotonic() - self._t0, 6)
        record = {"event": event, "seq": self._seq, "t": t, **fields}
        ev = ev.stamped(self._seq, t, record)
        self._seq += 1
        if self._resting:
            self._fh, self._resting = _open(self.path, "ab"), False  # type: ignore[arg-type]  (resting: a path)
        if self._fh is not None:
            if self.hold and event in _HELD:
                if self._broken is not None:
                    raise self._broken
                self._held.append(line(record))
            else:
                self._put(line(record))
        if self.keep:
            self.events.append(record)
        if self.on_event is not None:
            self._notify(self.on_event, ev, event)
        return ev

    def _notify(self, observer: Callable[[LogEvent], None], value: LogEvent, event: str) -> None:
        """An observer's bug never changes the run or its log: it is warned about once, and the
        run goes on (its stop, its counts and its log are what they would have been)."""
        try:
            observer(value)
        except Exception as exc:  # noqa: BLE001
            if not self._observer_failed:
                self._observer_failed = True
                warnings.warn(f"loopfence: the run's event callback raised {type(exc).__name__}: {exc} (on a "
                              f"{event!r} event); the run goes on without it", RuntimeWarning, stacklevel=3)

    def flush(self) -> None:
        """Write the lines `hold` kept back."""
        if self._held and self._fh is not None:
            self._put(b"")

    def _put(self, data: bytes) -> None:
        """The held lines and this one, whole, or LogWriteError (unbuffered: nothing is left to fail
        later at close)."""
        assert self._fh is not None and self.path is not None
        if self._broken is not None:
            raise self._broken
        if self._held:
            data = b"".join(self._held) + data
            self._held.clear()
        view = memoryview(data)
        try:
            while view:
                n = self._fh.write(view)
                if not n:
                    raise OSError(errno.EIO, "nothing was written")
                view = view[n:]
        except OSError as exc:  # the lines written before these are complete
            self._broken = LogWriteError(self.path, self._written, exc.strerror or str(exc))
            raise self._broken from None
        self._written = self._seq

    def rest(self) -> None:
        """The file closed until the next line, which opens it again to append: a run that waits long
        on someone else (a proxy run between its client's requests) holds no file descriptor."""
        if self._fh is not None and self._broken is None:
            self.flush()
            self._fh.close()
            self._fh, self._resting = None, True

    def close(self) -> None:
        self._resting = False
        if self._fh is not None:
            try:
                if self._broken is None:
                    self.flush()
            finally:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
