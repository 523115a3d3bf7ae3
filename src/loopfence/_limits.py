"""Limits (frozen config, None = unlimited), the run policy, and the Ledger (running counts)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ._keywords import keywords_checked

__all__ = ["Limits", "Policy", "Ledger", "LedgerSnapshot", "parse_limit"]


def _fields_of(obj: Any) -> dict[str, Any]:
    """A flat dataclass's fields as a dict (its values are scalars: no deep copy, unlike asdict)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@keywords_checked
@dataclass(frozen=True, slots=True)
class Limits:
    """Every budget and repetition rule of a run. `None` means unlimited; there is no magic 0.

    Checked when built (the constructor, `replace`, `from_json` and `--limit` alike): a count is a
    whole number >= 0 (a whole float such as `5.0` is taken as `5`), a duration or a dollar amount a
    finite number >= 0, `no_progress` a bool; anything else raises `ValueError` naming the field and
    the value (`Limits(max_steps="5")`: "limit max_steps must be a number or None, got '5'").
    """

    max_steps: int | None = 12
    max_tool_calls: int | None = 24
    max_prompt_tokens: int | None = 60_000
    max_completion_tokens: int | None = 8_000
    max_tokens_per_request: int | None = 4_096  # the `max_tokens` every request carries, at most
    max_wall_seconds: float | None = 900.0
    tool_timeout_s: float | None = 30.0
    max_repeats: int | None = 3  # replies asking for one call with nothing changed in between
    max_identical_results: int | None = 5  # executed results in a row with one fingerprint
    max_cycle_repeats: int | None = 3  # a block of 2-3 calls back this many times, identical results
    no_progress: bool = True
    context_window: int | None = None
    # dollars: spent + the next prompt's estimate + its reserved max_tokens, at the model's price
    # (genai-prices, or the run's `prices=`), must fit before each request is sent
    max_cost_usd: float | None = None
    # the most tokens the last answer may generate (Policy(last_answer=True)): its own reservation,
    # which must still fit max_completion_tokens and max_cost_usd; None: the usual per-request bound
    last_answer_tokens: int | None = 512

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # frozen: the checked value is set in place of the given one
            object.__setattr__(self, f.name, _coerce(f.name, getattr(self, f.name)))

    def replace(self, **changes: Any) -> Limits:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return _fields_of(self)

    def left_after(self, *spent: LedgerSnapshot) -> Limits:
        """These limits less what earlier runs spent (their `result.ledger`): a whole conversation's
        budget, each turn run with what is left (`limits=limits.left_after(*ledgers)`). The run-wide
        budgets shrink (steps, tool calls, prompt and completion tokens, seconds, dollars), never
        below 0 (a budget spent stops the next turn at once, naming it); per-request caps and the
        repetition rules stay."""
        left = {name: getattr(self, name) for name in _SPENT}
        for ledger in spent:
            for name, used in _SPENT.items():
                if left[name] is not None:
                    left[name] = max(0, left[name] - (getattr(ledger, used) or 0))
        return dataclasses.replace(self, **left)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def coding(cls) -> Limits:
        """Sized for a coding agent (a SWE-bench-style task: read, edit, run the tests, many times).

        371 resolved SWE-bench runs needed a median of 34 model requests (p90 59, max 125), and each
        request resends a context that grows with the run, so the cumulative prompt budget is sized
        for that, not for a chat. Each value's reasoning: docs/limit-profiles.md.
        """
        return cls(**_PROFILES["coding"])

    @classmethod
    def chat(cls) -> Limits:
        """Sized for a tool-calling assistant in a conversation (tau-bench: 84 conversations needed a
        median of 9 model requests, p90 17). Each value's reasoning: docs/limit-profiles.md."""
        return cls(**_PROFILES["chat"])

    @classmethod
    def profile(cls, name: str) -> Limits:
        """The limits a profile names: `default` (`Limits()`), `coding` or `chat`; another name raises
        `ValueError` listing the valid ones."""
        if name not in _PROFILES:
            raise ValueError(f"unknown limit profile {name!r} (known: {', '.join(_PROFILES)})")
        return cls(**_PROFILES[name])

    @classmethod
    def profiles(cls) -> tuple[str, ...]:
        """The profile names `profile()` and `--limits NAME` take."""
        return tuple(_PROFILES)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Limits:
        unknown = sorted(set(data) - set(cls.names()))
        if unknown:
            raise ValueError(f"unknown limit {unknown[0]!r} (known: {', '.join(cls.names())})")
        return cls(**data)  # checked by __post_init__


# Named profiles: only what differs from the defaults (the repetition rules, context_window,
# max_cost_usd and last_answer_tokens stay as they are). The reasoning for each value, from the
# recorded real runs in tests/data/real-runs/, is in docs/limit-profiles.md; tests check they agree.
_PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "coding": {"max_steps": 150, "max_tool_calls": 300, "max_prompt_tokens": 8_000_000,
               "max_completion_tokens": 250_000, "max_tokens_per_request": 8_192,
               "max_wall_seconds": 3_600.0, "tool_timeout_s": 120.0},
    "chat": {"max_steps": 30, "max_tool_calls": 60, "max_prompt_tokens": 250_000,
             "max_completion_tokens": 20_000},
}

# The run-wide budgets `left_after` shrinks, and the ledger's count of what a run spent of each.
_SPENT = {"max_steps": "model_requests", "max_tool_calls": "tool_calls", "max_prompt_tokens": "prompt_tokens",
          "max_completion_tokens": "completion_tokens", "max_wall_seconds": "elapsed_s",
          "max_cost_usd": "cost_usd"}

_INT = {"max_steps", "max_tool_calls", "max_prompt_tokens", "max_completion_tokens",
        "max_tokens_per_request", "max_repeats", "max_identical_results", "max_cycle_repeats", "context_window",
        "last_answer_tokens"}
_FLOAT = {"max_wall_seconds", "tool_timeout_s", "max_cost_usd"}


def _coerce(name: str, value: Any) -> Any:
    if name == "no_progress":
        if isinstance(value, bool):
            return value
        raise ValueError(f"limit no_progress must be true or false (a bool), got {value!r}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"limit {name} must be a number or None (null: unlimited), got {value!r}")
    if not math.isfinite(value):  # 1e400 parses as inf; use null (or none) for unlimited
        raise ValueError(f"limit {name} must be a finite number (null for unlimited), got {value!r}")
    if value < 0:
        raise ValueError(f"limit {name} must be >= 0, got {value!r}")
    if name in _INT:
        if int(value) != value:
            raise ValueError(f"limit {name} must be a whole number, got {value!r}")
        if name in ("max_tokens_per_request", "last_answer_tokens") and value < 1:
            raise ValueError(f"limit {name} must be at least 1 (a request may generate "
                             f"nothing otherwise), or null for no cap of its own; got {value!r}")
        if name == "max_cycle_repeats" and value < 2:
            raise ValueError(f"limit max_cycle_repeats must be at least 2 (a block seen once is not a "
                             f"cycle), or null to turn cycle detection off; got {value!r}")
        return int(value)
    return float(value)


def parse_limit(text: str) -> tuple[str, Any]:
    """`NAME=VALUE` from the command line: numbers, `none`/`null` (unlimited), `on`/`off`."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--limit expects NAME=VALUE, got {text!r}")
    if name not in Limits.names():
        raise ValueError(f"unknown limit {name!r} (known: {', '.join(Limits.names())})")
    low = raw.strip().lower()
    value: Any
    if low in ("none", "null", "unlimited"):
        value = None
    elif low in ("on", "true", "yes"):
        value = True
    elif low in ("off", "false", "no"):
        value = False
    else:
        try:
            value = float(low) if any(c in low for c in ".e") else int(low)
        except ValueError:
            raise ValueError(f"--limit {name}: {raw!r} is not a number, none, on or off") from None
    return name, _coerce(name, value)


@keywords_checked
@dataclass(frozen=True, slots=True)
class Policy:
    """What to do with a bad call: stop (fail closed) or tell the model and go on; and what counts as
    asking for a call again (max_repeats): `repeat_scope="change"` (default) counts the replies asking
    for it since another call changed the world (an executed side-effecting call with a different
    canonical key), so the same test after an edit is a new question; `"run"` counts over the whole run.

    `nudge=True`: the run's first repetition stop (repeated_call, repeated_result, no_progress) is
    replaced by one message telling the model exactly what happened, and the run goes on; the next
    one ends it. `last_answer=True`: a run that stops for max_steps, max_tool_calls,
    max_wall_seconds (with time left), no_progress or a repetition makes one more request with
    tools disabled for the best answer from what is known (`RunResult.last_answer`; the verdict
    stays KILL). Both off by default.

    Checked when built, as `Limits` is: a value outside its field's choices raises `ValueError`
    naming the field (`Policy(on_bad_call="ignore")`: "policy on_bad_call must be 'fail' or
    'feedback', got 'ignore'").
    """

    on_bad_call: Literal["fail", "feedback"] = "fail"
    max_bad_calls: int | None = 2
    repeat_scope: Literal["change", "run"] = "change"
    nudge: bool = False
    last_answer: bool = False

    def __post_init__(self) -> None:
        if self.on_bad_call not in ("fail", "feedback"):
            raise ValueError(f"policy on_bad_call must be 'fail' or 'feedback', got {self.on_bad_call!r}")
        mbc = self.max_bad_calls
        if mbc is not None and (isinstance(mbc, bool) or not isinstance(mbc, int) or mbc < 1):
            raise ValueError(f"policy max_bad_calls must be a positive integer or None/null (unlimited), got {mbc!r}")
        if self.repeat_scope not in ("change", "run"):
            raise ValueError(f"policy repeat_scope must be 'change' or 'run', got {self.repeat_scope!r}")
        for name in ("nudge", "last_answer"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"policy {name} must be true or false (a bool), got {getattr(self, name)!r}")

    def to_json(self) -> dict[str, Any]:
        """As the log header records it; `nudge` and `last_answer` only when on (a header without
        them reads as off, as every log written before they existed)."""
        out = _fields_of(self)
        for flag in ("nudge", "last_answer"):
            if not out[flag]:
                del out[flag]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        unknown = sorted(set(data) - {"on_bad_call", "max_bad_calls", "repeat_scope", "nudge", "last_answer"})
        if unknown:
            raise ValueError(f"unknown policy key {unknown[0]!r}")
        return cls(**data)  # checked by __post_init__


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """The ledger frozen at the stop (`RunResult.ledger`, the stop line's `ledger`): requests, calls
    requested, executions, reuses, refusals, rejections, tokens, seconds, and dollars and nudges
    where the run had them."""

    model_requests: int
    tool_calls: int
    tool_executions: int
    reused: int
    refused: int
    rejected: int
    prompt_tokens: int
    completion_tokens: int
    elapsed_s: float
    cost_usd: float | None = None  # dollars, where the run had a price (a cost budget or a price table)
    nudges: int = 0  # repetition stops replaced by a nudge (Policy(nudge=True))

    def to_json(self) -> dict[str, Any]:
        """The stop line's ledger; `cost_usd` only where the run was priced, `nudges` only where
        one was given (logs written before either existed read the same)."""
        out = _fields_of(self)
        if self.cost_usd is None:
            del out["cost_usd"]
        if not self.nudges:
            del out["nudges"]
        return out


@dataclass(slots=True)
class Ledger:
    """What actually happened. Executions count per call, never per message."""

    model_requests: int = 0
    tool_calls: int = 0  # calls requested by the model
    tool_executions: int = 0  # calls that really ran
    reused: int = 0  # answered from the read-only cache
    refused: int = 0  # a guard or gate said no
    rejected: int = 0  # contract violations
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    per_step: list[tuple[int, int]] = field(default_factory=list)  # (prompt, completion) per reply
    cost_usd: float | None = None  # dollars (None: the run has no price); each reply's cost added
    nudges: int = 0

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(
            self.model_requests, self.tool_calls, self.tool_executions, self.reused, self.refused,
            self.rejected, self.prompt_tokens, self.completion_tokens, round(self.elapsed_s, 6),
            None if self.cost_usd is None else round(self.cost_usd, 9), self.nudges,
        )
