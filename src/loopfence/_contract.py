"""The contract: a reply's calls execute only if the reply completed and every call is well-formed.

check(reply, registry, max_tokens) -> ContractResult: the reply-level problem (incomplete) and, per
call, either a CheckedCall (tool, bound arguments, canonical key) or a Violation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._json import JsonLimitError, canonical_json, check_depth, loads_object
from ._messages import Reply, ToolCall
from ._stops import StopReason
from .tools._registry import ArgumentError, Registry, Tool

__all__ = ["CheckedCall", "Violation", "ContractResult", "check_reply", "canonical_key",
           "requested_max_tokens", "MAX_ARGUMENT_DEPTH"]

MAX_ARGUMENT_DEPTH = 64  # nesting levels of one call's arguments


@dataclass(frozen=True, slots=True)
class CheckedCall:
    """A tool call that passed the contract: the model's `call`, the registered `tool` it names, its
    arguments parsed, checked against the tool's schema and bound to its signature with defaults
    applied (`args`), and its canonical key (`key`: the name and the canonical bound arguments, one
    key for every spelling of the same call). What guards see before a call runs."""

    call: ToolCall
    tool: Tool
    args: dict[str, Any]  # bound to the signature, defaults applied
    key: str  # canonical key: name + canonical bound arguments


@dataclass(frozen=True, slots=True)
class Violation:
    call: ToolCall | None
    reason: StopReason
    detail: str

    def feedback(self) -> dict[str, Any]:
        """The structured result the model receives under on_bad_call='feedback'."""
        return {"ok": False, "error": str(self.reason), "message": self.detail,
                "hint": "fix the call and send it again; it was not executed"}


@dataclass(frozen=True, slots=True)
class ContractResult:
    incomplete: Violation | None
    items: tuple[CheckedCall | Violation, ...]

    @property
    def violations(self) -> list[Violation]:
        return [i for i in self.items if isinstance(i, Violation)]


def canonical_key(name: str, bound_args: dict[str, Any]) -> str:
    return f"{name}:{canonical_json(bound_args)}"


def requested_max_tokens(params: dict[str, Any]) -> int | None:
    """The completion cap a request asks for (`max_tokens`, or the newer `max_completion_tokens`).
    Only a positive integer is a cap (llama.cpp reads 0 or -1 as none): anything else is not, and
    the run's own bound (`RunState.max_tokens`) is sent in its place."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def _truncated(reply: Reply, max_tokens: int | None) -> str | None:
    if not reply.complete:
        return reply.problem or "the stream did not finish"
    if reply.finish_reason == "length":
        return "finish_reason is 'length': the reply was cut off"
    if reply.finish_reason == "content_filter":
        return "finish_reason is 'content_filter': the endpoint's filter withheld part of the reply"
    if max_tokens is not None and reply.usage and reply.usage.completion_tokens == max_tokens:
        return f"completion_tokens reached the requested cap ({max_tokens}): treated as truncated"
    return None


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, StopReason | None, str]:
    """Raw wire arguments -> (object, None, "") or (None, reason, why). None/'' mean no arguments."""
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return {}, None, ""
    try:
        if isinstance(raw, str):
            value = loads_object(raw, max_depth=MAX_ARGUMENT_DEPTH)
        else:
            check_depth(raw, MAX_ARGUMENT_DEPTH)
            value = raw
    except JsonLimitError as exc:
        return None, StopReason.SCHEMA_MISMATCH, f"arguments are over a limit: {exc.msg}"
    except ValueError as exc:
        return None, StopReason.INVALID_JSON, f"arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return None, StopReason.SCHEMA_MISMATCH, \
            f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None, ""


def check_call(call: ToolCall, registry: Registry) -> CheckedCall | Violation:
    t = registry.get(call.name)
    if t is None:
        known = ", ".join(registry.names()) or "none"
        return Violation(call, StopReason.UNKNOWN_TOOL,
                         f"unknown tool {call.name!r} (registered: {known})")
    args, reason, why = parse_arguments(call.arguments)
    if args is None or reason is not None:
        return Violation(call, reason or StopReason.SCHEMA_MISMATCH, f"{call.name}: {why}")
    try:
        bound = t.validate(args)
    except ArgumentError as exc:
        return Violation(call, StopReason.SCHEMA_MISMATCH, f"{call.name}: {exc}")
    return CheckedCall(call, t, bound, canonical_key(t.name, bound))


def check_reply(reply: Reply, registry: Registry, max_tokens: int | None = None) -> ContractResult:
    why = _truncated(reply, max_tokens)
    incomplete = Violation(None, StopReason.INCOMPLETE_STREAM, why) if why else None
    return ContractResult(incomplete, tuple(check_call(c, registry) for c in reply.tool_calls))
