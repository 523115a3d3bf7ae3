"""The run log, public: write one, read it back, and fold it back through the ring.

    from loopfence.runlog import read_log, reconcile, replay, resume, to_atif

A facade at the top of the layers: the writer, the reader and the schema live low in `loopfence._log`
(the loop writes through them); `replay`, `resume` and `reconcile` drive or re-check the ring from
`loopfence._drivers`, and `to_atif` is an export (`loopfence._report`). Importing this module loads them
all; nothing below it imports it (tests/test_layers.py).
"""

from ._drivers import Reconciliation, ReplayReport, ResumeError, ResumeOutcome, reconcile, replay, resume
from ._log import EVENT_KINDS, FORMAT, VERSION, LogError, LogWriteError, RunLog, RunLogFile, read_log
from ._report._atif import to_atif

__all__ = ["EVENT_KINDS", "FORMAT", "LogError", "LogWriteError", "Reconciliation", "ReplayReport", "ResumeError",
           "ResumeOutcome", "RunLog", "RunLogFile", "VERSION", "read_log", "reconcile", "replay", "resume",
           "to_atif"]
