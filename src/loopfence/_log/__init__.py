"""The JSONL run log, low in the layers: the schema (the typed events), the writer and a strict reader.

Nothing here drives or re-checks the ring: the loop imports the writer from here. The public names
(with `replay`, `resume`, `reconcile` and `to_atif`, which sit above the loop) are `loopfence.runlog`.
"""

from ._errors import LogError
from ._reader import RunLogFile, read_log
from ._writer import EVENT_KINDS, FORMAT, VERSION, LogWriteError, RunLog

__all__ = ["EVENT_KINDS", "FORMAT", "LogError", "LogWriteError", "RunLog", "RunLogFile", "VERSION", "read_log"]
