"""Resume: continue a run whose process died, from its log, appending to the same log.

The log is read back to its last complete line (an incomplete last line is cut off the file). The
ring then runs again over the recorded events (playback: recorded replies and results, every event
checked against the log), which rebuilds the conversation, the ledger, the read-only cache, the
guards' memory (repeat counts, result streak, taint) and the estimator exactly as they were. Where
the log ends, the run goes live: the real model (rebuilt from the header unless given) and the
real tools, the clock continuing from the last recorded time, new events appended.

A side-effecting call whose intent was the last thing logged is not run again: the model receives
an `outcome_unknown` result for it. A read-only or poll call in that position runs again.

A run that ended `endpoint_error` or `cancelled` can go on too (an outage, a Ctrl-C): the stop and
its bookkeeping are played back as if they were not there, and the run continues after them, maybe
with another endpoint or model and other limits (`overrides`), as a new segment of the same log.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._keywords import keywords_checked
from .._answer import AnswerArg, AnswerContract, answer_contract
from .._guards import Guard, default_guards
from .._limits import Limits
from .._log import LogError
from .._log._reader import RunLogFile, read_log
from .._log._schema import HeaderLine, LogEvent, ReplyLine, ResumeLine, StopLine
from .._log._segments import REOPENABLE, bookkeeping_start
from .._log._writer import RunLog
from .._loop import drive, new_state
from .._setup import model_cap
from .._stops import RunResult
from ..models._base import Model
from ..tools._executor import Executor
from ..tools._registry import Tool, ToolKind
from ._playback import (Diverged, PlaybackApproval, PlaybackExecutor, PlaybackLog, PlaybackModel, RecordedAnswer,
                        PlaybackSignal, Recording, priced)
from ._rebuild import (check_tools, compaction_of, gate_of, limits_of, live_approval, messages_of,
                       model_of, policy_of, workspace_tools_of)

__all__ = ["resume", "ResumeOutcome", "ResumeError", "recorded_workspace_tools"]


class ResumeError(LogError):
    """The log cannot be continued (it does not play back, or its tools/model are not here)."""


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    """What a resume did: nothing for a run that had ended (`ended`), else the resumed run's result,
    where the log was resumed and which calls were answered outcome_unknown; `lines()` says it."""

    path: str
    ended: StopLine | None  # the run had already ended: nothing was done
    result: RunResult | None  # the resumed run's result
    resumed_after: int  # last complete line of the log as found
    torn_bytes: int  # bytes of an incomplete last line that were cut off
    outcome_unknown: tuple[str, ...]  # tool_call_ids answered with outcome_unknown
    reopened: StopLine | None = None  # the endpoint_error/cancelled stop the run went on past

    def lines(self) -> list[str]:
        if self.ended is not None:
            return [f"the run already ended at line {self.ended.line}: {self.ended.reason} "
                    f"({self.ended.verdict}); nothing to resume"]
        assert self.result is not None
        went_on = self.reopened
        out = [f"resumed after line {self.resumed_after}"
               + (f", past its {went_on.reason} stop at line {went_on.line}" if went_on is not None else "")
               + (f" (an incomplete last line of {self.torn_bytes} bytes was cut off)" if self.torn_bytes
                  else "")]
        if self.outcome_unknown:
            out.append(f"not run again, outcome unknown: {', '.join(self.outcome_unknown)}")
        r = self.result
        out.append(f"stop: {r.stop.reason} ({r.verdict}) at step {r.ledger.model_requests}: {r.stop.detail}")
        return out


@keywords_checked
def resume(path: str | Path, *, model: Model | None = None, tools: Iterable[Tool] | None = None,
           extra_tools: Iterable[Tool] = (), workspace: str | Path | None = None, guards: list[Guard] | None = None,
           executor: Executor | None = None, on_event: Callable[[LogEvent], None] | None = None,
           limits: Mapping[str, Any] | None = None, reopen: bool = True,
           answer: AnswerArg = None) -> ResumeOutcome:
    """Continue the run logged at `path`. `tools` default to the built-in workspace tools over
    `workspace` (default: the recorded one, with the recorded sandbox and untrusted globs), and
    `extra_tools` (custom or MCP tools) go next to them; `model` defaults to one rebuilt from the
    header's model settings.

    reopen: a run that ended `endpoint_error` or `cancelled` goes on past that stop (a new segment
      in the same log, after a `resume` event that names the stop's line; _log/_segments); any
      other stop means the run is over (`ended`).
    answer: the answer contract, where the run had one (its header's `answer`): the recorded part
      plays back with the recorded verdicts; once live, `answer` judges (default: a JSON schema
      contract from the recorded schema; a function's contract must be given again).
    limits: limit overrides by name (`{"max_steps": 20}`, values as `Limits` takes them), recorded in
      the resume event's `overrides` so replay, reconcile and the next resume apply them too; a
      given `model` is recorded there as well. The recorded part must still play back under them."""
    p = str(path)
    log = read_log(p, tolerant=True)
    last_line = len(log.events) + len(log.reopened) + 1
    events = log.events
    reopened = None
    if log.stop is not None:
        if not reopen or log.stop.reason not in REOPENABLE:
            return ResumeOutcome(p, log.stop, None, last_line, 0, ())
        reopened = log.stop
        events = events[:bookkeeping_start(events)]
    h = log.header
    try:
        registry = check_tools(h, p, [*(recorded_workspace_tools(log, workspace) if tools is None else tools),
                                      *extra_tools])
        live_model = model or model_of(h, sum(isinstance(e, ReplyLine) for e in events))
        state_limits = limits_of(h, p, limits)
    except LogError as exc:
        raise ResumeError(exc.path, exc.line, exc.message) from None
    except ValueError as exc:
        raise ResumeError(p, h.line, str(exc)) from None
    if log.torn_bytes:
        os.truncate(p, log.complete_bytes)
    state = new_state(registry, state_limits, policy_of(h, p), h.params, messages_of(h), compaction_of(h, p))
    priced(state, h, p)  # the cost budget goes on at the recorded prices
    state.model_cap = model_cap(h.model) if h.version >= 6 else None  # as the recorded part named its cuts
    state.run_id = h.run_id  # the same run: its requests carry the same id (a FakeServer's own sequence)
    overrides = _overrides(state_limits, limits, live_model if model is not None else None)
    rec = Recording(events, h.t)

    def go_live(plog: PlaybackLog) -> RunLog:
        live = RunLog(p, append=True, seq=log.next_seq, t0=state.t0, on_event=on_event)
        intent = plog.unknown_intent
        pending = None
        if intent is not None:
            t = registry.get(intent.name)
            side = t is None or t.kind is ToolKind.SIDE_EFFECT
            pending = {"tool_call_id": intent.tool_call_id, "name": intent.name, "line": intent.line,
                       "action": "outcome_unknown: not run again" if side else "run again (no side effects)"}
        extra: dict[str, Any] = {}
        if reopened is not None:
            extra["reopened"] = {"line": reopened.line, "reason": str(reopened.reason)}
        if overrides:
            extra["overrides"] = overrides
        live.write(ResumeLine(after_line=last_line, elapsed_s=round(plog.rec.last_t, 6),
                              step=state.ledger.model_requests, torn_bytes=log.torn_bytes, pending_intent=pending,
                              model=_describe(live_model), **extra))
        return live

    plog = PlaybackLog(rec, state, go_live=go_live)
    if h.answer is not None:
        state.answer = RecordedAnswer(plog, h.answer, _live_answer(h, p, answer))
    gate = gate_of(h, p, PlaybackApproval(plog, live_approval(h)))
    runner = PlaybackExecutor(plog, executor or Executor())
    try:
        result = drive(state, PlaybackModel(plog, live_model), plog,
                       default_guards(state.limits, guards, gate), runner)
    except Diverged as exc:
        d = exc.divergence
        raise ResumeError(p, d.line, "the log does not play back, so the run cannot be rebuilt from it: "
                          + d.describe()) from None
    except PlaybackSignal as exc:
        raise ResumeError(p, last_line, f"cannot resume: {exc}") from None
    return ResumeOutcome(p, None, result, last_line, log.torn_bytes, tuple(runner.unknown), reopened)


def _describe(model: Any) -> dict[str, Any]:
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else {"kind": type(model).__name__}


def _overrides(limits: Limits, changed: Mapping[str, Any] | None, model: Model | None) -> dict[str, Any]:
    """The resume event's `overrides`: the limits changed (as the header writes limits) and the model."""
    out: dict[str, Any] = {}
    if changed:
        as_json = limits.to_json()
        out["limits"] = {name: as_json[name] for name in changed}
    if model is not None:
        out["model"] = _describe(model)
    return out


def recorded_workspace_tools(log: RunLogFile, root: str | Path | None) -> list[Tool]:
    where = str(root) if root is not None else log.header.workspace
    if where and not Path(where).is_dir():
        raise ResumeError(log.path, log.header.line, f"the workspace {where} is not a folder here")
    return workspace_tools_of(log.header, log.path, where)


def _live_answer(h: HeaderLine, path: str, answer: AnswerArg) -> AnswerContract:
    """The contract a resumed run's live part is judged by: `answer`, else the recorded schema."""
    retries = h.answer.get("retries", 1) if h.answer is not None else 1
    spec = answer if answer is not None else (h.answer or {}).get("schema")
    if spec is None:
        raise ResumeError(path, h.line, f"the run had an answer contract ({(h.answer or {}).get('name')}, a "
                          "function) that the log cannot rebuild: pass it again, resume(..., answer=...)")
    contract = answer_contract(spec, retries)
    assert contract is not None
    return contract
