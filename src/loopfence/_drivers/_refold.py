"""Was the stop earned? The log folded through the ring, and the guards the ring runs asked again.

There is no second copy of the stop rules. The log's recorded replies, results and approvals are fed
to the ring again (`Playback`: no model is asked and no tool runs), so the run state is rebuilt by
the code the live run updates it with, and the guards (`default_guards` over the header's limits and
policy, with the recorded gate) are asked at every point the ring asks them: before each request,
on each reply, before and after each call, after each turn. What the ring decides is compared with
what the log says (`decisions`: a request sent, each call executed, reused, refused or rejected, the
gate's answers, the stop's reason). Where they part is the answer:

- the same stop, decided by the ring: earned, when the data the log's stop names (limit, value,
  key, ...) is the guard's (a log written before a field existed lacks it: what the log names is
  compared);
- the log's stop raised by the recording itself (the recorded model call or tool ended the run):
  earned only for a reason the ring takes from outside (`FROM_OUTSIDE`: what an endpoint, a cut
  stream, Ctrl-C or a bug ends a run with). A guard's reason there means no guard stopped;
- the ring goes on where the log stops: earned only for `ANYTIME` (a cancel or a bug can end a
  run between any two events); otherwise no guard stops there;
- the ring stops where the log goes on: a guard would have stopped the run earlier;
- the ring and the log part over the last answer (Policy.last_answer: asked, skipped or failed where
  the log says otherwise), after agreeing on the stop;
- anything else: the log does not follow the ring (e.g. a call the ring would have run, not reused).

The wall clock is the one input the log holds only as numbers. Playback sets the clock to each
recorded event's `t` (and to the stop line's `t` where the run stopped with nothing left to do),
so WallClock, and the ring's own deadline on a model request, see the time the recorded run saw.
Two consequences, and the only special cases here: a `max_wall_seconds` stop's `value` (the clock
at the guard's check) is not compared, the log holding only the stop line's `t`, a moment later;
and a model adapter that gave up early because the retry it would wait for passes the deadline
(its stop's data `retry_in_s`) earned it when the stop's `t` plus that wait reaches the limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._guards import Guard
from .._json import dumps
from .._limits import Limits
from .._log._large import short_key
from .._log._reader import RunLogFile
from .._log._schema import GuardLine, ResultLine, StopLine
from .._stops import Stop, StopReason, left_by_client
from ._playback import Divergence, Playback, PlaybackLog, RecordingEnded, decisions
from ._rebuild import gated_names, limits_of, registry_of

__all__ = ["Refold", "refold", "custom_guards", "missing_guards", "FROM_OUTSIDE", "ANYTIME"]

# What an operation the ring awaits (a model request, a tool, the user's Ctrl-C) may end a run with:
# the ring takes these from the log where the recorded model call or tool ended the run. A fenced
# framework's own limit is one (playback's RecordedEnd ends the ring where the log does).
FROM_OUTSIDE: frozenset[StopReason] = frozenset({
    StopReason.ENDPOINT_ERROR, StopReason.INCOMPLETE_STREAM, StopReason.CONTEXT_OVERFLOW,
    StopReason.INVALID_JSON, StopReason.UNKNOWN_TOOL, StopReason.SCHEMA_MISMATCH,
    StopReason.CANCELLED, StopReason.FRAMEWORK_LIMIT, StopReason.INTERNAL_ERROR})
# What may end a run between any two events, where the ring itself would go on (a task cancelled
# while the model counts a prompt or a guard awaits an approval, a bug in a guard).
ANYTIME: frozenset[StopReason] = frozenset({StopReason.CANCELLED, StopReason.INTERNAL_ERROR})


@dataclass(frozen=True, slots=True)
class Refold:
    """The fold's verdict on the log's stop."""

    ok: bool
    detail: str
    stop: Stop | None = None  # where the ring stopped (None: it needed more than the log holds)
    decided: bool = False  # the ring decided `stop` itself (False: taken from the recording)


def custom_guards(log: RunLogFile, *, notes: bool = True) -> dict[str, int]:
    """The custom guards the log shows at work, each with the first line naming it: their notes
    (`guard` events; not with `notes=False`: a note decides nothing), their refusals (a result's error
    `guard:NAME`) and their stop. Only custom guards write these; one that never noted, refused or
    stopped left no trace (and changed nothing)."""
    seen: dict[str, int] = {}
    for e in log.events:
        if isinstance(e, GuardLine) and notes:
            seen.setdefault(e.guard, e.line)
        elif isinstance(e, ResultLine) and (e.error or "").startswith("guard:"):
            seen.setdefault((e.error or "")[len("guard:"):], e.line)
        elif isinstance(e, StopLine) and e.reason == StopReason.GUARD and isinstance(e.data.get("guard"), str):
            seen.setdefault(e.data["guard"], e.line)
    return seen


def missing_guards(log: RunLogFile, guards: list[Guard] | None, *, notes: bool = True) -> dict[str, int]:
    """The custom guards the log shows (`custom_guards`) that `guards` does not hold: without them the
    ring cannot be run again as the run ran (`notes=False`: only those that refused a call or stopped
    the run, the decisions a fold without them cannot make)."""
    given = {g.guard_name for g in guards or ()}
    return {name: line for name, line in custom_guards(log, notes=notes).items() if name not in given}


def refold(log: RunLogFile, guards: list[Guard] | None = None) -> Refold:
    """Fold a finished log through the ring with the guards it runs (plus `guards`, fresh ones, for
    a run that had extra guards). LogError when the header cannot be turned back into a run."""
    return _refold(log, guards)


def _refold(log: RunLogFile, guards: list[Guard] | None) -> Refold:
    stop = log.stop
    if stop is None:
        return Refold(False, "the log does not end with its stop: there is no stop to fold to")
    h = log.header
    playback = Playback.of(log, registry_of(h, (), gated_names(log.events)), limits_of(h, log.path),
                           guards=guards, what_if=True, compare=decisions, logged_taint=True)
    plog, limits = playback.log, playback.state.limits
    try:
        result = playback.drive()
    except RecordingEnded as exc:  # the ring needs a reply or a result the log does not hold there
        if plog.detached is not None:
            return _parted(plog, stop, plog.detached, None, limits)
        return _ended(stop, plog, limits, exc)
    ring = result.stop
    if plog.echoed is not None:  # (what the ring wrote after it, for the call it had in flight, differs)
        return _taken(stop, ring, limits)
    if plog.detached is not None:
        return _parted(plog, stop, plog.detached, ring, limits)
    differs = _differs(stop, ring)
    if differs:
        return Refold(False, f"the ring, fed the log, stops here too, with {ring.reason}, but the log's "
                      f"stop names {differs}: {ring.detail}", ring, True)
    ledger = result.ledger
    return Refold(True, f"{_n(ledger.model_requests, 'request')}, {_n(ledger.tool_executions, 'execution')}, "
                  f"{_limit_text(ring)}: the ring, fed the log, stops here too ({ring.detail})", ring, True)


def _parted(plog: PlaybackLog, stop: StopLine, d: Divergence, ring: Stop | None, limits: Limits) -> Refold:
    """The ring wrote something else than the log at line `d.line` (then stopped with `ring`, or
    needed more than the log holds: None)."""
    got = d.got or {}
    stopping = got.get("event") == "stop" or (got.get("event") == "call" and got.get("reason") == "not_executed")
    how = f"with {ring.reason} ({ring.detail})" if ring is not None else ""
    if _in_last_answer(plog, d):  # the stop agreed; what came after it (Policy.last_answer) did not
        return Refold(False, f"line {d.line or stop.line}: the last answer does not follow the ring (the log: "
                      f"{_show(d.expected)}; the ring: {_show(got)})", ring, ring is not None)
    if _at_stop(plog, d.line):
        if stopping and ring is not None:
            return Refold(False, f"line {stop.line}: the log stops {stop.reason}, the ring, fed the log, "
                          f"stops there {how}{_named(stop, limits)}", ring, True)
        return _goes_on(stop, limits, f"the ring would write a {got.get('event')} event ({_show(got)})")
    if stopping:
        return Refold(False, f"line {d.line}: the ring, fed the log, stops here {how}, and the log goes on "
                      f"to stop {stop.reason} at line {stop.line}", ring, ring is not None)
    return Refold(False, f"line {d.line}: the log does not follow the ring: {d.what} (the log: "
                  f"{_show(d.expected)}; the ring: {_show(got)})", ring, ring is not None)


def _ended(stop: StopLine, plog: PlaybackLog, limits: Limits, exc: RecordingEnded) -> Refold:
    """The ring, still following the log, needed a reply or a result the log does not hold there."""
    nxt = plog.rec.peek()
    if _at_stop(plog, nxt.line if nxt is not None else 0):
        return _goes_on(stop, limits, exc.what)
    where = f" (the log has a {nxt.event} event at line {nxt.line})" if nxt is not None else ""
    return Refold(False, f"the log does not follow the ring: {exc.what}{where}")


def _goes_on(stop: StopLine, limits: Limits, what: str) -> Refold:
    """The log stops where the ring, fed the log, goes on."""
    if stop.reason in ANYTIME:
        return Refold(True, f"line {stop.line}: {stop.reason}, which ends a run from outside the ring at "
                      "any point; the guards agree with the log up to there")
    return Refold(False, f"line {stop.line}: the log stops {stop.reason}, but no guard stops there: "
                  f"{what}{_named(stop, limits)}")


def _taken(stop: StopLine, ring: Stop, limits: Limits) -> Refold:
    """The recorded model call or tool ended the run (playback raised the log's own stop)."""
    if stop.reason == StopReason.FRAMEWORK_LIMIT:
        return Refold(True, f"line {stop.line}: the framework's own limit ended the run ({stop.detail}), "
                      "outside the ring; the guards agree with the log up to there", ring, False)
    if left_by_client(stop.reason, stop.data):
        return Refold(True, f"line {stop.line}: the client ended the run with calls open ({stop.detail}), outside "
                      "the ring; the guards agree with the log up to there", ring, False)
    if stop.reason in FROM_OUTSIDE or _late(stop, limits):
        return Refold(True, f"line {stop.line}: the recorded model call or tool ended the run with "
                      f"{stop.reason}, which comes from outside the ring; the guards agree with the log "
                      "up to there", ring, False)
    return Refold(False, f"line {stop.line}: the log stops {stop.reason} where the ring, fed the log, goes "
                  f"on to the model or a tool; no guard stops there (only the model call or tool itself "
                  f"could end the run there, and {stop.reason} is not what they end it with)"
                  f"{_named(stop, limits)}", ring, False)


def _late(stop: StopLine, limits: Limits) -> bool:
    """A model adapter ended the run on the clock because its next retry would pass the deadline."""
    wait, limit = stop.data.get("retry_in_s"), limits.max_wall_seconds
    return stop.reason == StopReason.MAX_WALL_SECONDS and isinstance(wait, (int, float)) and \
        not isinstance(wait, bool) and limit is not None and stop.t + wait >= limit


def _differs(stop: StopLine, ring: Stop) -> str:
    """The data fields the log's stop names with another value than the guard's stop."""
    mine: dict[str, Any] = json.loads(dumps(ring.data))
    clock = stop.reason == StopReason.MAX_WALL_SECONDS
    said = {**stop.data, **({"key": short_key(stop.data["key"])} if isinstance(stop.data.get("key"), str) else {})}
    bad = [f"{k}={v!r} (the guard: {mine.get(k)!r})" for k, v in said.items()
           if not (clock and k == "value") and (k not in mine or mine[k] != v)]
    return ", ".join(bad)


def _in_last_answer(plog: PlaybackLog, d: Divergence) -> bool:
    """Did the ring and the log part over the last answer (a `last_answer` event on either side)?"""
    return "last_answer" in ((d.got or {}).get("event"), (d.expected or {}).get("event"))


def _at_stop(plog: PlaybackLog, line: int) -> bool:
    """Is `line` (0: past the end) the log's stop, or the bookkeeping the stop wrote just before it
    (results for the calls it left unrun)?"""
    rec = plog.rec
    return line == 0 or line >= rec.events[rec.settled + 1].line


def _named(stop: StopLine, limits: Limits) -> str:
    """When the stop names a limit other than the header's (a budget's reason is the limit's name)."""
    said = stop.data.get("limit")
    if said is None or str(stop.reason) not in Limits.names():
        return ""
    configured = getattr(limits, str(stop.reason))
    return "" if said == configured else f"; the stop names limit {said}, the header {configured}"


def _limit_text(stop: Stop) -> str:
    limit = stop.data.get("limit")
    return f"{stop.reason}={limit}" if limit is not None else str(stop.reason)


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"


def _show(x: dict[str, Any] | None, limit: int = 300) -> str:
    if x is None:
        return "(nothing)"
    text = dumps(x, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "…"
