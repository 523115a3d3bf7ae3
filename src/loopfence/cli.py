"""The `loopfence` command. `cli(argv) -> int`; `main()` is the console script.

Every command that judges something (run, batch, drill, replay, reconcile, resume) lists its exit
codes in its `--help`; those with `--json` write one JSON document (or one object per line) on
stdout and everything meant for people on stderr. A closed stdout (`loopfence drill --json | head`)
ends any command quietly with exit 141 (128 + SIGPIPE, as a shell tool killed by it), handled once,
in `main()`.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import os
import sys

from . import __version__
from ._commands import COMMANDS
from ._commands._common import DETAIL_CHARS, UsageError, stderr
from ._printable import printable
from ._log._writer import LogWriteError

__all__ = ["cli", "main", "BROKEN_PIPE"]

BROKEN_PIPE = 141  # the exit code when whoever reads our stdout has gone (128 + SIGPIPE)
_OUTPUT_ERRORS = {errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EBADF}  # stdout failed


class _Parser(argparse.ArgumentParser):
    """A command's parser: its errors show its own usage, and a mistyped flag its nearest name."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{_nearest(self, message)}\n")


def _nearest(parser: argparse.ArgumentParser, message: str) -> str:
    """`; did you mean --limit?` for the first unknown flag the message names (nothing when none is near)."""
    if not message.startswith("unrecognized arguments: "):
        return ""
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for word in message.removeprefix("unrecognized arguments: ").split():
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            if flag in flags:  # the command's own flag, given before the command
                return f" ({flag} goes after the command: loopfence COMMAND {flag} ...)"
            close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def _parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = _Parser(prog="loopfence", description=(
        "Run LLM tool-calling loops that always end for a named reason, count what ran, "
        "and leave a log that can be replayed, reconciled and resumed."),
        epilog="Exit codes: each command's --help lists its own (2 is always a usage error); a closed "
        f"output pipe (`| head`) ends any command quietly with {BROKEN_PIPE}.")
    parser.add_argument("--version", action="version", version=f"loopfence {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules = {}
    for name in COMMANDS:
        mod = importlib.import_module(f"loopfence._commands.{name}")
        mod.add_parser(sub)
        modules[name.replace("_", "-")] = mod
    return parser, modules


def cli(argv: list[str] | None = None) -> int:
    """Run one `loopfence` command line (`argv` without the program name; default sys.argv[1:]) and
    return its exit code. Usage errors and unwritable run logs are one line on stderr, exit 2."""
    parser, modules = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # a command's own flag mistyped: that command's usage, not the top level's
            chosen = _subparsers(parser).get(getattr(args, "command", None) or "", parser)
            chosen.error(f"unrecognized arguments: {' '.join(extra)}")
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


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main() -> None:
    """The console script: `cli()`'s exit code. A reader that closed our stdout early (`| head`) is
    not an error to show: no traceback, exit 141, and nothing more is written to the closed pipe."""
    try:
        code = cli()
        sys.stdout.flush()  # what print() still buffers fails here, not at interpreter exit
    except BrokenPipeError:
        _stdout_to_devnull()
        code = BROKEN_PIPE
    except SystemExit as exc:  # rich's Console exits (1) on a broken pipe, raised while handling it
        if not isinstance(exc.__context__, BrokenPipeError):
            raise
        _stdout_to_devnull()
        code = BROKEN_PIPE
    except OSError as exc:  # stdout itself failed (a full disk, /dev/full): one line, no traceback
        if exc.filename is not None or exc.errno not in _OUTPUT_ERRORS:
            raise  # a file the command opened, or no write error: not ours to word here
        _stdout_to_devnull()
        sys.stderr.write(f"loopfence: cannot write the output: {exc.strerror or exc}\n")
        code = 1
    sys.exit(code)


def _stdout_to_devnull() -> None:
    """Python flushes stdout at exit; pointed at /dev/null, that flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass

