"""The run log's line types: one pydantic model per event kind, a union discriminated on `event`.

The writer's records, the reader's parsing, the live stream (`on_event=`) and the published JSON
Schema (`loopfence schema events`) all come from these models. Strict: a field of the wrong type,
an unknown decision or stop reason, or an unknown field (except in the header) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, Strict, TypeAdapter, ValidationError

from .. import _messages
from .._stops import StopReason, Verdict
from ..tools._executor import ToolResult
from ..tools._registry import ToolKind
from ._errors import LogError

__all__ = ["Decision", "GateDecision", "LogEvent", "HeaderLine", "RequestLine", "ReplyLine", "CallLine",
           "ResultLine", "GateLine", "ResumeLine", "RetryLine", "NudgeLine", "LastAnswerLine",
           "AnswerLine", "GuardLine", "StopLine", "Usage", "ToolSpec",
           "LOG_LINE",
           "FORMAT", "VERSION", "READS_VERSIONS", "EVENT_KINDS", "parse_line", "events_schema"]

FORMAT = "loopfence.runlog"
VERSION = 6  # 2: typed events, `retry` events; 3: `nudge`, `last_answer` and `guard` events; 4: large values
# stored once (_log/_large.py), `prompt_estimate`, a cut at the run's own reservation is max_completion_tokens;
# 5: the header's `messages` (a conversation continued), `answer` events and the header's `answer`;
# 6: a reply cut at the model's own cap (the header model's `max_tokens`) says so in its stop's detail
READS_VERSIONS = (1, 2, 3, 4, 5, 6)  # older logs read with the same models (they never hold the newer events)


class Decision(StrEnum):
    """What became of one requested tool call."""

    EXECUTED = "executed"
    REUSED = "reused"
    REFUSED = "refused"
    REJECTED = "rejected"


class GateDecision(StrEnum):
    """What the untrusted-content gate did."""

    ALLOWED = "allowed"  # a privileged call with no untrusted content in context
    APPROVED = "approved"
    REFUSED = "refused"
    TAINTED = "tainted"


_Enum = Strict(False)  # an enum field accepts its value as a string (records are JSON)
Obj = dict[str, Any]


def _stamped(schema: dict[str, Any]) -> None:
    """Every line has its kind, `seq` and `t` (the writer stamps the last two: a line as read must have them)."""
    schema["required"] = ["event", "seq", "t", *(k for k in schema.get("required", ()) if k not in STAMP)]


STAMP = ("event", "seq", "t")


class LogEvent(BaseModel):
    """Common part of every line: its kind, its 0-based line number, seconds since the run started.

    The ring builds these (`RequestLine(step=..., ...)`); the writer stamps `seq` and `t` and
    serialises them; the live stream (`on_event`), the console, OTel, the report, reconcile and
    replay read the same objects. Read back from a file, an event also knows its `line` (1-based)
    and its `record` (the JSON object as read), and the file (for the errors of `reply()` and `specs`)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, json_schema_extra=_stamped)

    event: str
    seq: int = Field(default=-1, ge=0)  # -1 until the writer stamps it; required in a line as read
    t: float = Field(default=0.0, ge=0, le=1e9, allow_inf_nan=False)  # seconds since the start (1e9: 31 years)
    _line: int = PrivateAttr(default=0)
    _record: dict[str, Any] | None = PrivateAttr(default=None)
    _path: str = PrivateAttr(default="")

    @property
    def line(self) -> int:
        """The 1-based line of the file it was read from (0: an event not read from a file)."""
        return self._line

    @property
    def record(self) -> dict[str, Any]:
        """The line as a JSON object: as read from the file, else as the writer wrote it."""
        return self._record if self._record is not None else self.model_dump(mode="json")

    def stamped(self, seq: int, t: float, record: dict[str, Any] | None = None, line: int = 0,
                path: str = "") -> Any:
        """This event as the line `seq` written at `t` (the writer), or read at `line` of `path` as `record`."""
        ev = self.model_copy(update={"seq": seq, "t": t})
        ev._line, ev._record, ev._path = line, record, path
        return ev


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool of the header, parsed (`HeaderLine.specs`): what replay and resume rebuild a tool from."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: ToolKind
    untrusted: bool
    signature: bool = False  # a function's signature validated its arguments (pydantic's messages)

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


class HeaderLine(LogEvent):
    model_config = ConfigDict(extra="allow")  # `header=` extras (workspace, drill, …)

    event: Literal["header"] = "header"
    format: Literal["loopfence.runlog"]
    version: int
    run_id: str
    started_at: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")  # ISO 8601, as the writer gives it
    task: str  # the task's text: a conversation's last (user) message
    system: str | None = None
    # a conversation continued (version 5): the messages the run started from, system first (absent:
    # a task, the run started from `system` and `task`)
    messages: list[Obj] | None = None
    limits: Obj
    policy: Obj
    params: Obj = {}
    tools: list[Obj]
    model: Obj = {}
    gate: Obj | None = None
    compaction: Obj | None = None
    tool_info: Obj | None = None
    workspace: str | None = None
    # a run with a cost budget or a price table: {"table": the user's {model: [in, out]} per MTok,
    # "model": the start model's name, "rates": [in, out, source]} (absent: the run had no price)
    prices: Obj | None = None
    # a run with an answer contract: {"kind": "model"|"schema"|"check", "name", "retries", "schema"?}
    answer: Obj | None = None

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """`tools` parsed; LogError naming the file, the line and tools[i] for an entry that is not one
        (the reader checks this once, so a header read back always has its specs)."""
        specs = []
        for i, item in enumerate(self.tools):
            fn = item.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise LogError(self._path, self.line, f"header event: tools[{i}] is not an OpenAI tools[] entry "
                               "with a function name")
            try:
                kind = ToolKind(item.get("kind", "side_effect"))
            except ValueError:
                raise LogError(self._path, self.line, f"header event: tools[{i}]: unknown kind "
                               f"{item.get('kind')!r}") from None
            params = fn.get("parameters")
            specs.append(ToolSpec(fn["name"], str(fn.get("description") or ""),
                                  params if isinstance(params, dict) else {"type": "object"}, kind,
                                  bool(item.get("untrusted", False)), item.get("arguments") == "signature"))
        return tuple(specs)


class RequestLine(LogEvent):
    event: Literal["request"] = "request"
    step: int
    fingerprint: str
    n_messages: int | None = None
    prompt_estimate: int = 0
    params: Obj | None = None


class Usage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    prompt_tokens: int
    completion_tokens: int  # what the ledger charged
    reported: bool = False
    # the endpoint reported fewer completion tokens than the reply's own text takes at the least:
    # the ledger charged that estimate ("estimate"); what was reported (absent in older logs)
    charged: Literal["estimate"] | None = None
    completion_reported: int | None = None
    cost_usd: float | None = None  # dollars charged (absent: the run had no price)


class ReplyLine(LogEvent):
    event: Literal["reply"] = "reply"
    step: int
    raw: Any = None  # the response as received (an object; anything for a broken stream)
    complete: bool
    problem: str = ""
    finish_reason: str | None = None
    usage: Usage
    duration_s: float | None = None

    def reply(self) -> _messages.Reply:
        """The reply as the ring received it, rebuilt from the recorded raw response."""
        try:
            return _messages.Reply.from_response(self.raw, complete=self.complete, problem=self.problem)
        except _messages.ReplyFormatError as exc:
            if self.complete:
                raise LogError(self._path, self.line, f"reply event: the recorded raw response cannot be "
                               f"rebuilt into a reply ({exc})") from None
        # an incomplete stream may have no readable body: keep what the ledger needs
        u = self.usage
        usage = _messages.Usage(u.prompt_tokens if u.reported else None, u.completion_tokens)
        return _messages.Reply(None, (), self.finish_reason, usage, self.raw if isinstance(self.raw, dict) else {},
                               False, self.problem)


class CallLine(LogEvent):
    event: Literal["call"] = "call"
    step: int
    tool_call_id: str
    name: str
    raw_arguments: str | None = None
    arguments: Obj | None = None
    key: str | None = None
    kind: str | None = None
    decision: Annotated[Decision, _Enum]
    intent: bool = False
    reason: str | None = None


class ResultLine(LogEvent):
    event: Literal["result"] = "result"
    step: int
    tool_call_id: str
    name: str
    decision: Annotated[Decision, _Enum]
    ok: bool
    error: str | None = None
    fingerprint: str
    duration_s: float = 0.0
    untrusted: bool = False
    content: str
    violation: str | None = None

    def tool_result(self, violation: str | None = None) -> ToolResult:
        """The result as the ring got it (`violation`: the recorded one the caller read off the log)."""
        return ToolResult(self.content, self.ok, self.decision, self.duration_s, self.error, violation,
                          self.untrusted)


class GateLine(LogEvent):
    event: Literal["gate"] = "gate"
    step: int
    tool_call_id: str | None = None
    name: str
    key: str | None = None
    decision: Annotated[GateDecision, _Enum]
    reason: str = ""
    source: str | None = None
    result: Annotated[Decision, _Enum] | None = None
    first: bool | None = None


class ResumeLine(LogEvent):
    event: Literal["resume"] = "resume"
    after_line: int
    elapsed_s: float
    step: int
    torn_bytes: int = 0
    pending_intent: Obj | None = None
    model: Obj = {}
    reopened: Obj | None = None  # {line, reason}: the endpoint_error/cancelled stop this run goes on past
    overrides: Obj | None = None  # {limits, model}: what the run goes on with instead of the header's


class RetryLine(LogEvent):
    """One failed HTTP attempt of a model request, retried after `wait_s` seconds."""

    event: Literal["retry"] = "retry"
    step: int
    attempt: int  # the attempt that failed (1-based); attempt + 1 comes next
    status: int | None = None  # the HTTP status, None for a connection error or a timeout
    wait_s: float
    reason: str


class NudgeLine(LogEvent):
    """Policy(nudge=True): the run's first repetition stop (`reason`, `detail`, `data`: the stop it
    replaced) became this message; `delivered` "refusal": the call (`tool_call_id`) was refused with
    it as its result; "message": it went to the model as a user message after the turn's results."""

    event: Literal["nudge"] = "nudge"
    step: int
    reason: Annotated[StopReason, _Enum]
    detail: str = ""
    data: Obj = {}
    tool_call_id: str | None = None
    key: str | None = None
    delivered: Literal["refusal", "message"]
    message: str


class LastAnswerLine(LogEvent):
    """Policy(last_answer=True), after the run stopped: the request for a last answer (tools
    disabled) was `asked` (its request and reply follow), `skipped` (`reason`: the budget that did
    not let it through), or `failed` (no answer: `reason` the stop its request met, or none)."""

    event: Literal["last_answer"] = "last_answer"
    step: int
    decision: Literal["asked", "skipped", "failed"]
    reason: Annotated[StopReason, _Enum] | None = None
    detail: str = ""
    max_tokens: int | None = None
    # skipped by a prompt budget: the prompt's tokens it judged by (absent in older logs)
    prompt_estimate: int | None = None


class AnswerLine(LogEvent):
    """The answer contract's verdict on a final answer (`answer=`): `accepted` (the stop follows), or
    `rejected` with its `error`; `message`: the feedback sent to the model as a user message (a retry
    was left; absent: none was, and the run stops `answer_rejected`). Replay and reconcile take the
    verdict as recorded."""

    event: Literal["answer"] = "answer"
    step: int
    decision: Literal["accepted", "rejected"]
    error: str | None = None
    message: str | None = None


class GuardLine(LogEvent):
    """What a guard said on its own (`Guard.note`): `guard` names it, `message` is its text, `data`
    its numbers. A note decides nothing: the run goes on, and reconcile's fold does not compare it."""

    event: Literal["guard"] = "guard"
    step: int
    guard: str
    message: str
    data: Obj = {}


class StopLine(LogEvent):
    event: Literal["stop"] = "stop"
    reason: Annotated[StopReason, _Enum]
    detail: str = ""
    data: Obj = {}
    verdict: Annotated[Verdict, _Enum]
    final_answer: str | None = None
    partial_text: str | None = None
    ledger: Obj
    per_step: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = []  # [prompt, completion]
    last_answer: str | None = None  # Policy(last_answer=True): the answer given after the stop (verdict stays KILL)


AnyLine = Annotated[HeaderLine | RequestLine | ReplyLine | CallLine | ResultLine | GateLine | ResumeLine
                    | RetryLine | NudgeLine | LastAnswerLine | AnswerLine | GuardLine | StopLine, Field(discriminator="event")]
LOG_LINE: TypeAdapter[AnyLine] = TypeAdapter(AnyLine)
EVENT_KINDS = ("header", "request", "reply", "call", "result", "gate", "resume", "retry", "nudge", "last_answer",
               "answer", "guard", "stop")


def parse_line(record: dict[str, Any]) -> LogEvent:
    """One record (JSON already parsed) -> its typed event; pydantic.ValidationError if it is not one
    (a line as read must carry its `seq` and `t`: the models default them only for the writer)."""
    missing = [{"type": "missing", "loc": (str(record.get("event")), k), "input": record}
               for k in ("seq", "t") if k not in record]
    if missing:
        raise ValidationError.from_exception_data("LogEvent", missing)  # type: ignore[arg-type]
    return LOG_LINE.validate_python(record)  # type: ignore[return-value]


def events_schema() -> dict[str, Any]:
    """The JSON Schema of one log line."""
    schema = LOG_LINE.json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"{FORMAT} line, version {VERSION}", **schema}
