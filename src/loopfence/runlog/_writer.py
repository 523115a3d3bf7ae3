"""The JSONL run log: one event per line, flushed as it happens.

A killed process leaves a log readable up to its last complete line. Event kinds (field "event"):
header, request, reply, call, result, gate, resume, stop. Every event carries `seq` (0-based line number)
and `t` (seconds since the run started, monotonic).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from collections.abc import Callable
from typing import IO, Any

__all__ = ["RunLog", "FORMAT", "VERSION", "EVENT_KINDS"]

FORMAT = "loopfence.runlog"
VERSION = 1
_LINE = json.JSONEncoder(ensure_ascii=False, default=str)  # built once: json.dumps builds one per call
EVENT_KINDS = ("header", "request", "reply", "call", "result", "gate", "resume", "stop")


class RunLog:
    """Append-only event writer. `path=None` keeps events in memory only (tests, benchmarks)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, t0: float | None = None,
                 append: bool = False, seq: int = 0,
                 listener: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.events: list[dict[str, Any]] = []
        self.keep = path is None
        self._t0 = time.monotonic() if t0 is None else t0
        self._seq = seq
        self.listener = listener
        self._fh: IO[str] | None = None
        if self.path is not None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "seq": self._seq, "t": round(time.monotonic() - self._t0, 6),
                  **fields}
        self._seq += 1
        if self._fh is not None:
            self._fh.write(_LINE.encode(record) + "\n")
            self._fh.flush()
        if self.keep:
            self.events.append(record)
        if self.listener is not None:
            self.listener(record)
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
