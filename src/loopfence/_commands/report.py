"""`loopfence report LOG.jsonl... | DIR`: a self-contained HTML page (no network) for a run or a batch.

Several logs (or folders): a page each, next to each; a line for each on stderr, the pages' paths on
stdout, then a summary; exit 2 when any could not be written."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._printable import printable
from .._report import write_dir_report, write_run_report
from .._report._dir import DirError
from .._log import LogError
from .._log._reader import read_log
from ._common import DETAIL_CHARS, UsageError, not_the_input, stderr
from .reconcile import warn_out_of_order

__all__ = ["add_parser", "main"]

HELP = "write an HTML page for a run log or a batch / drill folder"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help=HELP, description=(
        "Write one self-contained HTML file (CSS, script and charts inline; nothing fetched). For a run "
        "log: the stop, task, model and limits, each budget's use, the per-turn token chart, the "
        "timeline of steps with every call's decision, gate and compaction decisions, retries. For a "
        "batch or drill folder: episodes by stop reason, the SHIP rate, a sortable table of episodes "
        "linking to a page per episode (written next to its log), the decision table. Several logs "
        "(runs/*.jsonl): a page next to each. Exit: 0 written (each page's path on standard output), "
        "2 an unreadable log or folder, an unwritable page or a usage error (-o the log itself included)."))
    p.add_argument("path", metavar="LOG.jsonl|DIR", nargs="+",
                   help="a run log, or a batch / drill output folder (or several)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the page (default: LOG.html next to the log; DIR/report.html for a folder); one "
                        "log or folder only")
    p.add_argument("--no-episode-pages", action="store_true",
                   help="folder: only the folder's page (its table links to no episode page)")


def main(args: argparse.Namespace) -> int:
    if len(args.path) == 1:
        print(printable(str(_page(args.path[0], args.output, args.no_episode_pages))))  # stdout: scripts open it
        return 0
    if args.output:
        raise UsageError(f"-o names one page, and there are {len(args.path)} logs: leave it out, and each page "
                         "goes next to its log")
    written = 0
    for where in args.path:
        try:
            out = _page(where, None, args.no_episode_pages)
        except UsageError as exc:
            stderr.print(f"loopfence report: {printable(exc, DETAIL_CHARS)}", markup=False)
            continue
        print(printable(str(out)), flush=True)
        written += 1
    stderr.print(f"report: {written} of {len(args.path)} pages written", markup=False)
    return 0 if written == len(args.path) else 2


def _page(where: str, output: str | None, no_episode_pages: bool) -> Path:
    path = Path(where)
    try:
        if path.is_dir():
            return write_dir_report(path, output, episode_pages=not no_episode_pages)
        if path.exists():
            not_the_input(output, path)
            log = read_log(path, tolerant=True)  # as the page reads it: read once, for both
            warn_out_of_order(log, "report")
            return write_run_report(path, output, read=log)
        raise UsageError(f"{where}: no such file or folder")
    except (LogError, DirError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{exc.filename or output or where}: {exc.strerror or exc}") from None
