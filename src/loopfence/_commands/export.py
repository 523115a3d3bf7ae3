"""`loopfence export LOG... --format atif|otlp`: the run in a format other tools read.

One log: one JSON document (ATIF indented). Several logs, or `-o FILE.jsonl`: JSON Lines, one compact
document per log in the order given (a line on stderr for each log that cannot be read, and exit 2 when any could not)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._json import dumps
from .._printable import printable
from .._report._atif import to_atif
from .._log import LogError
from .._log._reader import RunLogFile, read_log
from ._common import DETAIL_CHARS, UsageError, not_the_input, stderr
from .reconcile import warn_out_of_order

__all__ = ["add_parser", "main"]

HELP = "export a run log in another format (ATIF trajectories, OpenTelemetry spans)"
FORMATS = ("atif", "otlp")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help=HELP, description=(
        "Export a run log. --format atif writes an ATIF v1.4 trajectory (Harbor's Agent Trajectory "
        "Interchange Format: schema_version, session_id, agent, steps with tool_calls, "
        "observation.results and metrics). --format otlp gives the run's OpenTelemetry GenAI spans "
        "(invoke_agent, chat, execute_tool; the same spans a live run gives with loopfence.instrument()) "
        "as OTLP/JSON, or sends them to a collector over OTLP/HTTP with --endpoint "
        "(needs loopfence[otel]). Several logs (runs/*.jsonl), or -o FILE.jsonl: JSON Lines, one document "
        "per log. "
        "Exit: 0 written, 1 the output could not be written (standard output), "
        "2 an unreadable log or a usage error (-o the log itself included)."))
    p.add_argument("log", metavar="LOG.jsonl", nargs="+", help="the run log (or several: JSON Lines)")
    p.add_argument("--format", choices=FORMATS, default="atif", help="output format (default: atif)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")
    p.add_argument("--endpoint", metavar="URL", nargs="?", const="", default=None,
                   help="otlp: send to this collector (http://host:4318 or its /v1/traces URL) instead of "
                        "writing; with no URL, where the OTEL_EXPORTER_OTLP_* variables say")
    p.add_argument("--include-content", action="store_true",
                   help="otlp: record the task, replies, tool arguments and results in the spans "
                        "(off by default, as the GenAI conventions ask)")


def main(args: argparse.Namespace) -> int:
    for log in args.log:
        not_the_input(args.output, log)
    if args.format == "otlp":
        return _otlp(args)
    if args.endpoint is not None or args.include_content:
        raise UsageError("--endpoint and --include-content go with --format otlp")
    if len(args.log) > 1 or _jsonl(args.output):
        return _lines(args, lambda log: to_atif(_read(log)))
    try:
        doc = to_atif(_read(args.log[0]))
    except LogError as exc:
        raise UsageError(str(exc)) from None
    text = dumps(doc, indent=2) + "\n"  # a lone surrogate from the log stays escaped
    if args.output:
        _write(args.output, text)
        stderr.print(f"wrote {printable(args.output)} ({len(doc['steps'])} steps, "
                     f"{doc['schema_version']})", markup=False)
    else:
        sys.stdout.write(text)
    return 0


def _jsonl(output: str | None) -> bool:
    """-o FILE.jsonl: JSON Lines, however many logs a glob matched (one log is one line too)."""
    return bool(output) and str(output).endswith(".jsonl")


def _lines(args: argparse.Namespace, convert: Callable[[str], Any]) -> int:
    """Several logs: one compact JSON document per line, on stdout or in -o."""
    lines, bad = [], 0
    for log in args.log:
        try:
            lines.append(dumps(convert(log)) + "\n")
        except LogError as exc:
            stderr.print(f"loopfence export: {printable(exc, DETAIL_CHARS)}", markup=False)
            bad += 1
    if args.output:
        _write(args.output, "".join(lines))
        stderr.print(f"wrote {printable(args.output)} ({len(lines)} of {len(args.log)} logs, JSON Lines)",
                     markup=False)
    else:
        sys.stdout.writelines(lines)
    return 2 if bad else 0


def _read(path: str) -> RunLogFile:
    """The log, read strictly; a warning first when its lines are out of order."""
    log = read_log(path)
    warn_out_of_order(log, "export")
    return log


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--output {path}: {exc.strerror or exc}") from None


def _otlp(args: argparse.Namespace) -> int:
    try:
        from ..otel import send_spans, spans_from_log, to_otlp_json, traces_url
    except ImportError:
        raise UsageError("--format otlp needs OpenTelemetry: pip install 'loopfence[otel]'") from None
    if args.endpoint and args.output:
        raise UsageError("--endpoint sends the spans; -o writes them: pick one")
    if args.endpoint:
        try:
            traces_url(args.endpoint)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if (len(args.log) > 1 or _jsonl(args.output)) and args.endpoint is None:
        return _lines(args, lambda log: to_otlp_json(spans_from_log(_read(log), include_content=args.include_content)))
    try:
        spans = [s for log in args.log for s in spans_from_log(_read(log), include_content=args.include_content)]
    except LogError as exc:
        raise UsageError(str(exc)) from None
    if args.endpoint is not None:
        where = args.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint"
        if not send_spans(spans, args.endpoint or None):
            stderr.print(f"loopfence export: the collector at {printable(where)} did not take "
                         f"the {len(spans)} spans", markup=False)
            return 1
        stderr.print(f"sent {len(spans)} spans to {printable(where)}", markup=False)
        return 0
    text = dumps(to_otlp_json(spans)) + "\n"
    if args.output:
        _write(args.output, text)
        stderr.print(f"wrote {printable(args.output)} ({len(spans)} spans, OTLP/JSON)", markup=False)
    else:
        sys.stdout.write(text)
    return 0
