"""The decision table: one row per scenario, printed with rich; and the results file."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .._json import dumps
from .._printable import rich_text

from ._runner import DrillResult

__all__ = ["decision_table", "print_table", "write_results", "RESULTS_FORMAT"]

RESULTS_FORMAT = "loopfence.drill"


def _mark(r: DrillResult) -> str:
    if r.error is not None:
        return "[red]error[/]"
    if r.passed is None:
        return "[dim]-[/]"
    return "[green]pass[/]" if r.passed else "[red]FAIL[/]"


def decision_table(results: Sequence[DrillResult]) -> Table:
    """The decision table (expected and actual stop, requests, executions, reuses, tokens, pass)."""
    table = Table(title="loopfence drill")
    table.add_column("scenario", overflow="fold")
    table.add_column("expected stop", overflow="fold")
    table.add_column("actual stop", overflow="fold")
    for col in ("requests", "executed", "reused", "tokens"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("pass", justify="center", no_wrap=True)
    for r in results:
        table.add_row(rich_text(r.name), rich_text(r.expected_stop or "-"), rich_text(r.stop or "-"),
                      str(r.counts.get("model_requests", 0)), str(r.counts.get("tool_executions", 0)),
                      str(r.counts.get("reused", 0)), str(r.prompt_tokens + r.completion_tokens), _mark(r))
    return table


def print_table(results: Sequence[DrillResult], console: Console) -> None:
    """Print the decision table, then each failed scenario's mismatches."""
    console.print(decision_table(results))
    for r in results:
        for problem in r.mismatches:
            console.print(rich_text(f"  {r.name}: {problem}", style="red"))
    failed = sum(r.failed for r in results)
    checked = sum(r.passed is not None or r.error is not None for r in results)
    console.print(f"{checked - failed}/{checked} scenarios with expectations passed"
                  + (f"; [red]{failed} failed[/]" if failed else ""))


def write_results(out_dir: Path, results: Sequence[DrillResult], paths: Sequence[str]) -> Path:
    """Write `results.json` (every scenario's row, and whether all passed) to `out_dir`; its path."""
    doc: dict[str, Any] = {
        "format": RESULTS_FORMAT, "version": 1, "written_at": datetime.now(timezone.utc).isoformat(),
        "paths": list(paths), "passed": not any(r.failed for r in results),
        "scenarios": [r.to_json() for r in results],
    }
    path = out_dir / "results.json"
    path.write_text(dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path
