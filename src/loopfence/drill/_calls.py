"""Every call the model requested, in order, with what the ring decided: read from the run log events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._json import canonical_json, loads, loads_object
from .._messages import Reply, ReplyFormatError
from .._log._large import call_text

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


def _arguments(e: dict[str, Any], text: str | None = None) -> Any:
    """`text`: the raw arguments a call event left in its reply (_log/_large.py)."""
    if isinstance(e.get("arguments"), dict):
        return e["arguments"]
    key, name = e.get("key"), e.get("name", "")
    if isinstance(key, str) and key.startswith(f"{name}:"):
        try:
            return loads(key[len(name) + 1:])
        except ValueError:
            pass
    raw = e.get("raw_arguments") or text or ""
    if not raw.strip():
        return {}
    try:
        return loads_object(raw)
    except ValueError:
        return raw


def _positions(events: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """step -> tool_call_id -> position in that reply (when the raw reply can be read)."""
    out: dict[int, dict[str, int]] = {}
    for e in events:
        if e.get("event") == "reply" and isinstance(e.get("raw"), dict):
            try:
                calls = Reply.from_response(e["raw"]).tool_calls
            except ReplyFormatError:
                continue
            pos: dict[str, int] = {}
            for i, c in enumerate(calls):
                pos.setdefault(c.id, i)
            out[int(e.get("step", 0))] = pos
    return out


def calls_from_events(events: list[dict[str, Any]]) -> list[CallRecord]:
    """One record per requested call; ordered by step, then by position in the reply."""
    rows: list[tuple[tuple[int, int, int], dict[str, Any], dict[str, Any] | None]] = []
    open_calls: dict[tuple[int, str], int] = {}
    positions = _positions(events)
    texts = call_text(events)
    for e in events:
        kind = e.get("event")
        if kind == "call":
            step, cid = int(e.get("step", 0)), str(e.get("tool_call_id"))
            order = (step, positions.get(step, {}).get(cid, 1 << 30), int(e.get("seq", 0)))
            open_calls[(step, cid)] = len(rows)
            rows.append((order, e, None))
        elif kind == "result":
            i = open_calls.pop((int(e.get("step", 0)), str(e.get("tool_call_id"))), None)
            if i is not None:
                rows[i] = (rows[i][0], rows[i][1], e)
    rows.sort(key=lambda r: r[0])
    return [CallRecord(c.get("name", ""), _arguments(c, texts.get(c.get("seq"))), str((r or c).get("decision")),
                       None if r is None else bool(r.get("ok")), None if r is None else r.get("error"),
                       int(c.get("step", 0)))
            for _, c, r in rows]
