"""Guards: one small object per policy, each with phase-named methods returning None or a Stop.

Phases: before_request (budgets are preconditions), on_reply (observe what was asked),
before_execution (per call, before it runs or is reused; may also return a ToolResult made with
`tools.refusal(...)`: that call is refused, the model receives the result, and the run goes on;
or an awaitable of either, for a decision that waits on something (the gate's approval hook): the
ring awaits it, then the later guards run),
after_execution (per result), after_turn (once every call of a reply has its result).

The last answer (Policy(last_answer=True)) is asked only if every before_request guard lets it
through with `s.final_request` set: StepLimit lets it past max_steps (the one request that may go
there), the completion and cost budgets reserve `last_answer_tokens` for it. `nudge_for` says what
replaces a repetition stop under Policy(nudge=True).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ._contract import requested_max_tokens
from ._repeats import CycleTrail, RepeatCounts, Streak, call_text, describe_cycle, outcome_fingerprint, streak_token
from ._stops import Stop, StopReason
from ._log._large import short_key
from .tools._executor import refusal
from .tools._registry import ToolKind

if TYPE_CHECKING:
    from ._contract import CheckedCall
    from ._limits import Ledger, Limits, Policy
    from ._state import RunState
    from .tools._executor import ToolResult
    from .tools._registry import Registry

__all__ = [
    "Guard", "Guards", "RunView", "StepLimit", "ToolCallLimit", "PromptTokenLimit", "CompletionTokenLimit",
    "WallClock", "RepeatedCall", "RepeatedResult", "RepeatedCycle", "NoProgress", "ResultContract",
    "CostLimit", "default_guards", "NUDGED", "nudge_for", "nudging",
]


class RunView(Protocol):
    """What a custom guard reads of the run: read-only (the ring's `RunState` is one). Annotate a
    guard's `s` with it; `s.note(...)` goes through `Guard.note`."""

    @property
    def limits(self) -> Limits: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def ledger(self) -> Ledger: ...  # counts so far: model_requests, tool_executions, tokens, ...
    @property
    def registry(self) -> Registry: ...
    @property
    def messages(self) -> Sequence[Mapping[str, Any]]: ...  # the conversation so far
    @property
    def params(self) -> Mapping[str, Any]: ...
    def elapsed(self) -> float: ...  # seconds since the run started
    def note(self, guard: str, message: str, data: dict[str, Any] | None = None) -> None: ...


class Guard:
    """Base: every phase allows. Subclasses override the phases they watch.

    A custom guard stops the run with `self.stop(...)` (reason `guard`, its name in the stop's data),
    refuses one call with `self.refuse(...)`, and leaves a typed `guard` event in the log with
    `self.note(s, ...)`. `name` (default: the class name) is how the log names it.
    """

    name: str = ""

    @property
    def guard_name(self) -> str:
        return self.name or type(self).__name__

    def stop(self, detail: str, *, limit: Any = None, value: Any = None, **data: Any) -> Stop:
        """This guard's stop: reason `guard`, data {"guard": its name, "limit", "value", ...}."""
        numbers = {k: v for k, v in (("limit", limit), ("value", value)) if v is not None}
        return Stop(StopReason.GUARD, detail, {"guard": self.guard_name, **numbers, **data})

    def refuse(self, message: str, **fields: Any) -> ToolResult:
        """Refuse one call (from before_execution): the model gets this result, the run goes on."""
        return refusal(f"guard:{self.guard_name}", message=message, **fields)

    def note(self, s: RunView, message: str, **data: Any) -> None:
        """Write a `guard` event (this guard's name, `message`, `data`) into the run's log."""
        s.note(self.guard_name, message, data)

    def before_request(self, s: RunState) -> Stop | None:
        return None

    def on_reply(self, s: RunState, calls: list[CheckedCall]) -> None:
        return None

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Stop | ToolResult | None:
        return None

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        return None

    def after_turn(self, s: RunState, results: list[ToolResult]) -> Stop | None:
        return None


class _Copied(Guard):
    """A built-in guard that knows its state: a copy of the guards (the proxy's check of a reply's
    calls, `precheck`) copies only that (`_copy`). A subclass from elsewhere may hold more: copied
    whole, every attribute as deepcopy copies them."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        if type(self).__module__ == __name__:
            return self._copy(memo)
        new = copy.copy(self)
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def _copy(self, memo: dict[int, Any]) -> Any:
        return self


class _Settled(_Copied):
    """A guard whose state is its settings: a copy of the guards shares it."""


class StepLimit(_Settled):
    def __init__(self, limit: int | None) -> None:
        self.limit = limit

    def before_request(self, s: RunState) -> Stop | None:
        n = s.ledger.model_requests
        if self.limit is not None and n >= self.limit and not s.final_request:
            return Stop(StopReason.MAX_STEPS, f"the next model request would exceed max_steps={self.limit} "
                        f"({n} requests made)", {"limit": self.limit, "value": n + 1})
        return None


class ToolCallLimit(_Settled):
    def __init__(self, limit: int | None) -> None:
        self.limit = limit

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Stop | None:
        n = s.ledger.tool_executions
        if self.limit is not None and not reuse and n >= self.limit:
            return Stop(StopReason.MAX_TOOL_CALLS, f"executing {c.tool.name} would exceed "
                        f"max_tool_calls={self.limit} ({n} executions made)",
                        {"limit": self.limit, "value": n + 1})
        return None


class PromptTokenLimit(_Settled):
    """Cumulative prompt tokens (reported, or estimated) plus the next prompt's estimate must fit."""

    def __init__(self, limit: int | None, context_window: int | None = None) -> None:
        self.limit = limit
        self.context_window = context_window

    def before_request(self, s: RunState) -> Stop | None:
        est = s.next_prompt_estimate()
        if self.context_window is not None and est > self.context_window:
            return Stop(StopReason.CONTEXT_OVERFLOW, f"the next prompt (~{est} tokens, estimated) would "
                        f"not fit context_window={self.context_window}; not sent",
                        {"limit": self.context_window, "value": est, "prompt_estimate": est})
        used = s.ledger.prompt_tokens
        if self.limit is not None and used + est > self.limit:
            return Stop(StopReason.MAX_PROMPT_TOKENS, f"the next request would exceed max_prompt_tokens="
                        f"{self.limit}: {used} used + ~{est} estimated for the next prompt; not sent",
                        {"limit": self.limit, "value": used + est, "prompt_estimate": est})
        return None


class CompletionTokenLimit(_Settled):
    """Cumulative completion tokens; a request's max_tokens is reserved before sending."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit

    def before_request(self, s: RunState) -> Stop | None:
        if self.limit is None:
            return None
        used = s.ledger.completion_tokens
        last = s.final_request and s.last_answer_reserve() is not None
        reserve = (s.last_answer_reserve() if last else requested_max_tokens(s.params)) or 0
        if used >= self.limit or used + reserve > self.limit:
            by = "last_answer_tokens (the last answer)" if last else "max_tokens"
            return Stop(StopReason.MAX_COMPLETION_TOKENS, f"the next request would exceed "
                        f"max_completion_tokens={self.limit}: {used} used + {reserve} reserved by {by}",
                        {"limit": self.limit, "value": used + reserve})
        return None


class CostLimit(_Settled):
    """Dollars: spent so far + the next prompt's estimate at the input price + the request's reserved
    `max_tokens` at the output price must fit `max_cost_usd`, else the request is not sent. The price
    is the run's (`s.price`: the start model's, then the last reply's model's)."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit

    def before_request(self, s: RunState) -> Stop | None:
        if self.limit is None or s.price is None:
            return None
        p, spent = s.price, s.ledger.cost_usd or 0.0
        est, reserve = s.next_prompt_estimate(), s.max_tokens() or 0
        prompt_usd, out_usd = p.cost(est, 0), p.cost(0, reserve)
        total = round(spent + prompt_usd + out_usd, 9)
        if total > self.limit:
            return Stop(StopReason.MAX_COST_USD, f"the next request would exceed max_cost_usd={self.limit:g}: "
                        f"${spent:.6f} spent + ${prompt_usd:.6f} for the next prompt (~{est} tokens at "
                        f"${p.input_per_mtok:g}/MTok) + ${out_usd:.6f} for {reserve} reserved completion tokens "
                        f"(at ${p.output_per_mtok:g}/MTok, {p.model}); not sent",
                        {"limit": self.limit, "value": total, "prompt_estimate": est})
        return None


class WallClock(_Settled):
    def __init__(self, limit: float | None) -> None:
        self.limit = limit

    def _check(self, s: RunState, what: str) -> Stop | None:
        elapsed = s.elapsed()
        if self.limit is not None and elapsed >= self.limit:
            return Stop(StopReason.MAX_WALL_SECONDS, f"{elapsed:.2f}s elapsed: {what} would run past "
                        f"max_wall_seconds={self.limit:g}", {"limit": self.limit, "value": round(elapsed, 3)})
        return None

    def before_request(self, s: RunState) -> Stop | None:
        return self._check(s, "the next model request")

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Stop | None:
        return None if reuse else self._check(s, f"executing {c.tool.name}")


class RepeatedCall(_Copied):
    """The same canonical call asked for in `limit` model replies with nothing changed in between
    stops before it runs again. A call's count restarts whenever another side-effecting call is
    executed (scope "change"); scope "run" counts over the whole run. `scope=None`: the run's
    `Policy.repeat_scope`. Poll tools are exempt.

    Within one reply, a side-effecting call asked for again with nothing changed in between (the
    same canonical call, e.g. twenty identical `charge_card` calls) runs once: each copy after the
    first is refused, and its result says so (a read-only copy is answered from the cache instead).
    After another side-effecting call has run, a copy is a new question, as across replies."""

    def __init__(self, limit: int | None, scope: str | None = None) -> None:
        self.limit = limit
        self.scope = scope
        self.counts: RepeatCounts | None = None
        self.reply_keys: dict[str, CheckedCall] = {}  # this reply's side-effecting calls so far, by key

    def _copy(self, memo: dict[int, Any]) -> RepeatedCall:
        """A copy with its own counts (small values; the calls it holds are shared, never changed)."""
        new = copy.copy(self)
        new.counts = None if self.counts is None else self.counts.copy()
        new.reply_keys = dict(self.reply_keys)
        return new

    def _counts(self, s: RunState) -> RepeatCounts:
        if self.counts is None:
            self.counts = RepeatCounts(self.scope or s.policy.repeat_scope)
        return self.counts

    def on_reply(self, s: RunState, calls: list[CheckedCall]) -> None:
        self._counts(s).asked({c.key for c in calls if c.tool.kind is not ToolKind.POLL})
        self.reply_keys = {}

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Stop | ToolResult | None:
        if self.limit is None or c.tool.kind is ToolKind.POLL:
            return None
        if c.tool.kind is ToolKind.SIDE_EFFECT:
            first = self.reply_keys.setdefault(c.key, c)
            if first is not c:
                return refusal("duplicate_call", first_call=first.call.id, message=(
                    f"not run: this reply already asked for {call_text(c.key)} (call {first.call.id}); a "
                    "side-effecting call runs once per reply. Ask for it again in a later reply if it "
                    "must run twice."))
        counts = self._counts(s)
        n = counts[c.key]
        if n >= self.limit:
            how = f" with nothing changed in between (max_repeats={self.limit})" if counts.scope == "change" \
                else f" (max_repeats={self.limit}, repeat_scope=run)"
            key = short_key(c.key)  # a large call's key as the log stores it (its digest), not the call
            return Stop(StopReason.REPEATED_CALL, f"{key} requested in {n} model replies{how}; not run again",
                        {"limit": self.limit, "value": n, "key": key, "scope": counts.scope})
        return None

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        if r.decision == "executed" and c.tool.kind is ToolKind.SIDE_EFFECT:
            self._counts(s).changed(c.key)
            first = self.reply_keys.get(c.key)
            self.reply_keys = {} if first is None else {c.key: first}  # the world changed for the others
        return None


class RepeatedResult(_Copied):
    """More than `limit` executed results in a row with one fingerprint, whatever the call; but a
    side-effecting call's empty success counts only against the same call's (`streak_token`)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.streak = Streak()

    def _copy(self, memo: dict[int, Any]) -> RepeatedResult:
        new = copy.copy(self)
        new.streak = copy.copy(self.streak)
        return new

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        if self.limit is None or r.decision != "executed" or c.tool.kind is ToolKind.POLL:
            return None
        fp = outcome_fingerprint(r.content)
        n = self.streak.add(streak_token(c.key, fp, c.tool.kind is ToolKind.SIDE_EFFECT, r.ok, r.content))
        if n > self.limit:
            return Stop(StopReason.REPEATED_RESULT, f"{n} executed results in a row with "
                        f"fingerprint {fp} (max_identical_results={self.limit})",
                        {"limit": self.limit, "value": n, "fingerprint": fp})
        if n == self.limit and nudging(s):  # one more stops the run: say so now (Policy.nudge)
            s.warn(Stop(StopReason.REPEATED_RESULT, f"{n} executed results in a row with fingerprint {fp}: "
                        f"one more stops the run (max_identical_results={self.limit})",
                        {"limit": self.limit, "value": n, "fingerprint": fp, "warning": True}), c)
        return None


class RepeatedCycle(_Copied):
    """A block of 2 or 3 executed calls that comes back `limit` times in a row with identical
    results (the same edit, then the same failing test, forever) stops as repeated_result."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.trail = CycleTrail(limit or 2)
        self.early: CycleTrail | None = None  # Policy.nudge: the block back one time fewer warns

    def _copy(self, memo: dict[int, Any]) -> RepeatedCycle:
        new = copy.copy(self)
        new.trail, new.early = self.trail.copy(), None if self.early is None else self.early.copy()
        return new

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        if self.limit is None or r.decision != "executed" or c.tool.kind is ToolKind.POLL:
            return None
        fp = outcome_fingerprint(r.content)
        block = self.trail.add(c.key, fp)
        if self.early is None and s.policy.nudge and self.limit > 2:  # (a block seen once is no cycle)
            self.early = CycleTrail(self.limit - 1)
        soon = self.early.add(c.key, fp) if self.early is not None else None
        if block is None:
            if soon is not None and nudging(s):
                times = self.limit - 1
                s.warn(Stop(StopReason.REPEATED_RESULT, f"{describe_cycle(soon, times)}: one more round stops "
                            f"the run (max_cycle_repeats={self.limit})",
                            {"limit": self.limit, "value": times, "period": len(soon), "warning": True,
                             "cycle": [k for k, _ in soon], "fingerprints": [f for _, f in soon]}), c)
            return None
        return Stop(StopReason.REPEATED_RESULT, f"{describe_cycle(block, self.limit)} "
                    f"(max_cycle_repeats={self.limit})",
                    {"limit": self.limit, "value": self.limit, "period": len(block),
                     "cycle": [k for k, _ in block], "fingerprints": [fp for _, fp in block]})


class NoProgress(_Settled):
    """A turn whose every call was answered from the cache learned nothing new."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def after_turn(self, s: RunState, results: list[ToolResult]) -> Stop | None:
        if self.enabled and results and all(r.decision == "reused" for r in results):
            return Stop(StopReason.NO_PROGRESS, f"step {s.ledger.model_requests}: all {len(results)} "
                        "call(s) were answered from the cache; nothing new was learned")
        return None


class ResultContract(_Settled):
    """A result that breaks the tool's declared result model stops the run."""

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        if r.violation:
            return Stop(StopReason.SCHEMA_MISMATCH, r.violation)
        return None


NUDGED = frozenset({StopReason.REPEATED_CALL, StopReason.REPEATED_RESULT, StopReason.NO_PROGRESS})


def nudging(s: RunState) -> bool:
    """Policy(nudge=True) and the run's one nudge not given yet."""
    return s.policy.nudge and not s.ledger.nudges


def nudge_for(s: RunState, stop: Stop, c: CheckedCall | None = None,
              calls: list[CheckedCall] | None = None) -> str | None:
    """Under Policy(nudge=True), the message that replaces the run's first repetition stop (`c`: the
    call it was raised for; `calls`: the turn's, for no_progress), saying exactly what happened;
    None when the stop stands (nudge off, a nudge already given, another reason)."""
    if not nudging(s) or stop.reason not in NUDGED:
        return None
    d = stop.data
    tail = ("Repeating it will not tell you anything new. Try something different, or give your final "
            "answer from what you already know; the next repetition ends the run.")
    if stop.reason is StopReason.REPEATED_CALL and isinstance(key := d.get("key"), str):
        fp = s.outcomes.get(key)
        seen = f"its result has not changed (fingerprint {fp})" if fp else "it has no new result"
        return (f"loopfence: you asked for {call_text(key)} in {d.get('value')} replies with nothing changed "
                f"in between; {seen}. It was not run again. {tail}")
    if stop.reason is StopReason.REPEATED_RESULT and "cycle" in d:
        return f"loopfence: {stop.detail}: the same calls keep giving the same results. {tail}"
    if stop.reason is StopReason.REPEATED_RESULT:
        last = f", the last from {call_text(c.key)}" if c is not None else ""
        return (f"loopfence: the last {d.get('value')} tool results were identical (fingerprint "
                f"{d.get('fingerprint')}){last}. {tail}")
    keys = list(dict.fromkeys(x.key for x in calls or ()))
    asked = "; ".join(f"{call_text(k)} (result fingerprint {s.outcomes.get(k, '?')})" for k in keys)
    return (f"loopfence: every call of your last reply was answered from an earlier result, so nothing new "
            f"was learned{': ' + asked if asked else ''}. {tail}")


class Guards(_Copied):
    """Runs guards in order; the first stop wins. Each phase calls only the guards that watch it."""

    def __init__(self, guards: list[Guard]) -> None:
        self.guards = tuple(guards)
        self._before_request = _watching(self.guards, "before_request")
        self._on_reply = _watching(self.guards, "on_reply")
        self._before_execution = _watching(self.guards, "before_execution")
        self._after_execution = _watching(self.guards, "after_execution")
        self._after_turn = _watching(self.guards, "after_turn")

    def _copy(self, memo: dict[int, Any]) -> Guards:
        """A copy whose guards are each copied (the built-in ones cheaply: their state is small values;
        one `memo` names stays shared)."""
        new = copy.copy(self)
        Guards.__init__(new, [copy.deepcopy(g, memo) for g in self.guards])
        return new

    def trial(self, memo: dict[int, Any], after: bool) -> Guards:
        """A copy to try calls on (the proxy's `precheck`): each guard the trial asks (before_execution,
        and after_execution when `after`) copied as deepcopy copies it (`memo` names those it shares);
        the others shared as they are: never asked, never changed."""
        asked = ("before_execution", "after_execution") if after else ("before_execution",)
        new = copy.copy(self)
        Guards.__init__(new, [copy.deepcopy(g, memo) if any(_watches(g, p) for p in asked) else g for g in self.guards])
        return new

    def before_request(self, s: RunState) -> Stop | None:
        return _first(self._before_request, s)

    def on_reply(self, s: RunState, calls: list[CheckedCall]) -> None:
        for phase in self._on_reply:
            phase(s, calls)

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Any:
        """A Stop, a ToolResult, None, or (when a guard's decision waits) an awaitable of one."""
        phases = self._before_execution
        for i, phase in enumerate(phases):
            if x := phase(s, c, reuse):
                return _then(x, phases[i + 1:], s, c, reuse) if inspect.isawaitable(x) else x
        return None

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> Stop | None:
        return _first(self._after_execution, s, c, r)

    def after_turn(self, s: RunState, results: list[ToolResult]) -> Stop | None:
        return _first(self._after_turn, s, results)


def _first(phases: tuple[Any, ...], *args: Any) -> Any:
    for phase in phases:
        if x := phase(*args):
            return x
    return None


async def _then(pending: Any, rest: tuple[Any, ...], *args: Any) -> Any:
    """The first guard's awaited decision, then the guards after it, awaiting as they ask."""
    if x := await pending:
        return x
    for phase in rest:
        if (x := phase(*args)) and inspect.isawaitable(x):
            x = await x
        if x:
            return x
    return None


def _watching(guards: tuple[Guard, ...], phase: str) -> tuple[Any, ...]:
    """The guards' bound `phase` methods, leaving out those that inherit Guard's allow-all one."""
    return tuple(getattr(g, phase) for g in guards if _watches(g, phase))


def _watches(g: Guard, phase: str) -> bool:
    """Whether `g` has a `phase` of its own (not Guard's allow-all one)."""
    return getattr(getattr(g, phase), "__func__", None) is not getattr(Guard, phase)


def default_guards(limits: Any, extra: list[Guard] | None = None, gate: Guard | None = None) -> Guards:
    """The ring's guards in order; `gate` (the untrusted-content gate) refuses before a call counts."""
    return Guards([
        WallClock(limits.max_wall_seconds), StepLimit(limits.max_steps),
        PromptTokenLimit(limits.max_prompt_tokens, limits.context_window),
        CompletionTokenLimit(limits.max_completion_tokens),
        *([CostLimit(limits.max_cost_usd)] if getattr(limits, "max_cost_usd", None) is not None else []),
        RepeatedCall(limits.max_repeats), *([gate] if gate else []), ToolCallLimit(limits.max_tool_calls),
        ResultContract(), RepeatedResult(limits.max_identical_results),
        RepeatedCycle(limits.max_cycle_repeats), NoProgress(limits.no_progress),
        *(extra or []),
    ])
