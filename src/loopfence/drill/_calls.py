"""Every call the model requested, in order, with what the ring decided: read from the run log events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._json import canonical_json, loads, loads_object
from .._log._large import call_text
from .._log._schema import CallLine, LogEvent, ReplyLine, ResultLine
from .._messages import Reply, ReplyFormatError

__all__ = ["CallRecord", "calls_from_events"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call of a drill run as the decision table shows it: the tool, its arguments, what the
    fence decided (executed, reused, refused, rejected) and the result."""

    name: str
    arguments: Any  # bound arguments when the call was checked; else the parsed (or raw) arguments
    decision: str  # executed | reused | refused | rejected
    ok: bool | None  # was the result the model received a success
    error: str | None = None
    step: int = 0

    @property
    def canonical_arguments(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else canonical_json(self.arguments)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "arguments": self.arguments, "decision": self.decision, "ok": self.ok}
        if self.error:
            out["error"] = self.error
        return out


def _arguments(c: CallLine, text: str | None = None) -> Any:
    """`text`: the raw arguments a call event left in its reply (_log/_large.py)."""
    if c.arguments is not None:
        return c.arguments
    if c.key is not None and c.key.startswith(f"{c.name}:"):
        try:
            return loads(c.key[len(c.name) + 1:])
        except ValueError:
            pass
    raw = c.raw_arguments or text or ""
    if not raw.strip():
        return {}
    try:
        return loads_object(raw)
    except ValueError:
        return raw


def _positions(events: Sequence[LogEvent]) -> dict[int, dict[str, int]]:
    """step -> tool_call_id -> position in that reply (when the raw reply can be read)."""
    out: dict[int, dict[str, int]] = {}
    for e in events:
        if isinstance(e, ReplyLine) and isinstance(e.raw, dict):
            try:
                calls = Reply.from_response(e.raw).tool_calls
            except ReplyFormatError:
                continue
            pos: dict[str, int] = {}
            for i, c in enumerate(calls):
                pos.setdefault(c.id, i)
            out[e.step] = pos
    return out


def calls_from_events(events: Sequence[LogEvent]) -> list[CallRecord]:
    """One record per requested call, from a run's typed events (as `on_event` or `read_log` gives
    them); ordered by step, then by position in the reply."""
    rows: list[tuple[tuple[int, int, int], CallLine, ResultLine | None]] = []
    open_calls: dict[tuple[int, str], int] = {}
    positions = _positions(events)
    texts = call_text(e.record for e in events)
    for e in events:
        if isinstance(e, CallLine):
            order = (e.step, positions.get(e.step, {}).get(e.tool_call_id, 1 << 30), e.seq)
            open_calls[(e.step, e.tool_call_id)] = len(rows)
            rows.append((order, e, None))
        elif isinstance(e, ResultLine):
            i = open_calls.pop((e.step, e.tool_call_id), None)
            if i is not None:
                rows[i] = (rows[i][0], rows[i][1], e)
    rows.sort(key=lambda r: r[0])
    return [CallRecord(c.name, _arguments(c, texts.get(c.seq)), str((r or c).decision),
                       None if r is None else r.ok, None if r is None else r.error, c.step)
            for _, c, r in rows]
