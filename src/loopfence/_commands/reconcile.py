"""`loopfence reconcile LOG...`: does each log add up? A pass/fail table per invariant; exit 1 on any.

With several logs: a verdict line for each, then a summary line; the exit code is the worst of them
(unreadable 2, FAIL 1, unfinished 3, a custom guard's decision unchecked 4, all hold 0). `--json` prints
one object per log on stdout (one per line; the table or the lines still go to stderr), `to_json(rec)`:

    {"log": PATH, "finished": bool, "ok": bool, "holds": bool,
     "checks": [{"name", "ok", "detail", "description"}, ...],
     "unchecked": [NAME, ...], "custom_guards": [NAME, ...], "resume": "loopfence resume PATH ..." | null}

`ok`: the run finished and every invariant holds, all checked; `holds`: every invariant that was checked
holds. `resume` may name flags the log cannot fill in (`--workspace DIR`, `--tools MODULE:ATTR`).
An unfinished log (no stop line) lists in `unchecked` the invariants that need its stop line, and
`resume` says how to continue it. A log showing a custom guard (its notes, refusals or stop) that
`--guard` did not give lists `limit_reached` in `unchecked` (`custom_guards` names them), not failed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from .._json import dumps
from .._printable import markup, printable, rich_text
from .._log import LogError
from .._guards import Guard
from .._log._reader import RunLogFile, read_log
from .._drivers._reconcile import INVARIANTS, Reconciliation, out_of_order, reconcile
from ..tools._builtin import BUILTIN_NAMES
from ._common import DETAIL_CHARS, UsageError, stderr
from ._toolspec import add_guard_flag, load_guards

__all__ = ["add_parser", "main", "print_reconciliation", "reconcile_own_log", "to_json", "warn_out_of_order",
           "UNFINISHED", "UNCHECKED"]

UNFINISHED = 3  # the exit code for a log with no stop line whose lines add up (resume it)
UNCHECKED = 4  # what was checked holds, but a custom guard's decision needs the guard (--guard)
_WORST = (0, UNCHECKED, UNFINISHED, 1, 2)  # several logs: the exit code is the last of these any log has

HELP = "check that a run log adds up (calls vs results, ledger vs events, the stop)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("reconcile", help=HELP, description=(
        "Check a run log's invariants: every requested call has exactly one result, the ledger "
        "matches the events, token totals match the replies' usage, the stop is last and the guards "
        "the ring runs, fed the log, stop where it stops (its limit was really reached), and no final "
        "answer was overwritten. A log with no stop line (a killed run) is unfinished: what its lines "
        "can show is checked and `loopfence resume LOG` continues it. "
        "A run that had a custom guard is checked with it given by --guard; without it, the stop's check "
        "is listed unchecked (naming the guard), not failed. Several logs (runs/*.jsonl): a verdict line "
        "each and a summary. Exit codes (several logs: the worst of theirs): 0 all hold, 1 any fails, "
        f"2 the file is not a readable run log (or a usage error), {UNFINISHED} the run is unfinished and "
        f"what its lines show holds, {UNCHECKED} what was checked holds but a custom guard's stop or refusal "
        "needs the guard (--guard)."))
    p.add_argument("log", metavar="LOG.jsonl", nargs="+", help="the run log (or several)")
    add_guard_flag(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout, one "
                   "line per log (log, finished, ok, holds, checks [name, ok, detail, description], unchecked, "
                   "custom_guards, resume); the table goes to stderr")


def print_reconciliation(rec: Reconciliation, console: Console = stderr, hint: str | None = None) -> None:
    table = Table(title=f"reconcile {markup(rec.path)}")
    table.add_column("invariant", style="bold")
    table.add_column("result")
    table.add_column("detail")
    for c in rec.checks:
        mark = "[green]pass[/]" if c.ok else "[bold red]FAIL[/]"
        table.add_row(rich_text(c.name), mark, rich_text(c.detail, DETAIL_CHARS))
    for name in rec.unchecked:
        table.add_row(rich_text(name), "[dim]unchecked[/]", rich_text(rec.why_unchecked(name)))
    console.print(table)
    console.print(summary_line(rec, hint), markup=False)


def resume_hint(rec: Reconciliation, log: RunLogFile | None = None) -> str | None:
    """How to continue an unfinished run: with `--workspace` when the header names none for the run's
    built-in tools (a Python `run()` over `workspace_tools(DIR)`), `--tools` for custom tools it cannot load."""
    if rec.finished:
        return None
    words = ["loopfence", "resume", shlex.quote(rec.path)]
    if log is not None:
        names = {t.name for t in log.header.specs}
        if not log.header.workspace and names & set(BUILTIN_NAMES):
            words.append("--workspace DIR")
        recorded = log.header.record.get("custom_tools")
        info = log.header.record.get("tool_info") or {}
        mcp = {n for n, i in info.items() if isinstance(i, dict) and "mcp" in i} if isinstance(info, dict) else set()
        if names - set(BUILTIN_NAMES) - mcp and not recorded:
            words.append("--tools MODULE:ATTR")
    return " ".join(words)


def summary_line(rec: Reconciliation, hint: str | None = None) -> str:
    custom = (f"; {', '.join(rec.unchecked)} unchecked (custom guard {', '.join(rec.custom_guards)}: give it "
              "with --guard MODULE:NAME)") if rec.custom_guards else ""
    if not rec.finished:
        torn = f", then an incomplete line of {rec.torn_bytes} bytes" if rec.torn_bytes else ""
        head = (f"reconcile: the run is unfinished (no stop line: its log ends at line {rec.lines}{torn}; the "
                "process died or is still running): ")
        shown = f"{len(rec.checks)} invariants its lines can show"
        said = f"the {shown} hold" if rec.holds else \
            f"{len(rec.failed)} of the {shown} FAIL: " + ", ".join(c.name for c in rec.failed)
        need = len(rec.unchecked) - bool(rec.custom_guards)
        return f"{head}{said}; {need} need the stop line{custom}. `{hint or resume_hint(rec)}` continues it"
    if rec.holds:
        return f"reconcile: all {len(rec.checks)} invariants{' checked' if custom else ''} hold{custom}"
    return f"reconcile: {len(rec.failed)} of {len(rec.checks)} invariants FAIL: " + \
        ", ".join(c.name for c in rec.failed) + custom


def to_json(rec: Reconciliation, hint: str | None = None) -> dict[str, Any]:
    """The `--json` shape (the module's docstring)."""
    return {"log": rec.path, "finished": rec.finished, "ok": rec.ok, "holds": rec.holds,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "description": INVARIANTS[c.name]}
                       for c in rec.checks],
            "unchecked": list(rec.unchecked), "custom_guards": list(rec.custom_guards),
            "resume": hint or resume_hint(rec)}


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
    makers = load_guards(args.guard)
    if len(args.log) == 1:
        try:
            rec, hint = _check(args.log[0], makers)
        except LogError as exc:
            raise UsageError(str(exc)) from None
        print_reconciliation(rec, hint=hint)
        print_resume_where(rec, hint)
        if args.json:
            print(dumps(to_json(rec, hint)), file=sys.stdout, flush=True)
        return _code(rec)
    codes = []
    for path in args.log:  # one verdict line each; a failing log's table too
        try:
            rec, hint = _check(path, makers)
        except LogError as exc:
            stderr.print(f"{printable(path)}: not a readable run log: {printable(exc, DETAIL_CHARS)}", markup=False)
            codes.append(2)
            continue
        if not rec.holds:
            print_reconciliation(rec, hint=hint)
        stderr.print(f"{printable(path)}: {summary_line(rec, hint)}", markup=False)
        if args.json:
            print(dumps(to_json(rec, hint)), file=sys.stdout, flush=True)
        codes.append(_code(rec))
    counts = {code: codes.count(code) for code in _WORST}
    stderr.print(f"reconcile: {len(codes)} logs: {counts[0]} hold, {counts[1]} FAIL, {counts[UNFINISHED]} "
                 f"unfinished, {counts[UNCHECKED]} unchecked (a custom guard), {counts[2]} unreadable", markup=False)
    return max(codes, key=_WORST.index)


def _check(path: str, makers: list[Callable[[], Guard]]) -> tuple[Reconciliation, str | None]:
    log = read_log(path, tolerant=True)
    rec = reconcile(log, guards=[make() for make in makers] or None)
    return rec, resume_hint(rec, log)


def print_resume_where(rec: Reconciliation, hint: str | None) -> None:
    """What `--workspace DIR` or `--tools` in the resume hint stand for (when the log cannot say)."""
    if hint and "--workspace DIR" in hint:
        stderr.print("(DIR: the folder the run's workspace_tools() had; the log's header does not name it)",
                     markup=False)


def _code(rec: Reconciliation) -> int:
    return 0 if rec.ok else 1 if not rec.holds else UNFINISHED if not rec.finished else UNCHECKED
