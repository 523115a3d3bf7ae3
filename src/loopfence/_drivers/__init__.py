"""What drives or re-checks the ring from a log: replay, resume, reconcile (its stop check, `_refold`,
folds the log through the ring with the guards it runs), their shared playback, and `_rebuild` (a run's
configuration read back from its log header).

They sit above the loop (they call `drive`); `loopfence.runlog` is their public face. Layers:
docs/ARCHITECTURE.md, enforced by tests/test_layers.py.
"""

from ._reconcile import Reconciliation, reconcile
from ._replay import ReplayReport, replay
from ._resume import ResumeError, ResumeOutcome, resume

__all__ = ["Reconciliation", "ReplayReport", "ResumeError", "ResumeOutcome", "reconcile", "replay", "resume"]
