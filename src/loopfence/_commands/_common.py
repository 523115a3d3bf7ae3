"""Shared CLI pieces: usage errors, limit flags, the live step printer and the summary table."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .._json import loads
from .._limits import Limits, parse_limit
from .._log._schema import (AnswerLine, GateLine, LastAnswerLine, LogEvent, NudgeLine, ReplyLine, RequestLine,
                           ResultLine, RetryLine, StopLine)
from .._printable import markup, printable, rich_text
from .._stops import RunResult

__all__ = ["UsageError", "one_log", "add_profile_flag", "limits_from_flags", "default_log_path", "check_new_log",
           "not_the_input",
           "live_printer", "print_answer", "print_quiet", "print_summary", "print_token_table", "stderr"]

# emoji off: a ":name:" in a model's text stays text (markup is escaped where values are shown)
stderr = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
DETAIL_CHARS = 2_000  # a stop detail or a divergence shown on the console


class UsageError(Exception):
    """Bad command-line input or input file: printed as one line, exit 2."""


def one_log(command: str, logs: list[str]) -> str:
    """The one log a command takes (its positional has nargs="+", so that a glob of several gets a clear
    error, naming the newest of them, rather than "unrecognized arguments")."""
    if len(logs) == 1:
        return logs[0]
    shown = ", ".join(logs[:3]) + (", …" if len(logs) > 3 else "")
    try:
        newest = max(logs, key=lambda p: os.stat(p).st_mtime)
        then = f"; the newest is {newest}"
    except OSError:
        then = ""
    raise UsageError(f"{command} takes one log, got {len(logs)} ({shown}){then}")


def add_profile_flag(p: Any) -> None:
    """`--limits NAME`: the profile that `--limit NAME=VALUE` flags then change (run, batch)."""
    p.add_argument("--limits", metavar="PROFILE", help=f"start from a named set of limits: "
                   f"{', '.join(Limits.profiles())} (default: default); --limit flags change it further, "
                   "e.g. --limits coding --limit max_steps=60 (docs/limit-profiles.md)")


def limits_from_flags(pairs: list[str] | None, base: Limits | None = None, profile: str | None = None) -> Limits:
    """`--limit NAME=VALUE` flags over `base`, or over the `--limits` profile, or over the defaults."""
    if profile is not None:
        try:
            base = Limits.profile(profile)
        except ValueError as exc:
            raise UsageError(f"--limits {profile}: {exc}") from None
    changes: dict[str, Any] = {}
    for text in pairs or []:
        try:
            name, value = parse_limit(text)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        changes[name] = value
    return (base or Limits()).replace(**changes)


def default_log_path(folder: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(folder) / f"run-{stamp}.jsonl"


def check_new_log(path: Path, flag: str = "--log") -> None:
    """A run's new log may replace an empty file or a finished loopfence log, nothing else: a file
    that is not a run log (a script, a source file) or a run that never ended (`loopfence resume`
    continues it) is kept, and the command stops here with a usage error naming it."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return  # a device, a pipe (/dev/null, /dev/stdout): nothing is kept there
        with open(path, "rb") as fh:
            first = fh.readline(1 << 20)
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - (1 << 20)))
            lines = [x for x in fh.read().splitlines() if x.strip()]
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return  # nothing there (or a folder: opening the log says so)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror or exc}") from None
    if size == 0:
        return
    if _event(first) != "header":
        raise UsageError(f"{flag} {path}: the file exists and is not a loopfence run log; it was left as it "
                         "is (choose another path)")
    if not lines or _event(lines[-1]) != "stop":
        raise UsageError(f"{flag} {path}: holds a run that did not end (no stop line); continue it with "
                         f"`loopfence resume {path}`, or choose another path")


def _event(line: bytes) -> Any:
    try:
        value = loads(line)
    except ValueError:
        return None
    return value.get("event") if isinstance(value, dict) else None


def not_the_input(output: str | Path | None, source: str | Path, flag: str = "--output") -> None:
    """A command's output file must not be the file it reads (it would be gone before it was read)."""
    if output is None:
        return
    try:
        same = Path(output).samefile(source)
    except OSError:  # no file there yet: not the input
        same = False
    if same:
        raise UsageError(f"{flag} {output}: that is the input file; write the output somewhere else")


def _short(value: Any, n: int = 80) -> str:
    """One line of at most n characters, escaped for markup (a model's or a tool's text)."""
    text = value if isinstance(value, str) else str(value)
    s = printable(text[: n + 1], one_line=True)  # never the whole of a megabyte result
    return markup(s if len(s) <= n else s[: n - 1] + "…")


def live_printer(console: Console = stderr) -> Callable[[LogEvent], None]:
    """A run's on_event: one line per request, reply, retry, call decision and stop, on stderr. Every value
    that came from a model, a tool or a file is escaped (markup and terminal controls)."""

    def on_event(e: LogEvent) -> None:
        if isinstance(e, RequestLine):
            console.print(f"[dim]step {e.step}[/] · prompt ~{e.prompt_estimate} tokens")
        elif isinstance(e, ReplyLine):
            console.print(f"  [dim]reply[/] finish={_short(e.finish_reason)} "
                          f"prompt={e.usage.prompt_tokens} completion={e.usage.completion_tokens}")
        elif isinstance(e, RetryLine):
            status = f"HTTP {e.status}" if e.status is not None else "no response"
            console.print(f"  [yellow]retry[/] attempt {e.attempt} failed ({status}), next in "
                          f"{e.wait_s:.2f}s: {_short(e.reason)}")
        elif isinstance(e, ResultLine):
            mark = {"executed": "→", "reused": "↺", "refused": "✗", "rejected": "✗"}[e.decision]
            status = "ok" if e.ok else f"error: {_short(e.error)}"
            console.print(f"  {mark} {_short(e.name)} {markup(f'[{e.decision}]')} {status} · {_short(e.content, 60)}")
        elif isinstance(e, GateLine):
            console.print(f"  [yellow]gate[/] {_short(e.name)}: {_short(e.decision)} {_short(e.reason, DETAIL_CHARS)}")
        elif isinstance(e, NudgeLine):
            console.print(f"  [yellow]nudge[/] instead of {_short(e.reason)}: {_short(e.message, DETAIL_CHARS)}")
        elif isinstance(e, AnswerLine):
            why = f": {_short(e.error, DETAIL_CHARS)}" if e.error else ""
            console.print(f"  [yellow]answer[/] {e.decision}{why}")
        elif isinstance(e, LastAnswerLine):
            console.print(f"  [yellow]last answer[/] {e.decision}: {_short(e.detail, DETAIL_CHARS)}")
        elif isinstance(e, StopLine):
            console.print(f"[bold]stop[/] {e.reason} ({e.verdict}): {_short(e.detail, DETAIL_CHARS)}")

    return on_event


def _per_step(result: RunResult) -> list[tuple[int, int]]:
    """(prompt, completion) tokens per reply, from the log's stop event (its last line)."""
    if not result.log_path:
        return []
    try:
        lines = Path(result.log_path).read_text(encoding="utf-8").splitlines()
        stop = loads(lines[-1]) if lines else {}
        return [(int(p), int(c)) for p, c in stop.get("per_step") or []] if stop.get("event") == "stop" else []
    except (OSError, ValueError, TypeError):
        return []


def print_token_table(per_step: list[tuple[int, int]], console: Console = stderr) -> None:
    """Seed 003's table: prompt and completion tokens per turn, and the total."""
    table = Table(title="tokens per turn")
    for name in ("turn", "prompt tokens", "completion tokens"):
        table.add_column(name, justify="right")
    for i, (p, c) in enumerate(per_step, start=1):
        table.add_row(str(i), f"{p:,}", f"{c:,}")
    table.add_row("total", f"{sum(p for p, _ in per_step):,}", f"{sum(c for _, c in per_step):,}",
                  style="bold")
    console.print(table)


def print_summary(result: RunResult, console: Console = stderr,
                  per_step: list[tuple[int, int]] | None = None) -> None:
    led = result.ledger
    table = Table(title="loopfence run", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [("stop", str(result.stop.reason)), ("verdict", str(result.verdict)),
            ("detail", result.stop.detail), ("model requests", led.model_requests),
            ("tool calls requested", led.tool_calls), ("tool executions", led.tool_executions),
            ("reused", led.reused), ("refused", led.refused), ("rejected", led.rejected),
            ("prompt tokens", led.prompt_tokens), ("completion tokens", led.completion_tokens),
            *([("cost", f"${led.cost_usd:.6f}")] if getattr(led, "cost_usd", None) is not None else []),
            *([("nudges", led.nudges)] if getattr(led, "nudges", 0) else []),
            ("elapsed", f"{led.elapsed_s:.2f}s")]
    for k, v in rows:
        table.add_row(k, rich_text(v, DETAIL_CHARS))
    console.print(table)
    steps = _per_step(result) if per_step is None else per_step
    if steps:
        print_token_table(steps, console)
    if result.log_path:
        console.print(f"log: {printable(result.log_path)}", markup=False, highlight=False,
                      overflow="ignore", crop=False)
    if result.final_answer:
        print_answer(result)
    elif getattr(result, "last_answer", None):  # Policy(last_answer=True): salvaged after a KILL, said so, never on stdout
        console.print(f"last answer (not shipped, {result.stop.reason}):", markup=False)
        console.print(printable(result.last_answer), markup=False, highlight=False)
    elif getattr(result, "partial_text", None):  # a reply cut off: its text, said so, never on stdout
        console.print(f"the cut reply's text (not shipped, {result.stop.reason}):", markup=False)
        console.print(printable(result.partial_text), markup=False, highlight=False)


def print_quiet(result: RunResult) -> None:
    """`--quiet`: the final answer alone on stdout; a run with no answer (a KILL) says why on stderr,
    in one line (the stop, its detail and the log), so that silence never means "it failed"."""
    print_answer(result)
    if result.verdict != "SHIP":
        log = f" (log: {result.log_path})" if result.log_path else ""
        stderr.print(f"stop {result.stop.reason} ({result.verdict}): "
                     f"{printable(result.stop.detail, DETAIL_CHARS, one_line=True)}{log}", markup=False)


def print_answer(result: RunResult) -> None:
    """The final answer on stdout (all `--quiet` leaves); it keeps its lines, no terminal control gets through."""
    if result.final_answer:
        print(printable(result.final_answer), file=sys.stdout)
