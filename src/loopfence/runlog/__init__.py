"""The JSONL run log: the writer, a strict reader, and what reads it back.

`read_log` (strict; `tolerant=True` for resume), `reconcile`, `replay`, `resume` and `to_atif` are
imported on first use: replay and resume drive the ring, which itself imports the writer from here.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ._events import LogError
from ._reader import RunLogFile, read_log
from ._writer import EVENT_KINDS, FORMAT, VERSION, RunLog

__all__ = ["EVENT_KINDS", "FORMAT", "LogError", "RunLog", "RunLogFile", "VERSION", "read_log",
           "reconcile", "Reconciliation", "replay", "ReplayReport", "resume", "ResumeOutcome",
           "ResumeError", "to_atif"]

_LAZY = {"reconcile": "_reconcile", "Reconciliation": "_reconcile", "replay": "_replay",
         "ReplayReport": "_replay", "resume": "_resume", "ResumeOutcome": "_resume",
         "ResumeError": "_resume", "to_atif": "_atif"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
