"""`loopfence drill PATH...`: run scenario files, print the decision table, exit 0 only if all pass."""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from .._json import dumps
from .._printable import printable
from ..drill import (DrillResult, DrillSetupError, Endpoint, ScenarioError, known_tool_names, load_each,
                     print_table, run_scenario, scripted_models, write_results)
from ..mcp import McpUsageError, open_from_args
from ..mcp import add_flags as add_mcp_flags
from ..drill._models import ModelFactory, http_pieces
from ._common import DETAIL_CHARS, UsageError, stderr

__all__ = ["add_parser", "main"]

HELP = "run drill scenarios and print the decision table"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("drill", help=HELP, description=(
        "Run every scenario file (*.json) under PATH: a fresh workspace each, the scenario's tools, "
        "scripted replies (or a real model with --base-url). Prints the decision table; writes each "
        "run's log and results.json to --out. A scenario file that cannot be used is an error row "
        "naming the file and the field; the others still run. Exit code: 0 if every scenario with an "
        "expect passed, 1 otherwise, 2 when a scenario file was bad (or on usage errors)."))
    p.add_argument("paths", nargs="+", metavar="PATH", help="scenario files or folders")
    p.add_argument("--out", metavar="DIR", help="where logs and results.json go (default: runs/drill-<time>/)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per scenario on stdout (the table goes to stderr)")
    p.add_argument("--base-url", metavar="URL", help="let a real OpenAI-compatible endpoint answer "
                   "instead of the scenario's replies (tools and workspace stay)")
    p.add_argument("--model", metavar="NAME", help="model name sent to --base-url "
                   "(default: LOOPFENCE_MODEL; the API key comes from LOOPFENCE_API_KEY or OPENAI_API_KEY)")
    add_mcp_flags(p)  # started once; every scenario gets their tools (a scenario's own `mcp` servers too)


def _models(args: argparse.Namespace) -> ModelFactory:
    if args.model and not args.base_url:
        raise UsageError("--model needs --base-url")
    if not args.base_url:
        return scripted_models
    try:
        _, model_cls = http_pieces(server=False)
        model_cls(args.base_url, args.model).close()  # a bad URL is a usage error, not N failed rows
    except DrillSetupError as exc:
        raise UsageError(f"--base-url: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--base-url: {exc}") from None
    return Endpoint(args.base_url, args.model)


def _console(to_stderr: bool) -> Console:
    """The table's console; a file or pipe gets a wide table instead of rich's 80 columns."""
    console = Console(stderr=to_stderr, highlight=False, emoji=False)
    return console if console.is_terminal else Console(stderr=to_stderr, highlight=False, emoji=False,
                                                       width=150)


def _writable(out: Path) -> None:
    """--out must be a folder we can write in, checked before any scenario runs (else every row
    would fail with the same OSError and results.json would crash at the end)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".loopfence-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None


def main(args: argparse.Namespace) -> int:
    models = _models(args)
    try:
        scenarios = load_each(args.paths, any_tool=bool(args.mcp or args.mcp_url))
    except ScenarioError as exc:  # a missing path or an empty folder: nothing to run or report
        raise UsageError(str(exc)) from None
    bad = [s for s in scenarios if isinstance(s, ScenarioError)]
    for exc in bad:  # said at once, one line each; the file is an error row and the others run
        stderr.print(f"loopfence drill: error: {printable(exc, DETAIL_CHARS, one_line=True)}", markup=False)
    out = Path(args.out) if args.out else Path("runs") / f"drill-{datetime.now():%Y%m%d-%H%M%S-%f}"
    _writable(out)
    table_console = _console(to_stderr=args.json)
    results = []
    try:
        with open_from_args(args, reserved=known_tool_names()) as mcp:
            for scenario in scenarios:
                row = DrillResult.bad_file(scenario) if isinstance(scenario, ScenarioError) else \
                    run_scenario(scenario, out, models, extra_tools=mcp, header=mcp.header())
                results.append(row)
                if args.json:
                    print(dumps(row.to_json()), file=sys.stdout, flush=True)
    except McpUsageError as exc:
        raise UsageError(str(exc)) from None
    print_table(results, table_console)
    try:
        path = write_results(out, results, [str(p) for p in args.paths])
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    stderr.print(f"logs and results: {printable(path)}", markup=False)
    return 2 if bad else 1 if any(r.failed for r in results) else 0
