"""`loopfence export LOG --format atif`: the run as an interchange trajectory other tools read."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .._json import dumps
from .._printable import printable
from ..runlog._atif import to_atif
from ..runlog._events import LogError
from ._common import UsageError, stderr

__all__ = ["add_parser", "main"]

HELP = "export a run log in another format (ATIF trajectories)"
FORMATS = ("atif",)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help=HELP, description=(
        "Export a run log. --format atif writes an ATIF v1.4 trajectory (Harbor's Agent Trajectory "
        "Interchange Format: schema_version, session_id, agent, steps with tool_calls, "
        "observation.results and metrics)."))
    p.add_argument("log", metavar="LOG.jsonl", help="the run log")
    p.add_argument("--format", choices=FORMATS, default="atif", help="output format (default: atif)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")


def main(args: argparse.Namespace) -> int:
    try:
        doc = to_atif(args.log)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    text = dumps(doc, indent=2) + "\n"  # a lone surrogate from the log stays escaped
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output {args.output}: {exc.strerror or exc}") from None
        stderr.print(f"wrote {printable(args.output)} ({len(doc['steps'])} steps, "
                     f"{doc['schema_version']})", markup=False)
    else:
        sys.stdout.write(text)
    return 0
