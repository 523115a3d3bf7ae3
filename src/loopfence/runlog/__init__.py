"""The JSONL run log: the writer, a strict reader, and what reads it back.

`read_log` (strict; `tolerant=True` for resume) and the writer live here, low in the layers (the
loop imports the writer). `reconcile`, `replay`, `resume` and `to_atif` are re-exported on first
use: replay and resume drive the ring, so they live above the loop in `loopfence._drivers`, and this
package names them only inside `__getattr__` (the allowlisted facade edges in tests/test_layers.py).
"""

from __future__ import annotations

from typing import Any

from ._events import LogError
from ._reader import RunLogFile, read_log
from ._writer import EVENT_KINDS, FORMAT, VERSION, LogWriteError, RunLog

__all__ = ["EVENT_KINDS", "FORMAT", "LogError", "LogWriteError", "RunLog", "RunLogFile", "VERSION", "read_log",
           "reconcile", "Reconciliation", "replay", "ReplayReport", "resume", "ResumeOutcome",
           "ResumeError", "to_atif"]


def __getattr__(name: str) -> Any:
    """The public names that sit above the log (they drive or re-check the ring), loaded on use."""
    if name in ("reconcile", "Reconciliation"):
        from . import _reconcile

        return getattr(_reconcile, name)
    if name in ("replay", "ReplayReport", "resume", "ResumeOutcome", "ResumeError"):
        from .. import _drivers

        return getattr(_drivers, name)
    if name == "to_atif":
        from ._atif import to_atif

        return to_atif
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
