"""`loopfence replay LOG`: run the ring again from the log; identical or the first divergence.

`--json` prints one object on stdout (the human lines still go to stderr), `to_json(report)`:

    {"log": PATH, "ok": bool, "same_stop": bool, "what_if": bool, "overrides": {NAME: VALUE},
     "recorded": {"reason", "step", "line"},
     "replayed": {"reason", "step", "executions", "detail"} | null,
     "divergence": {"step", "line", "what"} | null, "past_end": TEXT | null,
     "executed": [TOOL, ...], "lines": [TEXT, ...]}

`ok` is the exit code's answer (identical; or, under --limit, an answer was found); `same_stop`:
the replay stopped for the recorded reason at the recorded step with nothing left over.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._drivers._replay import ReplayReport, replay
from .._json import dumps
from .._limits import parse_limit
from .._printable import printable
from ..mcp import McpUsageError, open_from_args
from ..mcp import add_flags as add_mcp_flags
from .._log import LogError
from ._common import UsageError, one_log, stderr
from ._toolspec import add_guard_flag, load_guards, load_tools

__all__ = ["add_parser", "main", "to_json"]

HELP = "run a logged run again from its recorded replies and results"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("replay", help=HELP, description=(
        "Replay a run log: the ring runs again with the recorded replies as the model and, by "
        "default, the recorded results as the tools (no side effects, no network). Every request "
        "must equal the recorded one and the run must stop for the same reason at the same step "
        "with the same ledger. Exit 0 identical, 1 diverged (the first divergence is shown), "
        "2 unreadable log or usage error (or, with --execute-tools, a workspace that cannot be put back "
        "as the run started). With --limit the replay answers 'would this budget have stopped it "
        "earlier?' and a different stop is the answer (exit 0). A run with custom or MCP tools replays "
        "from their recorded results; --tools and --mcp run them for real and compare."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")
    p.add_argument("more", nargs="*", help=argparse.SUPPRESS)  # a glob of several: said, not "unrecognized"
    add_guard_flag(p)
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
    p.add_argument("--tools", metavar="MODULE:ATTR", action="append", default=[],
                   help="custom Python tools (as `run --tools`) that run for real, their results compared "
                        "with the recorded ones; a tool whose name, schema or kind is not the recorded one "
                        "is not used (its recorded results are). Repeatable")
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object on stdout "
                   "(log, ok, same_stop, what_if, overrides, recorded, replayed, divergence, past_end, "
                   "executed, lines); the lines also go to stderr")
    add_mcp_flags(p)


def main(args: argparse.Namespace) -> int:
    path = one_log("replay", [args.log, *args.more])
    guards = [make() for make in load_guards(args.guard)] or None
    overrides: dict[str, Any] = {}
    for text in args.limit:
        try:
            name, value = parse_limit(text)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        overrides[name] = value
    if (args.workspace or args.workspace_as_is) and not args.execute_tools:
        raise UsageError("--workspace and --workspace-as-is go with --execute-tools")
    custom = load_tools(args.tools)
    try:
        with open_from_args(args, reserved=[t.name for t in custom]) as mcp:
            report = replay(path, limits=overrides, execute_tools=args.execute_tools,
                            tools=[*custom, *mcp], guards=guards, workspace=args.workspace,
                            workspace_as_is=args.workspace_as_is)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    except McpUsageError as exc:
        raise UsageError(str(exc)) from None
    for line in report.lines():  # a divergence shows clipped events: a result can be 200 MB
        stderr.print(printable(line), markup=False)
    if args.json:
        print(dumps(to_json(report)), file=sys.stdout, flush=True)
    return 0 if report.ok else 1


def to_json(report: ReplayReport) -> dict[str, Any]:
    """The `--json` shape (the module's docstring)."""
    rec, r, d = report.recorded, report.replayed, report.divergence
    return {"log": report.path, "ok": report.ok, "same_stop": report.same_stop, "what_if": report.what_if,
            "overrides": dict(report.overrides),
            "recorded": {"reason": rec.reason, "step": rec.ledger.get("model_requests"), "line": rec.line},
            "replayed": None if r is None else {"reason": str(r.stop.reason), "step": r.ledger.model_requests,
                                                "executions": r.ledger.tool_executions, "detail": r.stop.detail},
            "divergence": None if d is None else {"step": d.step, "line": d.line, "what": d.what},
            "past_end": report.past_end, "executed": list(report.executed), "lines": report.lines()}
