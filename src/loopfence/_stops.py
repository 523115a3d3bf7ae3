"""Stops: one closed vocabulary, values at the edge.

StopReason is the vocabulary; Stop is one stop with its detail; RunResult is what a run returns.
Inside the package a stop may travel as StopError (an exception); it never leaves `run()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typing only: this module imports nothing of the package at run time
    from ._limits import LedgerSnapshot

__all__ = ["StopReason", "Stop", "StopError", "Verdict", "RunResult", "left_by_client"]


class StopReason(StrEnum):
    """Why a run ended: the closed vocabulary. Only `final_answer` is a SHIP; every other reason is a
    KILL. A custom guard stops with `guard` (its name in the stop's data: `Guard.stop(...)`)."""

    FINAL_ANSWER = "final_answer"
    EMPTY_ANSWER = "empty_answer"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_PROMPT_TOKENS = "max_prompt_tokens"
    MAX_COMPLETION_TOKENS = "max_completion_tokens"
    MAX_WALL_SECONDS = "max_wall_seconds"
    MAX_COST_USD = "max_cost_usd"
    REPEATED_CALL = "repeated_call"
    REPEATED_RESULT = "repeated_result"
    NO_PROGRESS = "no_progress"
    INCOMPLETE_STREAM = "incomplete_stream"
    INVALID_JSON = "invalid_json"
    SCHEMA_MISMATCH = "schema_mismatch"
    UNKNOWN_TOOL = "unknown_tool"
    CONTEXT_OVERFLOW = "context_overflow"
    ENDPOINT_ERROR = "endpoint_error"
    CANCELLED = "cancelled"
    # a fenced framework's own limit ended its run (pydantic-ai's request_limit, the Agents SDK's
    # max_turns, LangGraph's recursion_limit): data {"framework", "name", "limit"} name it and its value
    FRAMEWORK_LIMIT = "framework_limit"
    # the final answer failed the answer contract (`answer=`) after its retries: data {"error", "limit"
    # (answer_retries), "value" (answers rejected)}
    ANSWER_REJECTED = "answer_rejected"
    GUARD = "guard"  # a custom guard's own rule: data["guard"] names the guard (Guard.stop)
    INTERNAL_ERROR = "internal_error"  # a bug inside loopfence (or a guard): the traceback is in the data


class Verdict(StrEnum):
    """A run's verdict: SHIP (it ended with a final answer) or KILL (anything else)."""

    SHIP = "SHIP"
    KILL = "KILL"


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a run ended: a reason from the vocabulary and a human-readable detail."""

    reason: StopReason
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return Verdict.SHIP if self.reason is StopReason.FINAL_ANSWER else Verdict.KILL

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": str(self.reason), "detail": self.detail}
        if self.data:
            out["data"] = self.data
        return out


class StopError(Exception):
    """A stop raised deep inside (a model adapter, an executor); the ring turns it into a value."""

    def __init__(self, reason: StopReason, detail: str = "", **data: Any) -> None:
        super().__init__(f"{reason}: {detail}")
        self.stop = Stop(StopReason(reason), detail, data)


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `run()` returns. Never raised, always complete."""

    stop: Stop
    final_answer: str | None
    ledger: LedgerSnapshot  # what the run spent and did, frozen at the stop
    messages: tuple[dict[str, Any], ...]  # the whole conversation, system and task first
    log_path: str | None = None
    partial_text: str | None = None
    cpu_s: float | None = None  # CPU seconds of the ring's own code and of its blocking operations' worker threads
    # Policy(last_answer=True): the answer the model gave, tools disabled, after the run stopped for a
    # budget or a repetition. Never a final answer: the verdict stays KILL and the reason stays.
    last_answer: str | None = None
    # the accepted final answer as the answer contract typed it (`answer=`: the pydantic model's
    # instance, a JSON schema's parsed JSON); with no contract, or a function's, the answer's text
    output: Any = None

    @property
    def reason(self) -> StopReason:
        return self.stop.reason

    @property
    def verdict(self) -> Verdict:
        return self.stop.verdict


def left_by_client(reason: str, data: Any) -> bool:
    """A run its client ended with calls still open (the proxy: nothing more came, the last reply is
    the answer): `final_answer` whose data lists the calls with no result recorded (`unanswered`).
    Replay and reconcile take it, like a framework's own limit, from outside the ring."""
    return reason == StopReason.FINAL_ANSWER and isinstance(data, dict) and isinstance(data.get("unanswered"), list)
