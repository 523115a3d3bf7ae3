"""The `loopfence` command. `cli(argv) -> int`; `main()` is the console script."""

from __future__ import annotations

import argparse
import importlib
import sys

from ._commands import COMMANDS
from ._commands._common import DETAIL_CHARS, UsageError, stderr
from ._printable import printable
from .runlog._writer import LogWriteError

__all__ = ["cli", "main"]


def _parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="loopfence", description=(
        "Run LLM tool-calling loops that always end for a named reason, count what ran, "
        "and leave a log that can be replayed, reconciled and resumed."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        mod = importlib.import_module(f"loopfence._commands.{name}")
        mod.add_parser(sub)
        modules[name.replace("_", "-")] = mod
    return parser, modules


def cli(argv: list[str] | None = None) -> int:
    parser, modules = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, bad usage exits 2
        return int(exc.code or 0)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(modules[args.command].main(args))  # type: ignore[attr-defined]
    except (UsageError, LogWriteError) as exc:  # bad input, or a run log that cannot be written
        stderr.print(f"loopfence {args.command}: error: {printable(exc, DETAIL_CHARS, one_line=True)}",
                     markup=False)
        return 2
    except KeyboardInterrupt:
        stderr.print("loopfence: interrupted", markup=False)
        return 130


def main() -> None:
    sys.exit(cli())
