"""`loopfence reconcile LOG`: does the log add up? A pass/fail table per invariant; exit 1 on any."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from .._printable import markup, printable, rich_text
from ..runlog._events import LogError
from ..runlog._reconcile import Reconciliation, reconcile
from ._common import DETAIL_CHARS, UsageError, stderr

__all__ = ["add_parser", "main", "print_reconciliation", "reconcile_own_log"]

HELP = "check that a run log adds up (calls vs results, ledger vs events, the stop)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("reconcile", help=HELP, description=(
        "Check a run log's invariants: every requested call has exactly one result, the ledger "
        "matches the events, token totals match the replies' usage, the stop is last and the guards "
        "the ring runs, fed the log, stop where it stops (its limit was really reached), and no final "
        "answer was overwritten. Exit 0 when all hold, 1 when any "
        "fails, 2 when the file is not a readable run log."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")


def print_reconciliation(rec: Reconciliation, console: Console = stderr) -> None:
    table = Table(title=f"reconcile {markup(rec.path)}")
    table.add_column("invariant", style="bold")
    table.add_column("result")
    table.add_column("detail")
    for c in rec.checks:
        mark = "[green]pass[/]" if c.ok else "[bold red]FAIL[/]"
        table.add_row(rich_text(c.name), mark, rich_text(c.detail, DETAIL_CHARS))
    console.print(table)
    console.print(summary_line(rec), markup=False)


def summary_line(rec: Reconciliation) -> str:
    if rec.ok:
        return f"reconcile: all {len(rec.checks)} invariants hold"
    return f"reconcile: {len(rec.failed)} of {len(rec.checks)} invariants FAIL: " + \
        ", ".join(c.name for c in rec.failed)


def reconcile_own_log(path: str | None, console: Console = stderr) -> bool:
    """`loopfence run` and `resume` check their own log at the end and say so (the table on failure)."""
    if path is None:
        return True
    try:
        rec = reconcile(path)
    except LogError as exc:
        console.print(f"reconcile: the log cannot be read back: {printable(exc, DETAIL_CHARS)}",
                      markup=False)
        return False
    if rec.ok:
        console.print(summary_line(rec), markup=False)
    else:
        print_reconciliation(rec, console)
    return rec.ok


def main(args: argparse.Namespace) -> int:
    try:
        rec = reconcile(args.log)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    print_reconciliation(rec)
    return 0 if rec.ok else 1
