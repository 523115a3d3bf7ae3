"""Comparing what a run showed with what the scenario expects: a list of mismatches, empty = pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._json import canonical_json
from ._calls import CallRecord
from ._scenario import Expect, ExpectedCall

__all__ = ["Observed", "mismatches"]


@dataclass(frozen=True, slots=True)
class Observed:
    """The facts of one run that expectations are checked against."""

    stop: str
    verdict: str
    counts: dict[str, int]  # model_requests, tool_calls, tool_executions, reused, refused, rejected
    elapsed_s: float
    calls: tuple[CallRecord, ...]
    existing_files: frozenset[str]  # of the expected files, those that exist after the run
    log_text: str


def mismatches(e: Expect, o: Observed, bind: Callable[[str, dict[str, Any]], Any]) -> list[str]:
    """`bind(name, arguments)` returns the arguments as the tool binds them (defaults filled)."""
    out: list[str] = []
    if e.stop is not None and str(e.stop) != o.stop:
        out.append(f"stop: expected {e.stop}, got {o.stop}")
    if e.verdict is not None and str(e.verdict) != o.verdict:
        out.append(f"verdict: expected {e.verdict}, got {o.verdict}")
    for key in ("model_requests", "tool_calls", "tool_executions", "reused", "refused", "rejected"):
        want = getattr(e, key)
        if want is not None and o.counts[key] != want:
            out.append(f"{key}: expected {want}, got {o.counts[key]}")
    for key, counted in (("max_tool_executions", "tool_executions"), ("max_model_requests", "model_requests")):
        most = getattr(e, key)
        if most is not None and o.counts[counted] > most:
            out.append(f"{counted}: expected at most {most}, got {o.counts[counted]}")
    if e.max_elapsed_s is not None and o.elapsed_s > e.max_elapsed_s:
        out.append(f"elapsed_s: expected at most {e.max_elapsed_s:g}, got {o.elapsed_s:.2f}")
    if e.calls is not None:
        out.extend(_calls(e.calls, [c for c in o.calls if c.decision == "executed"], bind))
    out.extend(f"files_exist: {p} does not exist in the workspace after the run"
               for p in e.files_exist if p not in o.existing_files)
    out.extend(f"log_contains: {s!r} is not in the run log" for s in e.log_contains if s not in o.log_text)
    return out


def _calls(want: tuple[ExpectedCall, ...], got: list[CallRecord],
           bind: Callable[[str, dict[str, Any]], Any]) -> list[str]:
    out = []
    if len(want) != len(got):
        out.append(f"calls: expected {len(want)} executed calls, got {len(got)}: "
                   + ", ".join(f"{c.name} {c.canonical_arguments}" for c in got))
    for i, (w, g) in enumerate(zip(want, got)):
        expected_args = canonical_json(bind(w.name, w.arguments))
        if w.name != g.name or expected_args != g.canonical_arguments:
            out.append(f"calls[{i}]: expected {w.name} {expected_args}, got {g.name} {g.canonical_arguments}")
        elif w.ok is not None and w.ok != g.ok:
            out.append(f"calls[{i}]: expected ok={str(w.ok).lower()}, got ok={str(g.ok).lower()}"
                       + (f" ({g.error})" if g.error else ""))
    return out
