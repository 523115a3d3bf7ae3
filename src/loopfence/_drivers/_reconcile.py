"""Reconcile: does the log add up? Each invariant is checked from the events alone.

The ledger in the stop event must match what the log shows happened, every requested call must
have exactly one result, the stop must be the last line and its limit must really have been
reached, and no final answer may have been overwritten by a later budget stop.

The stop itself is not judged by rules written here: the log is folded through the ring with the
guards it runs (`_drivers/_refold.py`), which must stop where the log stops, for its reason.

An unfinished log (no stop line: the process died, or it is still running) is not a failed one. What
its lines can show is checked (every call before the last turn answered once, no orphan results,
every execution announced, steps in order, the guards letting the run go on to its last line, no
answer lost), the invariants that compare the stop line's ledger are listed as `unchecked`, and
`Reconciliation.finished` is False: `loopfence resume` continues the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._keywords import keywords_checked
from .._contract import check_reply
from .._gate import HOLDS_TEXT
from .._guards import NUDGED, Guard
from .._log import LogError
from .._log._reader import RunLogFile, read_log
from .._log._schema import (AnswerLine, CallLine, GateLine, LastAnswerLine, NudgeLine, ReplyLine, RequestLine,
                            ResultLine, StopLine)
from .._messages import Reply
from .._stops import StopReason, Verdict, left_by_client
from ._prefix import fold_prefix
from ._rebuild import recorded_limits, recorded_policy, registry_of
from ._refold import missing_guards, refold

__all__ = ["Check", "Reconciliation", "reconcile", "out_of_order", "INVARIANTS", "NEED_THE_STOP"]

INVARIANTS = {
    "lines_in_order": "each line's seq is its line number, and its time t never goes back",
    "one_result_per_call": "every requested tool call has exactly one result",
    "no_orphan_results": "every result answers a requested tool call",
    "intent_before_execution": "every executed result follows its logged intent, and every intent has one",
    "taint_recorded": "every result marked untrusted is followed by the gate's `tainted` event for it, and "
                      "every `tainted` event is for a result marked untrusted or one holding text from another",
    "steps_are_requests": "ledger model_requests = request events (steps 1..n in order)",
    "calls_requested": "ledger tool_calls = tool calls in the replies",
    "executions": "ledger tool_executions = executed results",
    "reuses": "ledger reused = reused results (and refused, rejected; nudges = nudge events, at most one, "
              "each for a repetition rule)",
    "tokens": "ledger token totals (and dollars, where the run was priced) = the sum of the replies' usage",
    "stop_is_last": "exactly one stop, and it is the last event",
    "stop_reason_known": "the stop reason is in the vocabulary and the verdict fits it",
    "limit_reached": "the guards the ring runs, fed the log, stop where the log stops, for its reason",
    "no_overwritten_answer": "no final answer existed before a later stop; a last answer is the reply to "
                             "the request its `last_answer` event asked, and only that",
}

# What an unfinished log cannot show: these compare the stop line (its ledger, reason and place).
NEED_THE_STOP = ("calls_requested", "executions", "reuses", "tokens", "stop_is_last", "stop_reason_known")


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant's result: `name` (a key of INVARIANTS), whether it holds, and what was compared."""

    name: str
    ok: bool
    detail: str

    @property
    def description(self) -> str:
        return INVARIANTS[self.name]


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Every invariant checked on one log. `ok`: the run finished and every invariant holds. For an
    unfinished log (`finished` False: no stop line) `checks` holds what its lines can show and
    `unchecked` the invariants that need the stop line; `holds` says whether what was checked holds.
    A log where a custom guard the check was not given refused a call or stopped the run
    (`custom_guards`), and the built-in guards alone do not fold to its stop, has `limit_reached` in
    `unchecked` rather than failed: it cannot be re-checked without that guard; `ok` is then False and
    `holds` says whether the rest holds."""

    path: str
    checks: tuple[Check, ...]
    finished: bool = True
    unchecked: tuple[str, ...] = ()
    lines: int = 0  # the log's complete lines (header included)
    torn_bytes: int = 0  # an incomplete last line set aside (an unfinished log only)
    custom_guards: tuple[str, ...] = ()  # custom guards the log shows and the check was not given

    def why_unchecked(self, name: str) -> str:
        """Why an invariant in `unchecked` was not checked, in words."""
        if name == "limit_reached" and self.custom_guards:
            return (f"custom guard {', '.join(self.custom_guards)}: the ring cannot run again without it "
                    "(reconcile(path, guards=[...]), or --guard MODULE:NAME)")
        return "needs the stop line, which the run has not written"

    @property
    def ok(self) -> bool:
        """The run finished and every invariant holds, all of them checked."""
        return self.finished and self.holds and not self.custom_guards

    @property
    def holds(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def check(self, name: str) -> Check:
        found = next((c for c in self.checks if c.name == name), None)
        if found is None:
            raise KeyError(f"{name!r} was not checked" + (f": {self.why_unchecked(name)}" if name in self.unchecked
                                                           else ""))
        return found


@dataclass(frozen=True, slots=True)
class _Turn:
    step: int
    reply: ReplyLine
    parsed: Reply | None


@keywords_checked
def reconcile(path: str | Path | RunLogFile, *, guards: list[Guard] | None = None) -> Reconciliation:
    """Check every invariant; LogError only when the file is not a readable run log. `guards`: fresh
    instances of the extra guards the run had (the header does not record them), as for replay."""
    log = path if isinstance(path, RunLogFile) else read_log(path, tolerant=True)
    stops = [e for e in log.events if isinstance(e, StopLine)]
    if log.torn_bytes and stops:  # only a run cut off before its stop may leave half a line
        read_log(log.path)  # raises, naming the line
    missing = tuple(missing_guards(log, guards, notes=False))  # a guard that refused or stopped, not given
    if not stops:
        return _unfinished(log, guards, missing)
    limit, folded = _limit(log, _stop_of(log, stops), guards)
    missing = () if limit.ok or not folded else missing  # a real pass; or a failure before any fold
    turns = [_turn(e) for e in log.events if isinstance(e, ReplyLine)]
    stop = _stop_of(log, stops)
    ledger: dict[str, Any] = stop.ledger if stop else {}
    results = [e for e in log.events if isinstance(e, ResultLine)]
    calls = [e for e in log.events if isinstance(e, CallLine)]
    checks = [
        _in_order(log),
        *_pairing(turns, results, unanswered=_unanswered(stop)),
        _intents(calls, results),
        _taint(log, results),
        _steps(log, ledger),
        _count("calls_requested", ledger, "tool_calls",
               sum(len(t.parsed.tool_calls) for t in turns if t.parsed), "tool calls in the replies"),
        _count("executions", ledger, "tool_executions",
               sum(r.decision == "executed" for r in results), "executed results"),
        _reuses(ledger, results, log),
        _tokens(ledger, turns, stop),
        _stop_last(log, stops),
        _stop_known(stop),
        *(() if missing else (limit,)),
        _overwritten(log, turns),
    ]
    return Reconciliation(log.path, tuple(checks), lines=len(log.events) + 1,
                          unchecked=("limit_reached",) if missing else (), custom_guards=missing)


def _unfinished(log: RunLogFile, guards: list[Guard] | None, missing: tuple[str, ...]) -> Reconciliation:
    """What the lines of a log with no stop can show; the calls of its last turn may still be open."""
    turns = [_turn(e) for e in log.events if isinstance(e, ReplyLine)]
    results = [e for e in log.events if isinstance(e, ResultLine)]
    calls = [e for e in log.events if isinstance(e, CallLine)]
    open_step = turns[-1].step if turns else None
    steps = [e.step for e in log.events if isinstance(e, RequestLine)]
    in_order = steps == list(range(1, len(steps) + 1))
    folded = fold_prefix(log, guards)
    missing = () if folded.ok else missing
    checks = (_in_order(log), *_pairing(turns, results, open_step), _intents(calls, results, open_step),
              _taint(log, results),
              Check("steps_are_requests", in_order, f"request events: {len(steps)}, steps in order" if in_order
                    else f"steps out of order: {steps}"),
              *(() if missing else (Check("limit_reached", folded.ok, folded.detail),)),
              _overwritten(log, turns, finished=False))
    return Reconciliation(log.path, checks, False, (*NEED_THE_STOP, *(("limit_reached",) if missing else ())),
                          len(log.events) + 1, log.torn_bytes, missing)


def _stop_of(log: RunLogFile, stops: list[StopLine]) -> StopLine | None:
    return log.stop or (stops[-1] if stops else None)


def _turn(e: ReplyLine) -> _Turn:
    try:
        parsed: Reply | None = e.reply()
    except LogError:
        parsed = None
    return _Turn(e.step, e, parsed)


def _unanswered(stop: StopLine | None) -> list[str]:
    """The calls a run's client never sent a result for (`left_by_client`): a finding, not a failure."""
    return [str(c) for c in stop.data["unanswered"]] if stop is not None and left_by_client(stop.reason, stop.data) \
        else []


def _pairing(turns: list[_Turn], results: list[ResultLine], open_step: int | None = None,
             unanswered: list[str] | None = None) -> list[Check]:
    """Key calls by (step, id, position): scripted models reuse ids across (and within) steps.
    `open_step`: an unfinished log's last turn, whose calls may not have their results yet;
    `unanswered`: the calls its client never answered (named in the detail)."""
    wanted: dict[tuple[int, str], list[int]] = {}
    unreadable = [t.reply.line for t in turns if t.parsed is None]
    for t in turns:
        for pos, c in enumerate(t.parsed.tool_calls if t.parsed else ()):
            wanted.setdefault((t.step, c.id), []).append(pos)
    answered: Counter[tuple[int, str, int]] = Counter()
    orphans: list[str] = []
    for r in results:
        open_positions = wanted.get((r.step, r.tool_call_id), [])
        if open_positions:
            answered[(r.step, r.tool_call_id, open_positions.pop(0))] += 1
        else:
            orphans.append(f"line {r.line} ({r.tool_call_id} at step {r.step})")
    missing = [f"{cid} (step {step}, position {p})" for (step, cid), ps in wanted.items() for p in ps
               if step != open_step]
    found = f"; no result recorded for {', '.join(unanswered)} (the client sent no further request)" \
        if unanswered else ""
    one = Check("one_result_per_call", not missing and not unreadable,
                f"all calls answered{found}" if not missing and not unreadable else
                "; ".join(([f"no result for {', '.join(missing)}"] if missing else [])
                          + ([f"unreadable replies at lines {unreadable}"] if unreadable else [])))
    return [one, Check("no_orphan_results", not orphans,
                       "every result has a request" if not orphans else
                       f"results without a requested call: {', '.join(orphans)}")]


def _intents(calls: list[CallLine], results: list[ResultLine], open_step: int | None = None) -> Check:
    """`open_step`: an unfinished log's last turn, where a call may have been running at the end."""
    intents: dict[tuple[int, str], list[int]] = {}  # the lines of each call's logged intents, in order
    for c in calls:
        if c.intent:
            intents.setdefault((c.step, c.tool_call_id), []).append(c.line)
    bad = []
    for r in results:
        if r.decision != "executed":
            continue
        lines = intents.get((r.step, r.tool_call_id), [])
        if lines and lines[0] < r.line:
            lines.pop(0)
        else:
            bad.append(f"executed without a logged intent before it: line {r.line} ({r.tool_call_id})")
    bad += [f"intent logged but no executed result: step {step} ({cid})"
            for (step, cid), lines in intents.items() if lines and step != open_step]
    return Check("intent_before_execution", not bad, "every execution was announced, and every "
                 "announced call has an executed result" if not bad else "; ".join(bad))


def out_of_order(log: RunLogFile) -> Iterator[str]:
    """Lines are written once, in order: a seq that is not the line's number, or a clock that goes
    back, is a line moved, dropped, added or edited by hand. Each such line, in file order."""
    last = 0.0
    for e in (log.header, *log.events):
        if e.seq != e.line - 1:
            yield f"line {e.line} has seq {e.seq}"
        if e.t < last:
            yield f"line {e.line}: t {e.t} is before the line above it ({last})"
        last = max(last, e.t)


def _in_order(log: RunLogFile) -> Check:
    bad = list(out_of_order(log))
    return Check("lines_in_order", not bad, "seq 0..n in order, t never goes back" if not bad else
                 "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))


def _taint(log: RunLogFile, results: list[ResultLine]) -> Check:
    """The gate's inputs as the log holds them agree: reconcile's fold takes the `tainted` events as
    given (the workspace they were judged in is gone), so a result and its taint must say the same."""
    tainted: dict[tuple[int, str | None], list[GateLine]] = {}
    for e in log.events:
        if isinstance(e, GateLine) and e.decision == "tainted":
            tainted.setdefault((e.step, e.tool_call_id), []).append(e)
    bad = [f"line {r.line}: {r.name} ({r.tool_call_id}) is marked untrusted but no tainted event follows it"
           for r in results if r.untrusted and not tainted.get((r.step, r.tool_call_id))]
    marked = {(r.step, r.tool_call_id) for r in results if r.untrusted}
    bad += [f"a tainted event for {key[1]} at step {key[0]}, whose result is not marked untrusted and holds "
            "no text from another source" for key, events in tainted.items() if key not in marked
            and not all(f"({HOLDS_TEXT}" in e.reason for e in events)]
    return Check("taint_recorded", not bad, "every untrusted result has its taint, and every taint its result"
                 if not bad else "; ".join(bad))


def _count(name: str, ledger: dict[str, Any], field: str, actual: int, what: str) -> Check:
    says = ledger.get(field)
    return Check(name, says == actual, f"{field}={says}, {what}: {actual}")


def _steps(log: RunLogFile, ledger: dict[str, Any]) -> Check:
    steps = [e.step for e in log.events if isinstance(e, RequestLine)]
    in_order = steps == list(range(1, len(steps) + 1))
    says = ledger.get("model_requests")
    ok = says == len(steps) and in_order
    detail = f"model_requests={says}, request events: {len(steps)}"
    return Check("steps_are_requests", ok, detail if in_order else f"{detail}; steps out of order: {steps}")


def _reuses(ledger: dict[str, Any], results: list[ResultLine], log: RunLogFile) -> Check:
    seen = Counter(r.decision for r in results)
    parts, ok = [], True
    for field, decision in (("reused", "reused"), ("refused", "refused"), ("rejected", "rejected")):
        says = ledger.get(field)
        ok = ok and says == seen[decision]
        parts.append(f"{field}={says}/{seen[decision]}")
    nudged = _nudges(log, ledger)
    detail = ", ".join(parts) + " (ledger/results)"
    return Check("reuses", ok and not nudged, detail + (f"; {nudged}" if nudged else ""))


def _tokens(ledger: dict[str, Any], turns: list[_Turn], stop: StopLine | None) -> Check:
    prompt = sum(t.reply.usage.prompt_tokens for t in turns)
    completion = sum(t.reply.usage.completion_tokens for t in turns)
    per_step = [[t.reply.usage.prompt_tokens, t.reply.usage.completion_tokens] for t in turns]
    ok = ledger.get("prompt_tokens") == prompt and ledger.get("completion_tokens") == completion and \
        (stop is None or stop.per_step == per_step)
    detail = f"prompt {ledger.get('prompt_tokens')}/{prompt}, completion " \
        f"{ledger.get('completion_tokens')}/{completion} (ledger/replies)" + \
        ("" if stop is None or stop.per_step == per_step else "; per_step differs")
    costs = [c for t in turns if (c := t.reply.usage.cost_usd) is not None]
    says = ledger.get("cost_usd")
    if costs or says is not None:
        spent: float | None = None
        for c in costs:  # added up as the ledger adds them
            spent = round((spent or 0.0) + c, 9)
        same = spent is None and says in (None, 0, 0.0) or \
            (isinstance(says, (int, float)) and spent is not None and abs(says - spent) < 1e-9)
        ok = ok and same
        detail += f", ${says}/${spent} (ledger/replies)"
    return Check("tokens", ok, detail)


def _nudges(log: RunLogFile, ledger: dict[str, Any]) -> str:
    """What is wrong with the nudges (Policy(nudge=True)): "" when nothing."""
    nudges = [e for e in log.events if isinstance(e, NudgeLine)]
    says = ledger.get("nudges", 0)  # absent: none (older logs, runs without one)
    bad = [f"a nudge at line {e.line} for {e.reason}" for e in nudges if e.reason not in NUDGED]
    if len(nudges) > 1:
        bad.append(f"{len(nudges)} nudges (lines {[e.line for e in nudges]}): a run gives one")
    if says != len(nudges):
        bad.append(f"ledger nudges={says}, nudge events: {len(nudges)}")
    return "; ".join(bad)


def _stop_last(log: RunLogFile, stops: list[StopLine]) -> Check:
    if not stops:
        return Check("stop_is_last", False, "no stop event: the run did not finish (resume it)")
    if len(stops) > 1:
        return Check("stop_is_last", False, f"{len(stops)} stop events (lines {[s.line for s in stops]})")
    if log.stop is None:
        after = log.events[-1]
        return Check("stop_is_last", False, f"the stop at line {stops[0].line} is followed by events "
                     f"(last: {after.event} at line {after.line})")
    return Check("stop_is_last", True, f"line {stops[0].line}")


def _stop_known(stop: StopLine | None) -> Check:
    if stop is None:
        return Check("stop_reason_known", False, "no stop")
    if stop.reason not in set(StopReason):
        return Check("stop_reason_known", False, f"{stop.reason!r} is not a stop reason")
    want = Verdict.SHIP if stop.reason == StopReason.FINAL_ANSWER else Verdict.KILL
    if stop.verdict != want:
        return Check("stop_reason_known", False, f"{stop.reason} with verdict {stop.verdict}, expected {want}")
    return Check("stop_reason_known", True, f"{stop.reason} ({stop.verdict})")


def _limit(log: RunLogFile, stop: StopLine | None, guards: list[Guard] | None) -> tuple[Check, bool]:
    """The stop re-checked by the guards themselves: the log folded through the ring (_drivers/_refold);
    and whether the fold ran (False: the stop or the header failed before it)."""
    if stop is None or stop.reason not in set(StopReason):
        return Check("limit_reached", False, "no valid stop to check"), False
    try:
        recorded_limits(log.header.limits)
    except (TypeError, ValueError) as exc:
        return Check("limit_reached", False, f"header limits unreadable: {exc}"), False
    try:
        recorded_policy(log.header.policy)
    except (TypeError, ValueError) as exc:
        return Check("limit_reached", False, f"header policy unreadable: {exc}"), False
    try:
        verdict = refold(log, guards)
    except (TypeError, ValueError) as exc:  # LogError among them: the header is not a run to fold
        why = exc.message if isinstance(exc, LogError) else str(exc)
        return Check("limit_reached", False, f"the header cannot be turned back into a run: {why}"), False
    return Check("limit_reached", verdict.ok, verdict.detail), True


def _overwritten(log: RunLogFile, turns: list[_Turn], finished: bool = True) -> Check:
    max_tokens = log.header.params.get("max_tokens")
    registry = registry_of(log.header)
    events = list(log.events)
    asked = {e.step for e in events if isinstance(e, LastAnswerLine) and e.decision == "asked"}
    stop = log.stop
    said = stop.last_answer if stop is not None else None
    given = None  # the last answer's reply text, when it gave one
    for t in turns:
        r = t.parsed
        if r is None or r.tool_calls or not (r.content or "").strip():
            continue
        if check_reply(r, registry, max_tokens).incomplete:
            continue
        i = events.index(t.reply)
        nxt = next((e for e in events[i + 1:] if e.event != "resume"), None)  # a crash may sit between
        if t.step in asked:  # the reply to the last answer's request: it goes to the stop's last_answer
            given = r.content
            if not isinstance(nxt, StopLine) or said != r.content or nxt.final_answer is not None:
                return Check("no_overwritten_answer", False, f"the last answer at line {t.reply.line} (step "
                             f"{t.step}) is not the stop's last_answer")
            continue
        if isinstance(nxt, AnswerLine):  # judged by the answer contract: rejected, it is not a final answer
            if nxt.decision == "rejected":
                continue
            nxt = next((e for e in events[events.index(nxt) + 1:] if e.event != "resume"), None)
        if nxt is None and not finished:  # the log ends with the answer: killed before its stop line
            continue
        if not isinstance(nxt, StopLine):
            what = f"{nxt.event} at line {nxt.line}" if nxt else "nothing (no stop)"
            return Check("no_overwritten_answer", False, f"a final answer at line {t.reply.line} (step "
                         f"{t.step}) is followed by {what}")
        if nxt.reason != StopReason.FINAL_ANSWER or nxt.final_answer != r.content:
            return Check("no_overwritten_answer", False, f"a final answer at line {t.reply.line} ended in "
                         f"stop {nxt.reason} without that answer")
    if said is not None and given is None:
        return Check("no_overwritten_answer", False, "the stop has a last_answer that no last-answer request's "
                     "reply gave")
    return Check("no_overwritten_answer", True, "no answer was lost")
