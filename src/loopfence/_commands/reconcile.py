"""`loopfence reconcile LOG`: does the log add up? A pass/fail table per invariant; exit 1 on any.

`--json` prints one object on stdout (the table still goes to stderr), `to_json(rec)`:

    {"log": PATH, "finished": bool, "ok": bool, "holds": bool,
     "checks": [{"name", "ok", "detail", "description"}, ...],
     "unchecked": [NAME, ...], "resume": "loopfence resume PATH" | null}

`ok`: the run finished and every invariant holds; `holds`: every invariant that was checked holds.
An unfinished log (no stop line) lists in `unchecked` the invariants that need its stop line, and
`resume` says how to continue it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from .._json import dumps
from .._printable import markup, printable, rich_text
from .._log import LogError
from .._log._reader import RunLogFile
from .._drivers._reconcile import INVARIANTS, Reconciliation, out_of_order, reconcile
from ._common import DETAIL_CHARS, UsageError, stderr

__all__ = ["add_parser", "main", "print_reconciliation", "reconcile_own_log", "to_json", "warn_out_of_order",
           "UNFINISHED"]

UNFINISHED = 3  # the exit code for a log with no stop line whose lines add up (resume it)

HELP = "check that a run log adds up (calls vs results, ledger vs events, the stop)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("reconcile", help=HELP, description=(
        "Check a run log's invariants: every requested call has exactly one result, the ledger "
        "matches the events, token totals match the replies' usage, the stop is last and the guards "
        "the ring runs, fed the log, stop where it stops (its limit was really reached), and no final "
        "answer was overwritten. A log with no stop line (a killed run) is unfinished: what its lines "
        "can show is checked and `loopfence resume LOG` continues it. "
        "Exit codes: 0 all hold, 1 any fails, 2 the file is not a readable run log (or a usage error), "
        f"{UNFINISHED} the run is unfinished and what its lines show holds."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout "
                   "(log, finished, ok, holds, checks [name, ok, detail, description], unchecked, resume); "
                   "the table goes to stderr")


def print_reconciliation(rec: Reconciliation, console: Console = stderr) -> None:
    table = Table(title=f"reconcile {markup(rec.path)}")
    table.add_column("invariant", style="bold")
    table.add_column("result")
    table.add_column("detail")
    for c in rec.checks:
        mark = "[green]pass[/]" if c.ok else "[bold red]FAIL[/]"
        table.add_row(rich_text(c.name), mark, rich_text(c.detail, DETAIL_CHARS))
    for name in rec.unchecked:
        table.add_row(rich_text(name), "[dim]unchecked[/]", "needs the stop line, which the run has not written")
    console.print(table)
    console.print(summary_line(rec), markup=False)


def resume_hint(rec: Reconciliation) -> str | None:
    return None if rec.finished else f"loopfence resume {shlex.quote(rec.path)}"


def summary_line(rec: Reconciliation) -> str:
    if not rec.finished:
        torn = f", then an incomplete line of {rec.torn_bytes} bytes" if rec.torn_bytes else ""
        head = (f"reconcile: the run is unfinished (no stop line: its log ends at line {rec.lines}{torn}; the "
                "process died or is still running): ")
        shown = f"{len(rec.checks)} invariants its lines can show"
        said = f"the {shown} hold" if rec.holds else \
            f"{len(rec.failed)} of the {shown} FAIL: " + ", ".join(c.name for c in rec.failed)
        return f"{head}{said}; {len(rec.unchecked)} need the stop line. `{resume_hint(rec)}` continues it"
    if rec.ok:
        return f"reconcile: all {len(rec.checks)} invariants hold"
    return f"reconcile: {len(rec.failed)} of {len(rec.checks)} invariants FAIL: " + \
        ", ".join(c.name for c in rec.failed)


def to_json(rec: Reconciliation) -> dict[str, Any]:
    """The `--json` shape (the module's docstring)."""
    return {"log": rec.path, "finished": rec.finished, "ok": rec.ok, "holds": rec.holds,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "description": INVARIANTS[c.name]}
                       for c in rec.checks],
            "unchecked": list(rec.unchecked), "resume": resume_hint(rec)}


def reconcile_own_log(path: str | None, console: Console = stderr, quiet: bool = False) -> bool:
    """`loopfence run` and `resume` check their own log at the end and say so (the table on failure;
    `quiet`: nothing when it adds up)."""
    if path is None:
        return True
    try:
        rec = reconcile(path)
    except LogError as exc:
        console.print(f"reconcile: the log cannot be read back: {printable(exc, DETAIL_CHARS)}",
                      markup=False)
        return False
    if not rec.ok:
        print_reconciliation(rec, console)
    elif not quiet:
        console.print(summary_line(rec), markup=False)
    return rec.ok


def warn_out_of_order(log: RunLogFile, command: str, console: Console = stderr) -> None:
    """`export` and `report` show a log as its lines are; one whose lines were moved, dropped or
    edited gets a warning first, naming the first line out of place (the output still comes)."""
    first = next(out_of_order(log), None)
    if first is not None:
        console.print(f"loopfence {command}: warning: {printable(log.path, DETAIL_CHARS)}: {first}: its lines "
                      "are out of order (moved, dropped or edited); `loopfence reconcile` checks the rest",
                      markup=False)


def main(args: argparse.Namespace) -> int:
    try:
        rec = reconcile(args.log)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    print_reconciliation(rec)
    if args.json:
        print(dumps(to_json(rec)), file=sys.stdout, flush=True)
    return 0 if rec.ok else 1 if not rec.holds else UNFINISHED
