"""`loopfence report LOG.jsonl | DIR`: a self-contained HTML page (no network) for a run or a batch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._printable import printable
from .._report import write_dir_report, write_run_report
from .._report._dir import DirError
from .._log import LogError
from .._log._reader import read_log
from ._common import UsageError, not_the_input
from .reconcile import warn_out_of_order

__all__ = ["add_parser", "main"]

HELP = "write an HTML page for a run log or a batch / drill folder"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help=HELP, description=(
        "Write one self-contained HTML file (CSS, script and charts inline; nothing fetched). For a run "
        "log: the stop, task, model and limits, each budget's use, the per-turn token chart, the "
        "timeline of steps with every call's decision, gate and compaction decisions, retries. For a "
        "batch or drill folder: episodes by stop reason, the SHIP rate, a sortable table of episodes "
        "linking to a page per episode (written next to its log), the decision table. Exit: 0 written "
        "(its path on standard output), 2 an unreadable log or folder, an unwritable page or a usage "
        "error (-o the log itself included)."))
    p.add_argument("path", metavar="LOG.jsonl|DIR", help="a run log, or a batch / drill output folder")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the page (default: LOG.html next to the log; DIR/report.html for a folder)")
    p.add_argument("--no-episode-pages", action="store_true",
                   help="folder: only the folder's page (its table links to no episode page)")


def main(args: argparse.Namespace) -> int:
    path = Path(args.path)
    try:
        if path.is_dir():
            out = write_dir_report(path, args.output, episode_pages=not args.no_episode_pages)
        elif path.exists():
            not_the_input(args.output, path)
            log = read_log(path, tolerant=True)  # as the page reads it: read once, for both
            warn_out_of_order(log, "report")
            out = write_run_report(path, args.output, read=log)
        else:
            raise UsageError(f"{args.path}: no such file or folder")
    except (LogError, DirError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{exc.filename or args.output or args.path}: {exc.strerror or exc}") from None
    print(printable(str(out)))  # the page's path, on stdout (scripts open it)
    return 0
