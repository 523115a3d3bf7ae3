"""Typed views of run-log events, parsed once at the edge (the reader); errors name file and line.

Each view keeps `raw` (the record as read) so replay can compare whole events, and `line` (1-based)
so every later error can point at the line it is about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._messages import Reply, ReplyFormatError, Usage
from ..tools._executor import ToolResult
from ..tools._registry import ToolKind

__all__ = ["LogError", "Event", "Header", "ToolSpec", "RequestEvent", "ReplyEvent", "CallEvent",
           "ResultEvent", "StopEvent", "OtherEvent", "parse_event"]


class LogError(ValueError):
    """A run log that cannot be used: the message names the file and the line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


class _Fields:
    """Typed field access on one record; a wrong or missing field raises LogError at that line."""

    def __init__(self, path: str, line: int, kind: str, record: dict[str, Any]) -> None:
        self.path, self.line, self.kind, self.record = path, line, kind, record

    def fail(self, message: str) -> LogError:
        return LogError(self.path, self.line, f"{self.kind} event: {message}")

    def get(self, name: str, types: type | tuple[type, ...], *, optional: bool = False,
            default: Any = None) -> Any:
        if name not in self.record or self.record[name] is None:
            if optional:
                return default
            raise self.fail(f"missing field {name!r}")
        value = self.record[name]
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise self.fail(f"field {name!r} must be {_names(types)}, got a boolean")
        if not isinstance(value, types):
            raise self.fail(f"field {name!r} must be {_names(types)}, got {type(value).__name__}")
        return value


def _names(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join({"str": "a string", "int": "an integer", "float": "a number", "dict": "an object",
                        "list": "an array", "bool": "a boolean"}.get(t.__name__, t.__name__) for t in ts)


@dataclass(frozen=True, slots=True)
class Event:
    """Common part of every event."""

    kind: str
    line: int
    seq: int
    t: float
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    kind: ToolKind
    untrusted: bool

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
    decision: str
    intent: bool


@dataclass(frozen=True, slots=True)
class ResultEvent(Event):
    step: int
    tool_call_id: str
    name: str
    decision: str
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
    reason: str
    detail: str
    data: dict[str, Any]
    verdict: str
    final_answer: str | None
    partial_text: str | None
    ledger: dict[str, Any]
    per_step: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class OtherEvent(Event):
    """gate, resume, and kinds added later: kept whole, compared whole."""


_DECISIONS = ("executed", "reused", "refused", "rejected")


def parse_event(path: str, line: int, record: dict[str, Any]) -> Event:
    """One record (already JSON) -> its typed view. The kind must be known (checked by the reader)."""
    kind = record["event"]
    f = _Fields(path, line, kind, record)
    seq = f.get("seq", int)
    t = float(f.get("t", (int, float)))
    base = (kind, line, seq, t, record)
    if kind == "header":
        return _header(f, base)
    if kind == "request":
        return RequestEvent(*base, f.get("step", int), f.get("fingerprint", str),
                            f.get("prompt_estimate", int, optional=True, default=0))
    if kind == "reply":
        usage = f.get("usage", dict)
        u = _Fields(path, line, "reply usage", usage)
        return ReplyEvent(*base, f.get("step", int), f.get("complete", bool),
                          f.get("problem", str, optional=True, default=""),
                          f.get("finish_reason", str, optional=True),
                          u.get("prompt_tokens", int), u.get("completion_tokens", int),
                          u.get("reported", bool, optional=True, default=False), path)
    if kind == "call":
        decision = f.get("decision", str)
        if decision not in _DECISIONS:
            raise f.fail(f"unknown decision {decision!r}")
        return CallEvent(*base, f.get("step", int), f.get("tool_call_id", str), f.get("name", str),
                         f.get("key", str, optional=True), decision,
                         f.get("intent", bool, optional=True, default=False))
    if kind == "result":
        decision = f.get("decision", str)
        if decision not in _DECISIONS:
            raise f.fail(f"unknown decision {decision!r}")
        return ResultEvent(*base, f.get("step", int), f.get("tool_call_id", str), f.get("name", str),
                           decision, f.get("ok", bool), f.get("error", str, optional=True),
                           f.get("fingerprint", str),
                           float(f.get("duration_s", (int, float), optional=True, default=0.0)),
                           f.get("untrusted", bool, optional=True, default=False),
                           f.get("content", str))
    if kind == "stop":
        per_step = f.get("per_step", list, optional=True, default=[])
        pairs = []
        for i, p in enumerate(per_step):
            if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p)):
                raise f.fail(f"per_step[{i}] must be [prompt, completion] integers")
            pairs.append((p[0], p[1]))
        return StopEvent(*base, f.get("reason", str), f.get("detail", str, optional=True, default=""),
                         f.get("data", dict, optional=True, default={}), f.get("verdict", str),
                         f.get("final_answer", str, optional=True),
                         f.get("partial_text", str, optional=True), f.get("ledger", dict), tuple(pairs))
    return OtherEvent(*base)


def _header(f: _Fields, base: tuple[Any, ...]) -> Header:
    specs = []
    for i, item in enumerate(f.get("tools", list)):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise f.fail(f"tools[{i}] is not an OpenAI tools[] entry with a function name")
        try:
            kind = ToolKind(item.get("kind", "side_effect"))
        except ValueError:
            raise f.fail(f"tools[{i}]: unknown kind {item.get('kind')!r}") from None
        params = fn.get("parameters")
        specs.append(ToolSpec(fn["name"], str(fn.get("description") or ""),
                              params if isinstance(params, dict) else {"type": "object"}, kind,
                              bool(item.get("untrusted", False))))
    return Header(*base, f.get("run_id", str), f.get("started_at", str), f.get("task", str),
                  f.get("system", str, optional=True), f.get("limits", dict), f.get("policy", dict),
                  f.get("params", dict, optional=True, default={}), tuple(specs),
                  f.get("model", dict, optional=True, default={}),
                  f.get("workspace", str, optional=True))
