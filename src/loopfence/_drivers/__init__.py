"""What drives the ring again from a log: replay, resume, reconcile's stop check (`_refold`: the
log folded through the ring with the guards it runs) and their shared playback.

They sit above the loop (they call `drive`); `loopfence.runlog.replay`/`resume` re-export them
lazily. Layers: docs/ARCHITECTURE.md, enforced by tests/test_layers.py.
"""

from ._replay import ReplayReport, replay
from ._resume import ResumeError, ResumeOutcome, resume

__all__ = ["ReplayReport", "ResumeError", "ResumeOutcome", "replay", "resume"]
