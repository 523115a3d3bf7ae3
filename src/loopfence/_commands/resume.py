"""`loopfence resume LOG`: continue a run whose process died, or that ended for an outage or a
Ctrl-C, appending to its log."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._limits import parse_limit
from .._printable import printable
from .._stops import Verdict
from ..mcp import McpUsageError, open_from_args
from ..mcp import add_flags as add_mcp_flags
from ..models import Model
from .._log import LogError
from .._log._schema import HeaderLine
from .._log._reader import read_log
from .._drivers._rebuild import ModelRebuildError, model_of
from .._drivers._resume import recorded_workspace_tools, resume
from ._common import (DETAIL_CHARS, UsageError, limits_from_flags, live_printer, one_log, print_quiet, print_summary,
                      stderr)
from ._toolspec import add_guard_flag, load_guards, load_tools
from .reconcile import reconcile_own_log

__all__ = ["add_parser", "main"]

HELP = "continue a run whose process died (kill -9 included), or that ended endpoint_error or cancelled"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("resume", help=HELP, description=(
        "Continue a run from its log: the log is read back to its last complete line, the "
        "conversation, ledger, cache, guard memory and clock are rebuilt by playing it back, then "
        "the run goes on live with the model recorded in the header, appending to the same log. A "
        "side-effecting call whose intent was logged but not its outcome is not run again: the model "
        "receives an outcome_unknown result. A run that ended endpoint_error or cancelled goes on past "
        "that stop (a new segment of the same log), optionally with another --base-url/--model and "
        "raised --limit values; a run that ended any other way says so (exit 0). "
        "Exit: 0 SHIP, 1 KILL, 2 the log cannot be resumed."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")
    p.add_argument("more", nargs="*", help=argparse.SUPPRESS)  # a glob of several: said, not "unrecognized"
    add_guard_flag(p)
    p.add_argument("--workspace", metavar="DIR",
                   help="folder for the file tools (default: the workspace recorded in the header)")
    p.add_argument("--quiet", action="store_true", help="nothing on stderr but problems: no live step "
                   "lines, no summary (the answer alone on stdout), no reconcile line unless it fails")
    p.add_argument("--tools", metavar="MODULE:ATTR", action="append",
                   help="custom Python tools the run had (default: the header's custom_tools); repeatable")
    p.add_argument("--limit", metavar="NAME=VALUE", action="append", default=[],
                   help="go on under another limit, e.g. max_steps=20 (recorded in the resume event; "
                   "the part already run must still fit it)")
    http = p.add_argument_group("the model it goes on with (default: the one in the header)")
    http.add_argument("--base-url", metavar="URL", help="another OpenAI-compatible endpoint")
    http.add_argument("--model", metavar="NAME", help="another model name (with the header's endpoint, "
                      "or --base-url)")
    add_mcp_flags(p)


def main(args: argparse.Namespace) -> int:
    path = one_log("resume", [args.log, *args.more])
    guards = [make() for make in load_guards(args.guard)] or None
    if args.workspace and not Path(args.workspace).is_dir():
        raise UsageError(f"--workspace {args.workspace}: not a folder")
    limits_from_flags(args.limit)  # every flag parses (one line each, exit 2)
    changed = dict(parse_limit(text) for text in args.limit)
    try:
        log = read_log(path, tolerant=True)
        builtins = recorded_workspace_tools(log, args.workspace)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    recorded = log.header.record.get("custom_tools")
    specs = args.tools or (list(recorded) if isinstance(recorded, list) else None)
    custom = load_tools(specs)
    model = _model(log.header, args.base_url, args.model, sum(e.event == "reply" for e in log.events))
    try:
        with open_from_args(args, reserved=[t.name for t in (*builtins, *custom)]) as mcp:
            outcome = resume(path, tools=builtins, extra_tools=[*custom, *mcp], model=model, guards=guards,
                             limits=changed or None, on_event=None if args.quiet else live_printer())
    except McpUsageError as exc:
        raise UsageError(str(exc)) from None
    except (LogError, ModelRebuildError) as exc:
        raise UsageError(str(exc)) from None
    if not args.quiet or outcome.result is None:  # quiet: only when there was nothing to resume
        for line in outcome.lines():
            stderr.print(printable(line, DETAIL_CHARS), markup=False)
    if outcome.result is None:
        return 0
    if args.quiet:
        print_quiet(outcome.result)
    else:
        print_summary(outcome.result)
    ok = reconcile_own_log(outcome.path, quiet=args.quiet)
    return 0 if outcome.result.verdict is Verdict.SHIP and ok else 1


def _model(h: HeaderLine, base_url: str | None, name: str | None, served: int) -> Model | None:
    """The model named by --base-url/--model over the header's settings (None: neither given)."""
    if not base_url and not name:
        return None
    settings = dict(h.model) if h.model.get("kind") == "openai" else {"kind": "openai"}
    if base_url:
        settings["base_url"] = base_url
    if name:
        settings["model"] = name
    if not settings.get("base_url"):
        raise UsageError(f"--model: the run's model was {h.model.get('kind')!r}, not an endpoint; "
                         "give --base-url too")
    try:
        return model_of(h.model_copy(update={"model": settings}), served)
    except ModelRebuildError as exc:
        raise UsageError(f"--base-url: {exc}") from None
