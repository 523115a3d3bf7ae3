"""Export a run log as an ATIF trajectory (Harbor's Agent Trajectory Interchange Format, v1.4).

Steps: the system prompt (if any), the task (user), then one agent step per model reply with its
`tool_calls`, the results in `observation.results` (linked by `source_call_id`) and per-step
`metrics`. The stop, the verdict and the ledger go in the root `extra` and `final_metrics.extra`.
Tool-call ids must be unique in a trajectory; scripted models reuse ids across steps, so a repeated
id is made unique with its step (`call_0@3`), the original kept in the step's `extra`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

from .._json import loads_object
from .._log import LogError
from .._log._reader import RunLogFile, read_log
from .._log._schema import ReplyLine, ResultLine
from .._messages import Reply

__all__ = ["to_atif", "ATIF_SCHEMA_VERSION"]

ATIF_SCHEMA_VERSION = "ATIF-v1.4"


def to_atif(path: str | Path | RunLogFile) -> dict[str, Any]:
    """A run log as an ATIF trajectory (this module's docstring): a JSON-ready dict."""
    log = path if isinstance(path, RunLogFile) else read_log(path)
    h = log.header
    clock = _Clock(h.started_at, h.t)
    steps: list[dict[str, Any]] = []
    if h.system:
        steps.append({"step_id": 1, "timestamp": clock.at(h.t), "source": "system", "message": h.system})
    steps.append({"step_id": len(steps) + 1, "timestamp": clock.at(h.t), "source": "user",
                  "message": h.task})
    results: dict[int, list[ResultLine]] = {}
    for e in log.events:
        if isinstance(e, ResultLine):
            results.setdefault(e.step, []).append(e)
    used: set[str] = set()
    model_name = h.model.get("model") if isinstance(h.model.get("model"), str) else None
    for e in log.events:
        if isinstance(e, ReplyLine):
            steps.append(_agent_step(len(steps) + 1, e, results.get(e.step, []), used, clock, model_name))
    out: dict[str, Any] = {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": h.run_id,
        "agent": {"name": "loopfence", "version": _version(),
                  **({"model_name": model_name} if model_name else {}),
                  "extra": {"model": {k: v for k, v in h.model.items() if k != "script"},
                            "limits": h.limits, "policy": h.policy, "params": h.params}},
        "steps": steps,
    }
    stop = log.stop
    replies = [e for e in log.events if isinstance(e, ReplyLine)]
    totals = {"total_prompt_tokens": sum(e.usage.prompt_tokens for e in replies),
              "total_completion_tokens": sum(e.usage.completion_tokens for e in replies),
              "total_steps": len(steps)}
    if stop is not None:
        out["notes"] = f"loopfence run stopped: {stop.reason} ({stop.verdict}): {stop.detail}"
        totals["extra"] = {"ledger": stop.ledger}
    out["final_metrics"] = totals
    out["extra"] = {"loopfence": {
        "log": log.path, "format_version": h.version,
        "stop": None if stop is None else {"reason": stop.reason, "detail": stop.detail,
                                           "verdict": stop.verdict, "data": stop.data,
                                           "final_answer": stop.final_answer},
        "resumed": sum(e.event == "resume" for e in log.events)}}
    return out


class _Clock:
    """ISO 8601 timestamps from the header's wall-clock start and each event's offset."""

    def __init__(self, started_at: str, header_t: float) -> None:
        try:
            self.start: datetime | None = datetime.fromisoformat(started_at) - timedelta(seconds=header_t)
        except (ValueError, OverflowError):  # a hand-edited start or offset: no timestamps
            self.start = None

    def at(self, t: float) -> str | None:
        try:
            return None if self.start is None else (self.start + timedelta(seconds=t)).isoformat()
        except OverflowError:
            return None


def _agent_step(n: int, e: ReplyLine, results: list[ResultLine], used: set[str], clock: _Clock,
                model_name: str | None) -> dict[str, Any]:
    try:
        reply = e.reply()
    except LogError:
        reply = Reply(None, (), e.finish_reason, None, {}, e.complete, e.problem)
    step: dict[str, Any] = {"step_id": n, "source": "agent", "message": reply.content or ""}
    if (ts := clock.at(e.t)) is not None:
        step["timestamp"] = ts
    if model_name:
        step["model_name"] = model_name
    ids: dict[str, list[str]] = {}
    calls, raw_args, renamed = [], {}, {}
    for c in reply.tool_calls:
        unique = c.id if c.id not in used else f"{c.id}@{e.step}"
        k = 2
        while unique in used:
            unique, k = f"{c.id}@{e.step}.{k}", k + 1
        used.add(unique)
        ids.setdefault(c.id, []).append(unique)
        if unique != c.id:
            renamed[unique] = c.id
        args = _arguments(c.raw_arguments)
        if args is None:
            raw_args[unique] = c.raw_arguments
        calls.append({"tool_call_id": unique, "function_name": c.name, "arguments": args or {}})
    if calls:
        step["tool_calls"] = calls
    observed = []
    for r in results:
        item: dict[str, Any] = {"content": r.content}
        if ids.get(r.tool_call_id):
            item["source_call_id"] = ids[r.tool_call_id].pop(0)
        observed.append(item)
    if observed:
        step["observation"] = {"results": observed}
    step["metrics"] = {"prompt_tokens": e.usage.prompt_tokens, "completion_tokens": e.usage.completion_tokens,
                       "extra": {"prompt_tokens_reported": e.usage.reported}}
    step["extra"] = {"loopfence_step": e.step, "finish_reason": e.finish_reason, "complete": e.complete,
                     "decisions": [{"tool_call_id": r.tool_call_id, "decision": r.decision, "ok": r.ok,
                                    "error": r.error} for r in results],
                     **({"original_ids": renamed} if renamed else {}),
                     **({"unparsed_arguments": raw_args} if raw_args else {})}
    return step


def _arguments(raw: str) -> dict[str, Any] | None:
    if not raw.strip():
        return {}
    try:
        value = loads_object(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _version() -> str:
    try:
        return metadata.version("loopfence")
    except metadata.PackageNotFoundError:
        return "0+unknown"
