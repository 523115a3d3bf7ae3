"""An unfinished log (no stop line: its process died) folded through the ring, as far as it goes.

Reconcile's `limit_reached` asks whether the guards stop where a finished log stops. A log with no
stop can only be asked the half of that which its lines hold: fed the log, the ring with the guards
it runs must follow every recorded decision and never stop before the log's last line. Where the
ring, fed everything, stops at the very end, the run was killed between its last decision and its
stop line: `loopfence resume` writes that stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._guards import Guard
from .._log import LogError
from .._log._reader import RunLogFile
from ._playback import Playback, RecordingEnded, decisions
from ._rebuild import gated_names, limits_of, registry_of

__all__ = ["PrefixFold", "fold_prefix"]


@dataclass(frozen=True, slots=True)
class PrefixFold:
    """The fold's verdict on an unfinished log: `ok` when the ring follows it to its last line."""

    ok: bool
    detail: str


def fold_prefix(log: RunLogFile, guards: list[Guard] | None = None) -> PrefixFold:
    """Fold an unfinished log (no stop event) through the ring with the guards it runs."""
    h = log.header
    try:
        playback = Playback.of(log, registry_of(h, (), gated_names(log.events)), limits_of(h, log.path),
                               guards=guards, what_if=True, compare=decisions, logged_taint=True)
    except (TypeError, ValueError) as exc:  # LogError among them
        why = exc.message if isinstance(exc, LogError) else str(exc)
        return PrefixFold(False, f"the header cannot be turned back into a run: {why}")
    plog = playback.log
    last = log.events[-1].line if log.events else h.line
    try:
        result = playback.drive()
    except RecordingEnded as exc:  # the ring needs what the log does not hold yet: it goes on
        if plog.detached is not None and plog.detached.line != 0:  # (line 0: what it wrote past the end)
            return PrefixFold(False, f"the log does not follow the ring: {plog.detached.describe()}")
        left = plog.rec.peek()
        if left is not None:
            return PrefixFold(False, f"the log does not follow the ring: {exc.what} (the log has a "
                              f"{left.event} event at line {left.line})")
        return PrefixFold(True, f"the guards, fed the log to its last line ({last}), let the run go on: "
                          f"{exc.what}")
    ring = result.stop
    d = plog.detached
    if d is not None and (d.line == 0 or d.line > last):  # it stops just past the log: killed before its stop line
        return PrefixFold(True, f"the guards, fed the log to its last line ({last}), stop the run there with "
                          f"{ring.reason}: the process died before writing its stop (resume writes it)")
    where = f"line {d.line}" if d is not None else f"step {result.ledger.model_requests}"
    return PrefixFold(False, f"{where}: the ring, fed the log, stops with {ring.reason} ({ring.detail}), and the "
                      f"log goes on past it to line {last}")
