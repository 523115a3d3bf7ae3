"""RunState: everything the ring and the guards read. Derived numbers are computed, not stored twice."""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ._compact import Compaction, ElidedAwareCache, OutgoingView
from ._contract import requested_max_tokens
from ._json import canonical_json
from ._limits import Ledger, Limits, Policy
from ._messages import Reply, Request, ToolCall
from ._prices import Price, PriceBook, PriceError
from ._tokens import TokenEstimator, text_units
from ._log._schema import GuardLine
from ._log._writer import RunLog
from .tools._executor import ResultCache, ToolResult
from .tools._registry import Registry, ToolKind

__all__ = ["RunState", "generated_text", "least_tokens", "LEAN_UNITS_PER_TOKEN"]

# A floor under a reported completion count: every reply in the recorded wire captures
# (tests/data/wire/) reported at most 5.6 text units per completion token, so an honest count is not
# below units / 8; a count far below it (6,418 tokens generated, 24 reported) is not honest.
LEAN_UNITS_PER_TOKEN = 8
_SPACES = re.compile(r"\s+")


def generated_text(reply: Reply) -> str:
    """What a reply generated itself: its text, and each call's name and arguments."""
    return (reply.content or "") + "".join(c.name + c.raw_arguments for c in reply.tool_calls)


def least_tokens(text: str) -> int:
    """A lean estimate of the tokens `text` took to generate (a run of whitespace counts as one
    space: one token can hold many): what a reported count is never below when it is honest."""
    return text_units(_SPACES.sub(" ", text)) // LEAN_UNITS_PER_TOKEN


@dataclass
class RunState:
    """Everything one run knows as it goes: its limits and policy, the tools, the conversation (and
    the outgoing view of it), the ledger, the read-only cache, the pending calls and the clock.
    Guards read it (see `Guard`); the ring alone changes it."""

    limits: Limits
    policy: Policy
    registry: Registry
    params: dict[str, Any] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    messages: list[dict[str, Any]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    estimator: TokenEstimator = field(default_factory=TokenEstimator)
    cache: ResultCache = None  # type: ignore[assignment]  # None: ElidedAwareCache over the view
    pending: list[ToolCall] = field(default_factory=list)  # requested calls still owed a result
    in_flight: ToolCall | None = None  # the call executing now (its intent is already logged)
    doing: str = "the run"  # what the ring awaits now (named by a max_wall_seconds stop)
    clock: Any = None  # the run's wall-clock scope (asyncio.Timeout) while the ring runs
    bad_streak: int = 0
    log: RunLog | None = None  # the run's log: guards and gates write their own (typed) events
    chain: str = ""  # running hash over the conversation: request fingerprints in O(1) per message
    compaction: Compaction = field(default_factory=Compaction)  # shapes the outgoing view only
    counts_tokens: bool = False  # the model counts prompts itself: the ring awaits its count (set_count)
    view: OutgoingView = field(init=False, repr=False)  # what is sent: messages, old results stubbed
    _estimate: tuple[tuple[Any, ...], int] = ((), 0)
    _count: tuple[int, int | None] = (-1, None)  # (view.version, the model's own count of that prompt)
    _sent: tuple[int, int] = (0, 0)  # (view.added, view.saved) when the last request was built
    _anchor: tuple[int, int, int] | None = None  # _sent at the last request with reported usage + its tokens
    _chars: int = 0
    _tools_units: int = 0
    _tools_fp: str = ""
    _last_prompt_units: int = 0
    charge_note: dict[str, Any] = field(default_factory=dict)  # the last reply's usage, beyond its counts
    # the cost budget: the run's price book (None: the run has no price, its cost is not counted) and
    # the price the next request is checked at (the start model's; then the last reply's model's)
    prices: PriceBook | None = None
    price: Price | None = None
    final_request: bool = False  # the last answer's request (Policy.last_answer): tools off, own reserve
    outcomes: dict[str, str] = field(default_factory=dict)  # canonical key -> its last result's outcome fingerprint
    nudge_note: str | None = None  # a nudge to send as a user message once the turn's results are in
    warning: tuple[Any, Any] | None = None  # (Stop, CheckedCall): a rule one result short of stopping (Policy.nudge)
    run_id: str | None = None  # the header's run_id; each request carries it (Request.run_id)
    # a reply cut at the run's own reservation stops max_completion_tokens (a log before version 4
    # named it incomplete_stream: its playback turns this off)
    names_reservation_cuts: bool = True
    # the model's own cap on a reply where a request sets none (the embedded model's max_tokens, from
    # the header's model; None: the model has none, or a log before version 6 that never named it)
    model_cap: int | None = None
    # the text streamed so far of the reply still awaited ({step: pieces}; emptied when a reply is
    # whole): a run stopped before its reply is whole keeps it as partial_text (playback: the log's)
    streamed: dict[int, list[str]] = field(default_factory=dict)
    answer: Any = None  # the answer contract (`_answer.AnswerContract`; playback: the recorded verdicts)
    answer_rejections: int = 0  # final answers it rejected so far
    output: Any = None  # the accepted answer as the contract typed it (RunResult.output)

    def __post_init__(self) -> None:
        tools = canonical_json(self.registry.schemas())
        self._tools_units = text_units(tools)
        self._tools_fp = hashlib.sha256(tools.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.view = OutgoingView(self.compaction, frozenset(
            t.name for t in self.registry if t.kind is ToolKind.READ_ONLY))
        if self.cache is None:
            self.cache = ElidedAwareCache(self.view)
        old, self.messages = self.messages, []
        for m in old:
            self.append(m)

    # -- clock -----------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def deadline(self) -> float | None:
        w = self.limits.max_wall_seconds
        return None if w is None else self.t0 + w

    def tool_timeout(self) -> float | None:
        """tool_timeout_s, never longer than what is left of max_wall_seconds."""
        timeout, wall = self.limits.tool_timeout_s, self.limits.max_wall_seconds
        if wall is None:
            return timeout
        left = max(0.0, wall - self.elapsed())
        return left if timeout is None or left < timeout else timeout

    # -- conversation ----------------------------------------------------------------------------
    def append(self, message: dict[str, Any]) -> int:
        """Add a message to the conversation; its size in `text_units`."""
        text = canonical_json(message)
        self._chars += len(text)
        self.chain = hashlib.sha256(f"{self.chain}\n{text}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.messages.append(message)
        units = text_units(text)
        self.view.add(message, units)
        return units

    def prompt_units(self) -> int:
        """Size of the outgoing prompt (after compaction) plus the tool schemas, in `text_units`."""
        return self.view.size + self._tools_units

    def needs_count(self) -> bool:
        """The model counts prompts and has not counted this one yet (the ring awaits `set_count`)."""
        return self.counts_tokens and self._count[0] != self.view.version

    def set_count(self, counted: Any) -> None:
        """The model's count of the outgoing prompt; anything but a positive int means no count."""
        ok = isinstance(counted, int) and not isinstance(counted, bool) and counted > 0
        self._count = (self.view.version, counted if ok else None)

    def next_prompt_estimate(self) -> int:
        """Tokens of the next (compacted) prompt: the model's own count when it gave one
        (`set_count`); else the last prompt the endpoint counted plus what came since (new content
        at a cautious ratio, elided content at the calibrated one); before any count, units over the
        ratio. Memoized per conversation version."""
        key = (self.view.version, self.estimator.chars_per_token, self._anchor)
        if self._estimate[0] == key:
            return self._estimate[1]
        counted = self._count[1] if self._count[0] == self.view.version else None
        value = counted if counted is not None else self._estimate_units()
        self._estimate = (key, value)
        return value

    def _estimate_units(self) -> int:
        if self._anchor is None:
            return self.estimator.estimate(self.prompt_units())
        added, saved, tokens = self._anchor
        new = self.estimator.cautious(self.view.added - added)
        gone = int((self.view.saved - saved) / self.estimator.chars_per_token)
        return max(1, tokens + new - gone)

    def request_fingerprint(self) -> str:
        return f"{self.chain}:{self._tools_fp}"

    def max_tokens(self) -> int | None:
        """The most tokens the next reply may generate: the smallest of what is left of
        max_completion_tokens, max_tokens_per_request and a `max_tokens` (or
        `max_completion_tokens`) in params; None when all three are unlimited. Never below 1 (0 or
        less reads as "no limit" to llama.cpp): with nothing left, the completion guard stops first."""
        caps = [self.limits.max_tokens_per_request, requested_max_tokens(self.params)]
        if self.final_request:
            caps.append(self.limits.last_answer_tokens)
        total = self.limits.max_completion_tokens
        if total is not None:
            caps.append(total - self.ledger.completion_tokens)
        known = [c for c in caps if c is not None]
        return max(1, min(known)) if known else None

    def set_prices(self, book: PriceBook | None, model: str | None, who: str = "the model") -> None:
        """The run's price book and the start price of `model` (the adapter's name for it). With a
        cost budget, an unknown price or an unbounded request is a PriceError, before anything is sent."""
        self.prices = book
        if book is None:
            return
        if self.limits.max_cost_usd is not None:
            self.price = book.require(model, who)
            if self.max_tokens() is None:
                raise PriceError("max_cost_usd needs every request's max_tokens bounded (its output is "
                                 "reserved at the output price): set max_tokens_per_request or "
                                 "max_completion_tokens, or a max_tokens param")
        else:
            self.price = book.price(model)
        self.ledger.cost_usd = 0.0 if self.price is not None else None

    def warn(self, stop: Any, call: Any) -> None:
        """A repetition rule one result short of its stop (Policy.nudge): the ring nudges at the turn's
        end, unless the run stops first. The first warning of a turn is kept."""
        if self.warning is None:
            self.warning = (stop, call)

    def last_answer_reserve(self) -> int | None:
        """The completion tokens the last answer reserves: the smallest of last_answer_tokens,
        max_tokens_per_request and a `max_tokens` in params (None: all unlimited)."""
        caps = [self.limits.last_answer_tokens, self.limits.max_tokens_per_request,
                requested_max_tokens(self.params)]
        known = [c for c in caps if c is not None]
        return min(known) if known else None

    def request(self) -> Request:
        self._last_prompt_units = self.prompt_units()
        self._sent = (self.view.added, self.view.saved)
        self.view.mark_sent()
        params = dict(self.params)
        if self.final_request:  # the last answer: tools disabled, whatever the params say
            params["tool_choice"] = "none"
        return Request(list(self.view.messages), self.registry.schemas(), params,
                       self.deadline(), self.ledger.model_requests + 1, self.max_tokens(), self.run_id)

    def charge(self, reply: Reply, prompt: int, completion: int) -> float | None:
        """The reply's cost at its model's price (the name the reply gives, else the run's price),
        added to the ledger; None when the run has no price."""
        if self.prices is None:
            return None
        name = reply.raw.get("model") if isinstance(reply.raw, dict) else None
        price = (self.prices.price(name, any_model=self.price is None)
                 if isinstance(name, str) and name else None) or self.price
        if price is None:
            return None
        self.price = price
        cost = price.cost(prompt, completion)
        self.ledger.cost_usd = round((self.ledger.cost_usd or 0.0) + cost, 9)
        return cost

    def remember(self, reply: Reply, estimate: int) -> tuple[int, int]:
        """Append the reply, count its tokens: an estimate where none was reported (0 completion
        tokens for a reply that generated nothing, e.g. an empty stream); where the reported
        completion count is below what the reply's own text takes at the least (`least_tokens`),
        that floor, noted in `charge_note` (the reply event's usage says so)."""
        units = self.append(reply.message())
        self.pending = list(reply.tool_calls)
        self.ledger.tool_calls += len(reply.tool_calls)
        usage = reply.usage
        prompt = usage.prompt_tokens if usage and usage.prompt_tokens is not None else estimate
        reported = usage.completion_tokens if usage else None
        self.charge_note = {}
        if reported is None:
            completion = self.estimator.estimate(units) if reply.content or reply.tool_calls else 0
        else:
            completion = max(reported, least_tokens(generated_text(reply)))
            if completion > reported:
                self.charge_note = {"charged": "estimate", "completion_reported": reported}
        if usage and usage.prompt_tokens:
            self.estimator.calibrate(self._last_prompt_units, usage.prompt_tokens)
            self._anchor = (*self._sent, usage.prompt_tokens)
        self.ledger.prompt_tokens += prompt
        self.ledger.completion_tokens += completion
        self.ledger.per_step.append((prompt, completion))
        cost = self.charge(reply, prompt, completion)
        if cost is not None:
            self.charge_note["cost_usd"] = cost
        return prompt, completion

    def note(self, guard: str, message: str, data: dict[str, Any] | None = None) -> None:
        """A guard's own `guard` event in the run's log (see `Guard.note`); nothing without a log."""
        if self.log is not None:
            self.log.write(GuardLine(step=self.ledger.model_requests, guard=guard, message=message, data=data or {}))

    def add_result(self, call: ToolCall, result: ToolResult) -> None:
        self.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
        if call in self.pending:
            self.pending.remove(call)
        counter = {"executed": "tool_executions", "reused": "reused", "refused": "refused",
                   "rejected": "rejected"}[result.decision]
        setattr(self.ledger, counter, getattr(self.ledger, counter) + 1)
