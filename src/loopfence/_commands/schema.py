"""`loopfence schema events`: the JSON Schema of one run-log line, from the log's own models."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._json import dumps
from .._log._schema import events_schema
from ._common import UsageError

__all__ = ["add_parser", "main"]

HELP = "print the JSON Schema of a run-log line"
SCHEMAS = {"events": events_schema}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("schema", help=HELP, description=(
        "Print a JSON Schema (draft 2020-12) on standard output. `events`: one line of a run log "
        "(a union on the field \"event\": header, request, reply, call, result, gate, resume, retry, "
        "nudge, last_answer, guard, stop); the header's \"version\" says which format a log is in. "
        "Exit: 0 printed, 1 the output could not be written, 2 usage error."))
    p.add_argument("what", metavar="SCHEMA", help=f"which schema: {', '.join(SCHEMAS)}")


def main(args: argparse.Namespace) -> int:
    if args.what not in SCHEMAS:
        raise UsageError(f"no schema named {args.what!r}; there is: {', '.join(SCHEMAS)} "
                         "(`loopfence schema events`)")
    sys.stdout.write(dumps(SCHEMAS[args.what](), indent=2) + "\n")
    return 0
