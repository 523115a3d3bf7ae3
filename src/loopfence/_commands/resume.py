"""`loopfence resume LOG`: continue a run whose process died, appending to its log."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._printable import printable
from .._stops import Verdict
from ..runlog._events import LogError
from ..runlog._rebuild import ModelRebuildError
from .._drivers._resume import resume
from ._common import DETAIL_CHARS, UsageError, live_printer, print_summary, stderr
from .reconcile import reconcile_own_log

__all__ = ["add_parser", "main"]

HELP = "continue a run whose process died (kill -9 included) from its log"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("resume", help=HELP, description=(
        "Continue a run from its log: the log is read back to its last complete line, the "
        "conversation, ledger, cache, guard memory and clock are rebuilt by playing it back, then "
        "the run goes on live with the model recorded in the header, appending to the same log. A "
        "side-effecting call whose intent was logged but not its outcome is not run again: the model "
        "receives an outcome_unknown result. A run that already ended says so (exit 0). "
        "Exit: 0 SHIP, 1 KILL, 2 the log cannot be resumed."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")
    p.add_argument("--workspace", metavar="DIR",
                   help="folder for the file tools (default: the workspace recorded in the header)")
    p.add_argument("--quiet", action="store_true", help="no live step lines")


def main(args: argparse.Namespace) -> int:
    if args.workspace and not Path(args.workspace).is_dir():
        raise UsageError(f"--workspace {args.workspace}: not a folder")
    try:
        outcome = resume(args.log, workspace=args.workspace, listener=None if args.quiet else live_printer())
    except (LogError, ModelRebuildError) as exc:
        raise UsageError(str(exc)) from None
    for line in outcome.lines():
        stderr.print(printable(line, DETAIL_CHARS), markup=False)
    if outcome.result is None:
        return 0
    print_summary(outcome.result)
    ok = reconcile_own_log(outcome.path)
    return 0 if outcome.result.verdict is Verdict.SHIP and ok else 1
