"""Reading a run log back. Strict by default: anything odd is an error naming the file and line.

Strict (replay, reconcile, export): an empty file, a first line that is not a loopfence.runlog header
of a version this loopfence reads (1 to 4), a line that is not a JSON object, an unknown event kind, a
line its model (_log/_schema.py) refuses (a field of the wrong type, an unknown decision), or a last
line without its newline (a truncated write) -> LogError. Never a partial success.

Tolerant (resume): a process killed mid-write leaves at most one incomplete last line; it is set
aside (`RunLogFile.torn_bytes`) and the log reads back to its last complete line. Damage anywhere
else is still an error.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from pydantic import ValidationError

from .._json import MAX_LOG_DEPTH, JsonFileError, JsonLimitError, loads, read_bounded
from ._errors import LogError, problem
from ._schema import EVENT_KINDS, FORMAT, READS_VERSIONS, VERSION, HeaderLine, LogEvent, StopLine, parse_line
from ._segments import joined

__all__ = ["RunLogFile", "read_log", "parse_log", "LogError", "MAX_LOG_BYTES"]

MAX_LOG_BYTES = 256 << 20  # a run log read back (replay, reconcile, export, resume)


@dataclass(frozen=True, slots=True)
class RunLogFile:
    """A run log as read: the header, the events after it (in order), and what was set aside. Each
    event is its line's model (_log/_schema.py), with its `line` and its `record` as read."""

    path: str
    header: HeaderLine
    events: tuple[LogEvent, ...]
    complete_bytes: int  # length of the file up to the end of its last complete line
    torn_bytes: int = 0  # bytes of an incomplete last line (tolerant mode only)
    reopened: tuple[LogEvent, ...] = ()  # a stop `resume` continued past, and its bookkeeping (_segments)

    @property
    def stop(self) -> StopLine | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, StopLine) else None

    @property
    def all_events(self) -> tuple[LogEvent, ...]:
        return (self.header, *self.events)

    def of(self, kind: str) -> list[LogEvent]:
        return [e for e in self.events if e.event == kind]

    @property
    def next_seq(self) -> int:
        return max(e.seq for e in (*self.all_events, *self.reopened)) + 1


def read_log(path: str | os.PathLike[str], *, tolerant: bool = False) -> RunLogFile:
    """Read and check a run log. `tolerant=True` sets aside an incomplete last line (for resume)."""
    p = str(path)
    _regular(p)
    try:
        data = read_bounded(p, MAX_LOG_BYTES, "run log")
    except JsonFileError as exc:
        raise LogError(p, 0, str(exc).removeprefix(f"{p}: ")) from None
    return parse_log(p, data, tolerant=tolerant)


def parse_log(p: str, data: bytes, *, tolerant: bool = False) -> RunLogFile:
    """A run log's bytes checked as `read_log` checks a file's (`p` names it in errors)."""
    if not data:
        raise LogError(p, 1, "empty file: a run log starts with a header line")
    complete_bytes = len(data)
    torn = 0
    cut_line = None  # the line number of an incomplete last line: said once the lines before it read
    if not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        cut_line = data.count(b"\n") + 1
        if not cut and not data.decode("utf-8", "replace").startswith("{"):
            _parse_line(p, 1, data)  # not a log at all (random bytes) says so, not "cut off"
        torn, complete_bytes, data = len(data) - cut, cut, data[:cut]
    lines = data.split(b"\n")[:-1]
    if not lines:
        raise LogError(p, 1, "no complete line: the header itself was cut off")
    events = [_parse_line(p, i, raw) for i, raw in enumerate(lines, 1)]
    head = events[0]
    if not isinstance(head, HeaderLine):
        raise LogError(p, 1, f"the first line must be a header event, got {head.event!r}")
    if cut_line is not None and not tolerant:
        raise LogError(p, cut_line, "truncated last line (no newline): the writing process "
                       "stopped mid-line; `loopfence resume` reads back to the last complete line")
    for i, e in enumerate(events[1:], 2):
        if isinstance(e, HeaderLine):
            raise LogError(p, i, "a second header: one log holds one run")
    header, kept, aside = joined(p, head, events[1:])
    return RunLogFile(p, header, tuple(kept), complete_bytes, torn, tuple(aside))


def _regular(path: str) -> None:
    """A run log is a regular file: a FIFO with no writer would block the read forever, a device
    never ends. Checked without opening it (stat does not wait for a writer)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: the read says so, in its words
    if not stat.S_ISREG(mode):
        kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
        raise LogError(path, 0, f"{kind}, not a run log file: loopfence reads a log from a regular file only")


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _parse_line(path: str, lineno: int, raw: bytes) -> LogEvent:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogError(path, lineno, f"not UTF-8 text: {exc.reason}") from None
    if not text.strip():
        raise LogError(path, lineno, "blank line")
    try:
        record = loads(text, max_depth=MAX_LOG_DEPTH)
    except JsonLimitError as exc:
        raise LogError(path, lineno, f"JSON over a limit: {exc.msg}") from None
    except json.JSONDecodeError as exc:
        raise LogError(path, lineno, f"not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(record, dict):
        raise LogError(path, lineno, f"not a JSON object: {type(record).__name__}")
    kind = record.get("event")
    if not isinstance(kind, str):
        raise LogError(path, lineno, "no \"event\" field naming the event kind")
    if kind not in EVENT_KINDS:
        raise LogError(path, lineno, f"unknown event kind {kind!r} (known: {', '.join(EVENT_KINDS)})")
    if kind == "header":
        if record.get("format") != FORMAT:
            raise LogError(path, lineno, f"header format is {record.get('format')!r}, expected {FORMAT!r}")
        version = record.get("version")
        if version not in READS_VERSIONS or isinstance(version, bool):
            raise LogError(path, lineno, f"header version is {version!r}, this loopfence writes version "
                           f"{VERSION} and reads versions {READS_VERSIONS[0]} to {READS_VERSIONS[-1]}")
    try:
        m = parse_line(record)
    except ValidationError as exc:
        raise LogError(path, lineno, problem(kind, exc)) from None
    ev = m.stamped(m.seq, m.t, record, lineno, path)
    if isinstance(ev, HeaderLine):
        ev.specs  # noqa: B018 (checked here: a header read back always has its tool specs)
    return ev
