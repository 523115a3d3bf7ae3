"""Playback: the ring runs again, fed by a recorded log instead of a model and tools.

Three parts stand in for the ring's collaborators and share one cursor over the recording:

- `PlaybackLog` (a RunLog): each event the ring writes is compared with the next recorded one and
  consumed. A mismatch is a `Divergence`. When the recording runs out, replay reports that the run
  went past it; resume switches to the real log file (appending) and the run goes live.
- `PlaybackModel`: returns the recorded reply (or re-raises the recorded model stop); live after
  the switch.
- `PlaybackExecutor`: returns the recorded result; a side-effecting call whose intent was the last
  recorded event gets an `outcome_unknown` result instead of running again; live after the switch.

The clock follows the log: while playing, `state.t0` is set so that `elapsed()` is the recorded `t`
of the last consumed event, so wall-clock checks see the time the recorded run saw.

What is compared is the log's choice: `comparable` (replay, resume: every field but the timing) or
`decisions` (reconcile: what the ring decided, not what it computed; see `_drivers/_refold.py`).
`Playback` wires the parts (state from the header, recorded gate, the guards) for replay and
reconcile's fold.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .._aio import in_thread, prefers_async
from .._answer import AnswerContract, Judged, as_json
from .._contract import CheckedCall
from .._gate import Taint, UntrustedGate, taint_why
from .._guards import Guard, Guards, default_guards
from .._json import canonical_json, dumps
from .._limits import Limits
from .._log import LogError
from .._log._large import KEYED, compared, short_key
from .._log._reader import RunLogFile
from .._log._schema import (AnswerLine, CallLine, GateLine, HeaderLine, LastAnswerLine, LogEvent, ReplyLine,
                            RequestLine, ResultLine, StopLine)
from .._log._segments import bookkeeping_start, last_answer_index
from .._log._writer import Abandoned, E, RunLog, written
from .._loop import drive, new_state
from .._setup import model_cap
from .._messages import Reply, Request
from .._prices import PriceBook, PriceError
from .._state import RunState
from .._stops import RunResult, Stop, StopError, StopReason, left_by_client
from ..models._base import Model
from ..tools._executor import Executor, ToolResult
from ..tools._registry import Registry, Tool, ToolKind
from ._rebuild import RecordedFn, compaction_of, gate_of, messages_of, policy_of

__all__ = ["Divergence", "PlaybackSignal", "Diverged", "RecordingEnded", "Recording", "PlaybackLog",
           "PlaybackModel", "PlaybackExecutor", "PlaybackApproval", "RecordedAnswer", "Playback", "RecordedEnd", "comparable",
           "decisions", "outcome_unknown", "priced"]

_VOLATILE = ("seq", "t", "duration_s")
_MARKERS = ("resume", "retry")  # recorded, never written again by a playback
SHOW_CHARS = 2_000  # of each event a divergence shows


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first place where the ring, run again, did not write what the log recorded."""

    step: int
    line: int  # line of the recorded event that was expected (0: past the end)
    what: str
    expected: dict[str, Any] | None
    got: dict[str, Any] | None

    def describe(self, limit: int = SHOW_CHARS) -> str:
        """The mismatch, each event clipped to `limit` characters (a result can be megabytes)."""
        def show(x: dict[str, Any] | None) -> str:
            if x is None:
                return "(nothing)"
            text = dumps(x, sort_keys=True)
            return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit:,} more characters]"

        return (f"step {self.step}: {self.what}\n  expected (line {self.line}): {show(self.expected)}\n"
                f"  got: {show(self.got)}")


class PlaybackSignal(Abandoned):
    """Ends a playback from inside the ring (BaseException: the ring must not turn it into a stop)."""


class Diverged(PlaybackSignal):
    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.describe())
        self.divergence = divergence


class RecordingEnded(PlaybackSignal):
    """The ring needs something the recording does not have (replay only)."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(f"step {step}: {what}")
        self.step = step
        self.what = what


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """An event as replay compares it: JSON-normalized, without timing fields."""
    out: dict[str, Any] = json.loads(dumps(record))
    for k in _VOLATILE:
        out.pop(k, None)
    if isinstance(out.get("key"), str):  # logs written before keys normalized numbers: `30.0` is `30`
        out["key"] = _canonical_key(out["key"])
    if out.get("event") in KEYED:  # a large value is stored once (_log/_large.py): older logs, whole
        compared(out)
    if out.get("event") == "gate" and out.get("decision") == "tainted":
        # how the live tools knew (a file's provenance in the workspace, the --trust hint) is prose
        # replay's recorded tools cannot rebuild: what was tainted, by which call, is compared
        out.pop("reason", None)
    if out.get("event") == "last_answer" and out.get("reason") == StopReason.MAX_WALL_SECONDS:
        out.pop("detail", None)  # the clock's reading, as in the stop
    # the prompt's tokens a budget judged, unsent: replay's input (the detail and value name it), and
    # older logs do not record it
    if out.get("event") == "last_answer":
        out.pop("prompt_estimate", None)
    if out.get("event") == "stop" and isinstance(out.get("data"), dict) and isinstance(out["data"].get("key"), str):
        key = out["data"]["key"]  # a repeated_call stop written before it named a large key by its digest
        if key != short_key(key):
            out["data"]["key"] = short_key(key)
            out["detail"] = str(out.get("detail", "")).replace(key, short_key(key))
    if out.get("event") == "stop":
        if isinstance(out.get("ledger"), dict):
            out["ledger"].pop("elapsed_s", None)
        if isinstance(out.get("data"), dict):
            out["data"].pop("prompt_estimate", None)
        if out.get("reason") == StopReason.MAX_WALL_SECONDS:  # the clock's reading is not replayable
            out.pop("detail", None)
            if isinstance(out.get("data"), dict):
                out["data"].pop("value", None)
    return out


# Per event kind, the fields that say what the ring decided (reconcile's fold compares only these).
_DECIDED: dict[str, tuple[str, ...]] = {
    "request": ("step",), "reply": ("step",),
    "call": ("step", "tool_call_id", "name", "decision", "reason"),
    "result": ("step", "tool_call_id", "name", "decision"),
    "gate": ("step", "name", "decision"),
    "nudge": ("step", "reason", "tool_call_id", "delivered"),
    "last_answer": ("step", "decision", "reason"),
    "answer": ("step", "decision"),
    "stop": ("reason",),
}


def decisions(record: dict[str, Any]) -> dict[str, Any] | None:
    """An event as reconcile's fold compares it: what the ring decided (a request was sent, a call
    was executed, reused, refused or rejected, the gate's answer, the stop's reason), not what it
    computed from the recording (fingerprints, usage, contents, the ledger: reconcile's other
    invariants check those). None, not compared on either side: an execution's logged intent
    (intent_before_execution checks that each execution has one) and the gate's `tainted` (an
    input to the fold, which cannot see the workspace the live tools sniffed content in), and a
    guard's `note` (it decides nothing; a custom guard reconcile is not given cannot write it)."""
    kind = record.get("event")
    if (kind == "call" and record.get("intent")) or (kind == "gate" and record.get("decision") == "tainted") \
            or kind == "guard":
        return None
    picked = {k: record.get(k) for k in _DECIDED.get(str(kind), ())}
    out: dict[str, Any] = json.loads(dumps({"event": kind, **picked}))
    return out


def _canonical_key(key: str) -> str:
    name, sep, args = key.partition(":")
    try:
        return f"{name}{sep}{canonical_json(json.loads(args))}" if sep else key
    except ValueError:
        return key


def outcome_unknown(t: Tool, call: CallLine) -> ToolResult:
    body = {"ok": False, "error": "outcome_unknown", "tool": t.name, "tool_call_id": call.tool_call_id,
            "message": (f"the run was interrupted while {t.name} was running: its intent was logged but "
                        "not its outcome. It may or may not have taken effect, and it was NOT run again. "
                        "Check its effects before calling it again.")}
    return ToolResult(json.dumps(body, ensure_ascii=False), False, "executed", 0.0, "outcome_unknown",
                      None, t.untrusted)


class Recording:
    """A cursor over the recorded events (after the header)."""

    def __init__(self, events: tuple[LogEvent, ...], start_t: float = 0.0) -> None:
        self.events = events
        self.pos = 0
        self.last_t = start_t
        self.last: LogEvent | None = None
        self.stop = events[-1] if events and isinstance(events[-1], StopLine) else None
        self.last_answer_at = last_answer_index(events)
        self.settled = _settled_index(events)

    def peek(self) -> LogEvent | None:
        return self.events[self.pos] if self.pos < len(self.events) else None

    def take(self) -> LogEvent:
        e = self.events[self.pos]
        self.pos += 1
        self.last_t = e.t
        if e.event not in _MARKERS:  # a resume marker or a retry is not where the run was
            self.last = e
        return e

    def wall_stop_t(self) -> float | None:
        """When the recorded run stopped on the clock: the time its last check saw."""
        stop = self.stop
        if stop is not None and stop.reason == StopReason.MAX_WALL_SECONDS and self.pos == self.settled + 1:
            at = self.last_answer_at  # a last answer was weighed right after the stop: its clock
            return stop.t if at is None else self.events[at].t
        return None

    @property
    def exhausted(self) -> bool:
        return self.pos >= len(self.events)

    def stop_ahead(self) -> StopLine | None:
        """The recorded stop, if only the stop's bookkeeping (not-run calls) lies before it."""
        if self.stop is not None and self.pos > self.settled:
            return self.stop
        return None


def _settled_index(events: tuple[LogEvent, ...]) -> int:
    """Index of the last event before the stop that is not the stop's bookkeeping (_log/_segments);
    len(events) when the events do not end with a stop."""
    start = bookkeeping_start(events)
    return start - 1 if start < len(events) else start


class PlaybackLog(RunLog):
    """Compares what the ring writes with the recording; switches to `go_live` when it runs out."""

    def __init__(self, recording: Recording, state: RunState, *, what_if: bool = False,
                 go_live: Callable[[PlaybackLog], RunLog] | None = None,
                 compare: Callable[[dict[str, Any]], dict[str, Any] | None] = comparable) -> None:
        self.live: RunLog | None = None
        super().__init__(None)
        self.rec = recording
        self.state = state
        self.what_if = what_if
        self.go_live = go_live
        self.compare = compare  # an event as compared; None: not compared (on either side)
        self.detached: Divergence | None = None  # what-if: where the run left the recording
        self.unknown_intent: CallLine | None = None  # resume: intent logged, outcome not
        self.echoed: StopLine | None = None  # the recorded stop a stand-in raised (the ring did not decide it)
        # recorded events the ring is given rather than asked to write again: taken as soon as they
        # come up when this answers True for them (reconcile's fold: the gate's taint)
        self.inputs: Callable[[LogEvent], bool] | None = None
        self.on_taint: Callable[[dict[str, Any]], None] | None = None  # a matched `tainted` event, as recorded
        self._set_clock(recording.last_t)
        self._advance()

    @property
    def path(self) -> str | None:  # type: ignore[override]
        return self.live.path if self.live is not None else None

    @path.setter
    def path(self, value: str | None) -> None:
        pass  # RunLog.__init__ sets it; playback has no file of its own

    def step(self) -> int:
        return self.state.ledger.model_requests

    def write(self, ev: E) -> E:
        """The event compared with the next recorded one; matched, the recorded event (its line, its record)."""
        if self.live is not None:
            return self.live.write(ev)
        if self.detached is not None:
            return super().write(ev)
        record = {"event": ev.event, **written(ev)}
        got = self.compare(record)
        expected, want = self._next_compared()  # the recording's uncompared events are passed
        if got is None:  # not compared (and its counterpart in the recording, if any, was passed)
            self.events.append(record)
            self._advance()
            return ev
        if got != want:
            step = getattr(ev, "step", None)
            d = Divergence(step if isinstance(step, int) else self.step(), expected.line if expected else 0,
                           _what(ev.event, expected), want, got)
            if not self.what_if:
                raise Diverged(d)
            self.detached = d
            return super().write(ev)
        e = self.rec.take()
        if self.on_taint is not None and isinstance(e, GateLine) and e.decision == "tainted":
            self.on_taint(e.record)
        self.events.append(e.record)
        self._set_clock(e.t)
        self._advance()
        return e  # type: ignore[return-value]  (matched: the same kind of event)

    def _next_compared(self) -> tuple[LogEvent | None, dict[str, Any] | None]:
        """The next recorded event that is compared, and how; the ones before it are passed."""
        while (e := self.rec.peek()) is not None:
            given = self.inputs is not None and self.inputs(e)
            want = None if given else self.compare(e.record)
            if want is not None:
                return e, want
            self.rec.take()
            self._set_clock(e.t)
        return None, None

    def recorded_stop(self, stop: StopLine) -> StopError:
        """The recorded stop, raised by a stand-in (the recorded model call or tool ended the run)."""
        self.echoed = stop
        return StopError(StopReason(stop.reason), stop.detail, **stop.data)

    def _advance(self) -> None:
        """Past resume markers and retries (the recorded replies are not retried); the clock to a recorded wall-clock stop; live when the log ends."""
        while (e := self.rec.peek()) is not None and (
                e.event in _MARKERS or (self.inputs is not None and self.inputs(e))):
            self.rec.take()
            self._set_clock(e.t)
        if (wall := self.rec.wall_stop_t()) is not None:
            self._set_clock(wall)
        nxt = self.rec.peek()
        if isinstance(nxt, LastAnswerLine) and nxt.reason == StopReason.MAX_WALL_SECONDS:
            self._set_clock(nxt.t)  # the last answer was skipped (or cut off) on the clock: the time it saw
        if self.rec.exhausted:
            self._switch()

    def _set_clock(self, t: float) -> None:
        self.state.t0 = time.monotonic() - t

    def _switch(self) -> None:
        if self.go_live is None:
            return
        last = self.rec.last
        if isinstance(last, CallLine) and last.intent:
            self.unknown_intent = last
        self._set_clock(self.rec.last_t)
        self.live = self.go_live(self)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()


def _whole(value: Any) -> int | None:
    """A recorded token figure: a positive int, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _what(event: str, expected: LogEvent | None) -> str:
    if expected is None:
        return f"the run wrote a {event} event after the end of the recording"
    if expected.event != event:
        return f"the run wrote a {event} event where the log has a {expected.event} event"
    if event == "request":
        return "the request differs from the recorded one (conversation or tools)"
    return f"the {event} event differs from the recorded one"


class PlaybackModel:
    """The recorded replies, in order; the live model once the log has gone live."""

    def __init__(self, log: PlaybackLog, live: Model | None = None) -> None:
        self.log = log
        self.live = live

    def complete(self, request: Request) -> Reply:
        if self.log.live is not None and self.live is not None:
            return self.live.complete(request)
        return self._recorded(request)

    async def acomplete(self, request: Request) -> Reply:
        if self.log.live is not None and self.live is not None:
            live = self.live
            return await (live.acomplete(request) if prefers_async(live, "complete", "acomplete")  # type: ignore[attr-defined]
                          else in_thread(live.complete, request))
        return self._recorded(request)

    def _recorded(self, request: Request) -> Reply:
        nxt = None if self.log.detached else self.log.rec.peek()
        if isinstance(nxt, ReplyLine):
            return nxt.reply()
        if isinstance(nxt, LastAnswerLine) and nxt.decision == "failed" and \
                nxt.reason is not None:  # the last answer's request met a stop: the same again
            raise StopError(nxt.reason, nxt.detail)
        if isinstance(nxt, StopLine):  # the recorded model call ended the run
            if nxt.partial_text is not None:  # before its reply was whole: the text it had streamed
                self.log.state.streamed = {request.step: [nxt.partial_text]}
            raise self.log.recorded_stop(nxt)
        raise RecordingEnded(request.step, f"the model is asked for step {request.step}, "
                             "and the recording has no reply for it")

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int | None:
        """The recorded prompt estimate (a model's own count may have made it); live: the model's."""
        if self.log.live is not None:
            fn = getattr(self.live, "count_tokens", None)
            return fn(messages, tools) if callable(fn) else None
        return self._estimate()

    async def acount_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int | None:
        live = self.live
        if self.log.live is not None:
            if prefers_async(live, "count_tokens", "acount_tokens"):
                return await live.acount_tokens(messages, tools)  # type: ignore[union-attr, no-any-return]
            fn = getattr(live, "count_tokens", None)
            return await in_thread(fn, messages, tools) if callable(fn) else None
        return self._estimate()

    def _estimate(self) -> int | None:
        """The figure the recorded run's budgets judged this prompt by: its request's estimate, or
        where it was never sent, the one its stop (or skipped last answer) records (older logs
        record none: None, and the ring estimates)."""
        rec = self.log.rec
        nxt = None if self.log.detached else rec.peek()
        if isinstance(nxt, LastAnswerLine) and nxt.decision == "skipped":
            return _whole(nxt.prompt_estimate)
        if isinstance(nxt, LastAnswerLine) and rec.pos + 1 < len(rec.events):
            nxt = rec.events[rec.pos + 1]  # the last answer's request follows its `asked` event
        if isinstance(nxt, StopLine):  # a budget refused the prompt before it was sent
            return _whole(nxt.data.get("prompt_estimate"))
        return nxt.prompt_estimate if isinstance(nxt, RequestLine) else None

    def describe(self) -> dict[str, Any]:
        fn = getattr(self.live, "describe", None)
        return fn() if callable(fn) else {"kind": "playback"}


class PlaybackExecutor(Executor):
    """Recorded results while playing back; `live` runs real tools once live (resume), or also while
    playing back when `rerun` (replay --execute-tools: real tools, compared with the recording)."""

    def __init__(self, log: PlaybackLog, live: Executor | None = None, *, rerun: bool = False) -> None:
        super().__init__(None)
        self.log = log
        self.live = live
        self.rerun = rerun
        self.ran: list[str] = []  # tools that really ran
        self.unknown: list[str] = []  # tool_call_ids answered with outcome_unknown

    async def aexecute(self, t: Tool, args: dict[str, Any], timeout_s: float | None) -> ToolResult:
        log = self.log
        if log.live is not None:
            intent, log.unknown_intent = log.unknown_intent, None
            if intent is not None and t.kind is ToolKind.SIDE_EFFECT:
                self.unknown.append(intent.tool_call_id)
                return outcome_unknown(t, intent)
            return await self._run(t, args, timeout_s)
        nxt = None if log.detached else log.rec.peek()
        interrupted = log.rec.stop_ahead() if isinstance(nxt, ResultLine) and \
            nxt.error == "outcome_unknown" else None
        if interrupted is not None:  # the recorded run was stopped (Ctrl-C) while this tool ran
            raise log.recorded_stop(interrupted)
        if isinstance(nxt, ResultLine) and nxt.decision == "executed":
            if not self.rerun or isinstance(t.fn, RecordedFn) or nxt.error == "outcome_unknown":
                violation = nxt.violation  # recorded on the result (older logs: the stop's detail)
                stop = log.rec.stop
                if not isinstance(violation, str):
                    violation = stop.detail if stop is not None and stop.reason == "schema_mismatch" and \
                        log.rec.pos == log.rec.settled else None
                return nxt.tool_result(violation)
            return await self._run(t, args, timeout_s)
        stop = log.rec.stop_ahead() if not log.detached else None
        if stop is not None:  # the recorded run was interrupted while this tool ran
            raise log.recorded_stop(stop)
        raise RecordingEnded(log.step(), f"{t.name} is to run, and the recording has no result for it")

    async def _run(self, t: Tool, args: dict[str, Any], timeout_s: float | None) -> ToolResult:
        if self.live is None or isinstance(t.fn, RecordedFn):
            raise RecordingEnded(self.log.step(), f"{t.name} has no recorded result and cannot run here")
        if t.name not in self.ran:
            self.ran.append(t.name)
        live = self.live
        if prefers_async(live, "execute", "aexecute"):
            return await live.aexecute(t, args, timeout_s)
        return await in_thread(live.execute, t, args, timeout_s)


class RecordedAnswer:
    """The answer contract as the recorded run applied it (the header's `answer`): each verdict, and
    the feedback a rejection sent, taken from the recorded `answer` event, as a recorded approval
    is. The contract itself (a model class, a function) is not in the log and is not needed."""

    def __init__(self, log: PlaybackLog, described: dict[str, Any], live: AnswerContract | None = None) -> None:
        self.log = log
        self.retries = described.get("retries", 1)
        self.typed = described.get("kind") in ("model", "schema")
        self.live = live  # resume: the contract that judges once the run goes live

    def _recorded(self) -> AnswerLine:
        nxt = None if self.log.detached else self.log.rec.peek()
        if not isinstance(nxt, AnswerLine):
            raise RecordingEnded(self.log.step(), "the answer is judged, and the recording has no verdict for it")
        return nxt

    def judge(self, text: str) -> Judged:
        if self.log.live is not None and self.live is not None:
            return self.live.judge(text)
        e = self._recorded()
        if e.decision == "rejected":
            return Judged(None, e.error or "rejected")
        try:
            return Judged(json.loads(as_json(text)) if self.typed else text, None)
        except ValueError:
            return Judged(text, None)

    def feedback(self, error: str) -> str:
        if self.log.live is not None and self.live is not None:
            return self.live.feedback(error)
        return self._recorded().message or ""


class PlaybackApproval:
    """Answers the untrusted-content gate as the recorded run did; `live` answers after the switch."""

    mode = "playback"

    def __init__(self, log: PlaybackLog, live: Callable[[Any, str], bool] | None = None) -> None:
        self.log = log
        self.live = live

    def __call__(self, call: Any, reason: str) -> bool:
        if self.log.live is not None:
            return bool(self.live(call, reason)) if self.live is not None else False
        nxt = None if self.log.detached else self.log.rec.peek()
        return isinstance(nxt, GateLine) and nxt.decision == "approved"


@dataclass
class Playback:
    """The ring set up to run again over a finished log: the state the header describes, the recorded
    replies, results and approvals, and the guards the ring runs (over `limits`, with the recorded
    gate). Replay and reconcile's fold both start here; resume wires its own (it goes live)."""

    state: RunState
    log: PlaybackLog
    model: PlaybackModel
    guards: Guards
    executor: PlaybackExecutor

    @classmethod
    def of(cls, recorded: RunLogFile, registry: Registry, limits: Limits, *, guards: list[Guard] | None = None,
           what_if: bool = False, compare: Callable[[dict[str, Any]], dict[str, Any] | None] = comparable,
           live: Executor | None = None, logged_taint: bool = False) -> Playback:
        """`live`: an executor that runs the tools for real, compared with the recording (replay
        --execute-tools). `logged_taint`: the gate is tainted where the log says it was (its
        `tainted` events), as well as where it sees untrusted results itself: the recorded tools
        carry no workspace provenance to recognize a page's text by. LogError when the header
        cannot be turned back into a run."""
        h, path = recorded.header, recorded.path
        state = new_state(registry, limits, policy_of(h, path), h.params, messages_of(h), compaction_of(h, path))
        priced(state, h, path)
        state.names_reservation_cuts = h.version >= 4
        state.model_cap = model_cap(h.model) if h.version >= 6 else None
        plog = PlaybackLog(Recording(recorded.events), state, what_if=what_if, compare=compare)
        if h.answer is not None:
            state.answer = RecordedAnswer(plog, h.answer)
        gate = gate_of(h, path, PlaybackApproval(plog))
        plog.on_taint = lambda raw: _explain(gate, raw)
        if logged_taint:
            plog.inputs = lambda e: _taint(gate, e)
        return cls(state, plog, PlaybackModel(plog),
                   Guards([RecordedEnd(plog), default_guards(state.limits, guards, gate)]),
                   PlaybackExecutor(plog, live, rerun=live is not None))

    def drive(self) -> RunResult:
        """The ring to its stop; raises Diverged (unless what-if) or RecordingEnded."""
        return drive(self.state, self.model, self.log, self.guards, self.executor)


class RecordedEnd(Guard):
    """The recorded run ended by a fenced framework's own limit (`framework_limit`), or by its client
    with calls open (`left_by_client`: a proxy run nothing more came for): asked first at
    every point the ring asks its guards, it ends the run again with the recorded stop where the
    recording holds nothing more but that stop (and its not-run calls), before the ring asks for a
    request, runs a call or checks a turn the framework never came to."""

    def __init__(self, log: PlaybackLog) -> None:
        self.log = log

    def _here(self) -> Stop | None:
        log = self.log
        stop = log.rec.stop_ahead() if log.live is None and log.detached is None else None
        if stop is None or not (stop.reason == StopReason.FRAMEWORK_LIMIT or left_by_client(stop.reason, stop.data)):
            return None
        return log.recorded_stop(stop).stop

    def before_request(self, s: RunState) -> Stop | None:
        return self._here()

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Stop | None:
        return self._here()

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        return self._here()

    def after_turn(self, s: RunState, results: list[ToolResult]) -> Stop | None:
        return self._here()


def priced(state: RunState, h: HeaderLine, path: str) -> None:
    """The run's prices as its header recorded them (the user's table and the start price), so a
    replayed run is charged and checked as the recorded one was. LogError when unreadable."""
    record = h.prices
    if record is None:
        return
    try:
        model = record.get("model")
        state.set_prices(PriceBook.from_record(record), model if isinstance(model, str) else None)
    except PriceError as exc:
        raise LogError(path, h.line, f"header prices: {exc}") from None


def _taint(gate: UntrustedGate, e: LogEvent) -> bool:
    """A recorded `tainted` gate event, given to the gate (without logging it again)."""
    if not isinstance(e, GateLine) or e.decision != "tainted":
        return False
    source = e.source or e.name
    gate.mark(Taint(e.step, source, taint_why(e.record, source)))
    return True


def _explain(gate: UntrustedGate, raw: dict[str, Any]) -> None:
    """The replayed gate's first taint, given why its source was untrusted as the recorded event says:
    the live tools knew it from the workspace's provenance, which recorded tools lack, and the gate's
    later reasons (a refusal the model read) name it."""
    t = gate.taint
    if t is not None and t.why is None and (why := taint_why(raw, t.source)) is not None:
        gate.taint = replace(t, why=why)
