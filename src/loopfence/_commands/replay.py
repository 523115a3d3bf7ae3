"""`loopfence replay LOG`: run the ring again from the log; identical or the first divergence."""

from __future__ import annotations

import argparse
from typing import Any

from .._limits import parse_limit
from .._printable import printable
from ..runlog._events import LogError
from .._drivers._replay import replay
from ._common import UsageError, stderr

__all__ = ["add_parser", "main"]

HELP = "run a logged run again from its recorded replies and results"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("replay", help=HELP, description=(
        "Replay a run log: the ring runs again with the recorded replies as the model and, by "
        "default, the recorded results as the tools (no side effects, no network). Every request "
        "must equal the recorded one and the run must stop for the same reason at the same step "
        "with the same ledger. Exit 0 identical, 1 diverged (the first divergence is shown), "
        "2 unreadable log (or, with --execute-tools, a workspace that cannot be put back as the run "
        "started). With --limit the replay answers 'would this budget have stopped it "
        "earlier?' and a different stop is the answer (exit 0)."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")
    p.add_argument("--execute-tools", action="store_true",
                   help="run the built-in workspace tools for real, in a private folder holding the "
                        "workspace as the run started, and compare their results with the recorded ones. "
                        "That folder is rebuilt from the run's snapshot (`loopfence run --snapshot`: a "
                        ".tar.gz next to the log) when there is one; else it is a copy of the workspace "
                        "checked against the manifest in the log header: entries the run started without "
                        "(a file it created) are left out of the copy, folders, symlinks and empty files are "
                        "made again, and a file whose content differs or is missing stops the replay with "
                        "its path (exit 2). Logs from before manifests copy the workspace as it is")
    p.add_argument("--workspace", metavar="DIR",
                   help="with --execute-tools: the workspace to copy (default: the one in the header; "
                        "not needed when the run's snapshot is there)")
    p.add_argument("--workspace-as-is", action="store_true",
                   help="with --execute-tools: replay in a copy of the workspace as it is, without the "
                        "snapshot and without checking it against the manifest (a difference then "
                        "shows as a divergence, if the run looked at it)")
    p.add_argument("--limit", metavar="NAME=VALUE", action="append", default=[],
                   help="replay under another limit, e.g. max_steps=3 (repeatable)")


def main(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    for text in args.limit:
        try:
            name, value = parse_limit(text)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        overrides[name] = value
    try:
        if (args.workspace or args.workspace_as_is) and not args.execute_tools:
            raise UsageError("--workspace and --workspace-as-is go with --execute-tools")
        report = replay(args.log, limits=overrides, execute_tools=args.execute_tools,
                        workspace=args.workspace, workspace_as_is=args.workspace_as_is)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    for line in report.lines():  # a divergence shows clipped events: a result can be 200 MB
        stderr.print(printable(line), markup=False)
    return 0 if report.ok else 1
