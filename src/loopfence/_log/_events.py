"""Typed views of run-log events, parsed once at the edge (the reader) with the line models of
_log/_schema.py; errors name file and line.

Each view keeps `raw` (the record as read) so replay can compare whole events, and `line` (1-based)
so every later error can point at the line it is about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .._messages import Reply, ReplyFormatError, Usage
from .._stops import StopReason, Verdict
from ..tools._executor import ToolResult
from ..tools._registry import ToolKind
from ._schema import (CallLine, Decision, HeaderLine, ReplyLine, RequestLine, ResultLine, StopLine,
                      parse_line)

__all__ = ["LogError", "Event", "Header", "ToolSpec", "RequestEvent", "ReplyEvent", "CallEvent",
           "ResultEvent", "StopEvent", "OtherEvent", "parse_event"]


class LogError(ValueError):
    """A run log that cannot be used: the message names the file and the line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


def _problem(kind: str, exc: ValidationError) -> str:
    """The first thing wrong with a record, in words: "field 'ok' must be a boolean"."""
    err = exc.errors(include_url=False)[0]
    loc = [str(x) for x in err["loc"][1:]]  # [0] is the union's tag
    where = loc[0] + "".join(f"[{x}]" if x.isdigit() else f".{x}" for x in loc[1:]) if loc else "the line"
    typ, value = err["type"], err.get("input")
    if typ == "missing":
        return f"{kind} event: missing field {where!r}"
    if typ == "extra_forbidden":
        return f"{kind} event: unknown field {where!r}"
    if typ in ("enum", "literal_error"):
        name = "decision" if loc and loc[-1] in ("decision", "result") else loc[-1] if loc else "value"
        return f"{kind} event: unknown {name} {value!r} (field {where!r}; {err['msg'].lower()})"
    if typ in _TYPES:
        got = "a boolean" if isinstance(value, bool) else "null" if value is None else type(value).__name__
        return f"{kind} event: field {where!r} must be {_TYPES[typ]}, got {got}"
    return f"{kind} event: field {where!r}: {err['msg']}"


_TYPES = {"bool_type": "a boolean", "int_type": "an integer", "float_type": "a number",
          "string_type": "a string", "dict_type": "an object", "list_type": "an array",
          "model_type": "an object", "too_short": "[prompt, completion] integers",
          "too_long": "[prompt, completion] integers"}


@dataclass(frozen=True, slots=True)
class Event:
    """Common part of every event."""

    kind: str
    line: int
    seq: int
    t: float
    raw: dict[str, Any] = field(repr=False)

    @property
    def event(self) -> str:
        """The event's kind, under the name its line and the live events (`stream()`, `on_event`) use."""
        return self.kind


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    kind: ToolKind
    untrusted: bool
    signature: bool = False  # a function's signature validated its arguments (pydantic's messages)

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True, slots=True)
class Header(Event):
    run_id: str
    started_at: str
    task: str
    system: str | None
    limits: dict[str, Any]
    policy: dict[str, Any]
    params: dict[str, Any]
    tools: tuple[ToolSpec, ...]
    model: dict[str, Any]
    workspace: str | None


@dataclass(frozen=True, slots=True)
class RequestEvent(Event):
    step: int
    fingerprint: str
    prompt_estimate: int


@dataclass(frozen=True, slots=True)
class ReplyEvent(Event):
    step: int
    complete: bool
    problem: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    reported: bool
    path: str = field(repr=False, default="")

    def reply(self) -> Reply:
        """The reply as the ring received it, rebuilt from the recorded raw response."""
        raw = self.raw.get("raw")
        try:
            return Reply.from_response(raw, complete=self.complete, problem=self.problem)
        except ReplyFormatError as exc:
            if self.complete:
                raise LogError(self.path, self.line, f"reply event: the recorded raw response cannot be "
                               f"rebuilt into a reply ({exc})") from None
        # an incomplete stream may have no readable body: keep what the ledger needs
        usage = Usage(self.prompt_tokens if self.reported else None, self.completion_tokens)
        return Reply(None, (), self.finish_reason, usage, raw if isinstance(raw, dict) else {},
                     False, self.problem)


@dataclass(frozen=True, slots=True)
class CallEvent(Event):
    step: int
    tool_call_id: str
    name: str
    key: str | None
    decision: Decision
    intent: bool


@dataclass(frozen=True, slots=True)
class ResultEvent(Event):
    step: int
    tool_call_id: str
    name: str
    decision: Decision
    ok: bool
    error: str | None
    fingerprint: str
    duration_s: float
    untrusted: bool
    content: str

    def tool_result(self, violation: str | None = None) -> ToolResult:
        return ToolResult(self.content, self.ok, self.decision, self.duration_s, self.error, violation,
                          self.untrusted)


@dataclass(frozen=True, slots=True)
class StopEvent(Event):
    reason: StopReason
    detail: str
    data: dict[str, Any]
    verdict: Verdict
    final_answer: str | None
    partial_text: str | None
    ledger: dict[str, Any]
    per_step: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class OtherEvent(Event):
    """gate, resume, and kinds added later: kept whole, compared whole."""


def parse_event(path: str, line: int, record: dict[str, Any]) -> Event:
    """One record (already JSON) -> its typed view, checked by its model (_log/_schema.py).
    The kind must be known (checked by the reader)."""
    kind = record["event"]
    try:
        m = parse_line(record)
    except ValidationError as exc:
        raise LogError(path, line, _problem(kind, exc)) from None
    base = (kind, line, m.seq, m.t, record)
    if isinstance(m, HeaderLine):
        return _header(path, line, m, base)
    if isinstance(m, RequestLine):
        return RequestEvent(*base, m.step, m.fingerprint, m.prompt_estimate)
    if isinstance(m, ReplyLine):
        u = m.usage
        return ReplyEvent(*base, m.step, m.complete, m.problem, m.finish_reason, u.prompt_tokens,
                          u.completion_tokens, u.reported, path)
    if isinstance(m, CallLine):
        return CallEvent(*base, m.step, m.tool_call_id, m.name, m.key, m.decision, m.intent)
    if isinstance(m, ResultLine):
        return ResultEvent(*base, m.step, m.tool_call_id, m.name, m.decision, m.ok, m.error,
                           m.fingerprint, m.duration_s, m.untrusted, m.content)
    if isinstance(m, StopLine):
        return StopEvent(*base, m.reason, m.detail, m.data, m.verdict, m.final_answer, m.partial_text,
                         m.ledger, tuple((p[0], p[1]) for p in m.per_step))
    return OtherEvent(*base)


def _header(path: str, line: int, m: HeaderLine, base: tuple[Any, ...]) -> Header:
    specs = []
    for i, item in enumerate(m.tools):
        fn = item.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise LogError(path, line, f"header event: tools[{i}] is not an OpenAI tools[] entry with a "
                           "function name")
        try:
            kind = ToolKind(item.get("kind", "side_effect"))
        except ValueError:
            raise LogError(path, line, f"header event: tools[{i}]: unknown kind {item.get('kind')!r}") from None
        params = fn.get("parameters")
        specs.append(ToolSpec(fn["name"], str(fn.get("description") or ""),
                              params if isinstance(params, dict) else {"type": "object"}, kind,
                              bool(item.get("untrusted", False)), item.get("arguments") == "signature"))
    return Header(*base, m.run_id, m.started_at, m.task, m.system, m.limits, m.policy, m.params,
                  tuple(specs), m.model, m.workspace)
