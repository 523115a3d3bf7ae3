"""Was the stop earned? For each reason: the limit it names, checked against the counts in the log."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._contract import check_reply, requested_max_tokens
from .._limits import Limits
from .._messages import Reply
from .._repeats import CycleTrail, RepeatCounts, Streak, outcome_fingerprint
from .._stops import StopReason
from ..tools._registry import Registry, ToolKind
from ._events import ResultEvent, StopEvent

__all__ = ["StopFacts", "limit_reached"]


@dataclass(frozen=True)
class StopFacts:
    stop: StopEvent
    limits: Limits
    params: dict[str, Any]
    turns: list[Reply | None]  # every reply, in order (None: unreadable)
    requests: int
    results: list[ResultEvent]
    keys: list[set[str]]  # per reply: canonical keys asked for
    prompt_used: int = 0  # the replies' prompt tokens, summed from the log
    completion_used: int = 0
    kinds: dict[str, ToolKind] = field(default_factory=dict)
    last_kind: str | None = None  # the event kind just before the stop (bookkeeping aside)
    steps: list[int] = field(default_factory=list)  # per reply: its step (parallel to turns and keys)
    result_keys: list[str | None] = field(default_factory=list)  # per result: its call's canonical key
    repeat_scope: str = "change"  # the header's Policy.repeat_scope

    def data(self, name: str) -> Any:
        return self.stop.data.get(name)

    def names_limit(self, configured: Any) -> tuple[bool, str]:
        said = self.data("limit")
        if configured is None:
            return False, f"the header says this limit is off (None), yet the stop names {said}"
        if said != configured:
            return False, f"the stop names limit {said}, the header {configured}"
        return True, ""


Rule = Callable[[StopFacts], tuple[bool, str]]


def _steps(f: StopFacts) -> tuple[bool, str]:
    ok, why = f.names_limit(f.limits.max_steps)
    return (ok and f.requests == f.limits.max_steps), why or f"{f.requests} requests, max_steps={f.limits.max_steps}"


def _tool_calls(f: StopFacts) -> tuple[bool, str]:
    ok, why = f.names_limit(f.limits.max_tool_calls)
    n = sum(r.decision == "executed" for r in f.results)
    return (ok and n == f.limits.max_tool_calls), why or f"{n} executions, max_tool_calls={f.limits.max_tool_calls}"


def _prompt(f: StopFacts) -> tuple[bool, str]:
    ok, why = f.names_limit(f.limits.max_prompt_tokens)
    used = f.prompt_used
    value = f.data("value")
    good = ok and isinstance(value, int) and value > (f.limits.max_prompt_tokens or 0) and value >= used
    return good, why or f"{used} used + next estimate = {value} > max_prompt_tokens={f.limits.max_prompt_tokens}"


def _completion(f: StopFacts) -> tuple[bool, str]:
    ok, why = f.names_limit(f.limits.max_completion_tokens)
    used = f.completion_used
    reserve = requested_max_tokens(f.params) or 0
    limit = f.limits.max_completion_tokens or 0
    good = ok and (used >= limit or used + reserve > limit) and f.data("value") == used + reserve
    return good, why or f"{used} used + {reserve} reserved vs max_completion_tokens={limit}"


def _wall(f: StopFacts) -> tuple[bool, str]:
    ok, why = f.names_limit(f.limits.max_wall_seconds)
    limit = f.limits.max_wall_seconds or 0.0
    good = ok and f.stop.t >= limit
    return good, why or f"stopped at t={f.stop.t:.3f}s, max_wall_seconds={limit:g}"


def _repeated_call(f: StopFacts) -> tuple[bool, str]:
    """Folds the log through the live rule (RepeatCounts): each reply's keys, then the side-effecting
    calls it executed; the call the stop names must have reached max_repeats in the last reply."""
    ok, why = f.names_limit(f.limits.max_repeats)
    executed: dict[int, list[str]] = defaultdict(list)
    for r, key in zip(f.results, f.result_keys):
        if r.decision == "executed" and key is not None and f.kinds.get(r.name) is ToolKind.SIDE_EFFECT:
            executed[r.step].append(key)
    counts = RepeatCounts(f.repeat_scope)
    for step, keys in zip(f.steps or range(1, len(f.keys) + 1), f.keys):
        counts.asked(k for k in keys if not _is_poll(f, k))
        for key in executed.get(step, ()):
            counts.changed(key)
    last = f.keys[-1] if f.keys else set()
    named = f.data("key")
    candidates = [named] if isinstance(named, str) else sorted(last)
    hits = [k for k in candidates if k in last and not _is_poll(f, k)
            and counts[k] >= (f.limits.max_repeats or 0) and counts[k] == f.data("value")]
    return (ok and bool(hits)), why or (f"{hits[0]} asked in {counts[hits[0]]} replies (repeat_scope="
                                         f"{f.repeat_scope}), max_repeats={f.limits.max_repeats}" if hits else
                                         f"no call of the last reply was asked {f.data('value')} times "
                                         f"(repeat_scope={f.repeat_scope})")


def _is_poll(f: StopFacts, key: str) -> bool:
    return f.kinds.get(key.split(":", 1)[0]) is ToolKind.POLL


def _trail(f: StopFacts) -> list[tuple[str, str]]:
    """The executed, non-poll results in order as (key, outcome fingerprint): what the rules see."""
    return [(key or r.name, outcome_fingerprint(r.content)) for r, key in zip(f.results, f.result_keys)
            if r.decision == "executed" and f.kinds.get(r.name) is not ToolKind.POLL]


def _repeated_result(f: StopFacts) -> tuple[bool, str]:
    if f.data("cycle") is not None:
        return _cycle(f)
    ok, why = f.names_limit(f.limits.max_identical_results)
    n, fp = f.data("value"), f.data("fingerprint")
    streak = Streak()
    for _, out in _trail(f):
        streak.add(out)
    good = ok and isinstance(n, int) and streak.length == n and streak.last == fp and \
        n > (f.limits.max_identical_results or 0)
    return good, why or f"last {n} executed results share fingerprint {fp}: {good}"


def _cycle(f: StopFacts) -> tuple[bool, str]:
    ok, why = f.names_limit(f.limits.max_cycle_repeats)
    trail = CycleTrail(f.limits.max_cycle_repeats or 2)
    block = None
    for key, out in _trail(f):
        block = trail.add(key, out)
    named = f.data("cycle")
    good = ok and block is not None and [k for k, _ in block] == named and f.data("period") == len(block)
    return good, why or (f"the last executed calls repeat a block of {len(block)} "
                         f"{f.limits.max_cycle_repeats} times: {good}" if block else
                         "the last executed calls do not repeat a block of 2 or 3")


def _no_progress(f: StopFacts) -> tuple[bool, str]:
    if not f.limits.no_progress:
        return False, "no_progress is off in the header"
    step = f.requests
    last = [r for r in f.results if r.step == step and r.raw.get("error") != "not_executed"]
    good = bool(last) and all(r.decision == "reused" for r in last)
    return good, f"step {step}: {len(last)} result(s), all reused: {good}"


def _last_reply(f: StopFacts) -> Reply | None:
    return f.turns[-1] if f.turns and f.last_kind == "reply" else None


def _final(f: StopFacts) -> tuple[bool, str]:
    r = _last_reply(f)
    good = r is not None and not r.tool_calls and bool((r.content or "").strip()) and \
        f.stop.final_answer == r.content
    return good, "the last reply is the answer" if good else "the last reply is not the recorded answer"


def _empty(f: StopFacts) -> tuple[bool, str]:
    r = _last_reply(f)
    good = r is not None and not r.tool_calls and not (r.content or "").strip()
    return good, "the last reply is empty" if good else "the last reply is not empty"


def _incomplete(f: StopFacts) -> tuple[bool, str]:
    r = f.turns[-1] if f.turns else None
    if f.last_kind == "request":  # the adapter raised it: nothing was recorded to check
        return True, "the model call itself ended incomplete"
    good = r is not None and check_reply(r, Registry(), requested_max_tokens(f.params)).incomplete is not None
    return good, "the last reply did not complete" if good else "the last reply looks complete"


def _violation(f: StopFacts) -> tuple[bool, str]:
    step = f.requests
    rejected = [r for r in f.results if r.step == step and r.decision == "rejected" and r.error == f.stop.reason]
    if rejected:
        return True, f"step {step}: {len(rejected)} call(s) rejected with {f.stop.reason}"
    if f.stop.reason == StopReason.SCHEMA_MISMATCH and f.last_kind == "result":
        return True, "a result broke its tool's result model"
    if f.last_kind == "request":  # e.g. an endpoint's tool_use_failed
        return True, "the endpoint reported the violation"
    return False, f"no call was rejected with {f.stop.reason} in step {step}"


def _overflow(f: StopFacts) -> tuple[bool, str]:
    if f.last_kind == "request":
        return True, "the endpoint reported it"
    window = f.limits.context_window
    good = window is not None and f.data("limit") == window and (f.data("value") or 0) > window
    return good, f"next prompt ~{f.data('value')} vs context_window={window}"


def _not_a_limit(f: StopFacts) -> tuple[bool, str]:
    return True, f"{f.stop.reason} is not a budget"


_RULES: dict[str, Rule] = {
    StopReason.MAX_STEPS: _steps, StopReason.MAX_TOOL_CALLS: _tool_calls,
    StopReason.MAX_PROMPT_TOKENS: _prompt, StopReason.MAX_COMPLETION_TOKENS: _completion,
    StopReason.MAX_WALL_SECONDS: _wall, StopReason.REPEATED_CALL: _repeated_call,
    StopReason.REPEATED_RESULT: _repeated_result, StopReason.NO_PROGRESS: _no_progress,
    StopReason.FINAL_ANSWER: _final, StopReason.EMPTY_ANSWER: _empty,
    StopReason.INCOMPLETE_STREAM: _incomplete, StopReason.INVALID_JSON: _violation,
    StopReason.SCHEMA_MISMATCH: _violation, StopReason.UNKNOWN_TOOL: _violation,
    StopReason.CONTEXT_OVERFLOW: _overflow, StopReason.ENDPOINT_ERROR: _not_a_limit,
    StopReason.CANCELLED: _not_a_limit, StopReason.INTERNAL_ERROR: _not_a_limit,
}


def limit_reached(f: StopFacts) -> tuple[bool, str]:
    return _RULES[f.stop.reason](f)
