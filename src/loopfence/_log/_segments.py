"""A log in segments: a run `loopfence resume` continued past an `endpoint_error` or `cancelled` stop.

Such a log holds the first segment's stop, then a `resume` event whose `reopened.line` names that
stop, then the run going on to its own stop. Read back, the reopened stop and its bookkeeping (the
calls it left unrun, an `outcome_unknown` result for a tool it interrupted) are set aside
(`RunLogFile.reopened`): the run is the segments joined, with one stop, the last line. A resume
event's `overrides` (limits, model) apply to the header from there on, so replay, reconcile and the
next resume read the run as it went on.

`bookkeeping_start` also serves playback (`_drivers/_playback`): where a stop's own lines begin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._stops import StopReason
from ._errors import LogError
from ._schema import CallLine, HeaderLine, LogEvent, ResultLine, ResumeLine, StopLine

__all__ = ["REOPENABLE", "bookkeeping_start", "last_answer_index", "joined"]

REOPENABLE = (StopReason.ENDPOINT_ERROR, StopReason.CANCELLED)  # stops `resume` may continue past


def last_answer_index(events: Sequence[LogEvent]) -> int | None:
    """Index of the first `last_answer` event: everything from there to the stop is the last answer's."""
    return next((i for i, e in enumerate(events) if e.event == "last_answer"), None)


def bookkeeping_start(events: Sequence[LogEvent]) -> int:
    """Index of the first event that belongs to the closing stop (the stop itself when nothing else
    does); len(events) when the events do not end with a stop. The calls a stop left unrun get a
    refused `not_executed` call and result just before it, a tool it interrupted an `outcome_unknown`
    result, and a last answer (Policy(last_answer=True)) runs from its first `last_answer` event."""
    if not events or not isinstance(events[-1], StopLine):
        return len(events)
    at = last_answer_index(events)
    i = len(events) - 2 if at is None else at - 1
    while i >= 0 and _stop_owned(events[i]):
        i -= 1
    return i + 1


def _stop_owned(e: LogEvent) -> bool:
    if isinstance(e, CallLine):
        return e.decision == "refused" and e.reason == "not_executed"
    if isinstance(e, ResultLine):
        return e.decision == "refused" and e.error == "not_executed" or e.error == "outcome_unknown"
    return False


def joined(path: str, header: HeaderLine, events: Sequence[LogEvent]
           ) -> tuple[HeaderLine, list[LogEvent], list[LogEvent]]:
    """(the header as the run went on, the events of the joined segments, the events set aside)."""
    kept: list[LogEvent] = []
    aside: list[LogEvent] = []
    for e in events:
        if isinstance(e, ResumeLine):
            if e.reopened is not None:
                aside.extend(_reopen(path, e, e.reopened, kept))
            if e.overrides is not None:
                header = _overridden(path, e, header, e.overrides)
        kept.append(e)
    return header, kept, aside


def _reopen(path: str, e: LogEvent, reopened: Any, kept: list[LogEvent]) -> list[LogEvent]:
    line = reopened.get("line")
    stop = kept[-1] if kept else None
    if not isinstance(stop, StopLine) or stop.line != line:
        raise LogError(path, e.line, f"resume event: reopened.line {line!r} is not the stop just before it")
    if stop.reason not in REOPENABLE:
        raise LogError(path, e.line, f"resume event: the stop at line {stop.line} is {stop.reason}; only "
                       f"{', '.join(map(str, REOPENABLE))} stops are continued")
    start = bookkeeping_start(kept)
    aside = kept[start:]
    del kept[start:]
    return aside


def _overridden(path: str, e: LogEvent, header: HeaderLine, overrides: dict[str, Any]) -> HeaderLine:
    limits, model = overrides.get("limits"), overrides.get("model")
    if limits is not None and not isinstance(limits, dict) or model is not None and not isinstance(model, dict):
        raise LogError(path, e.line, "resume event: overrides.limits and overrides.model must be objects")
    new_limits = {**header.limits, **(limits or {})}
    new_model = dict(model) if model is not None else header.model
    record = {**header.record, "limits": new_limits, "model": new_model}
    changed = header.model_copy(update={"limits": new_limits, "model": new_model})
    return changed.stamped(header.seq, header.t, record, header.line, path)
