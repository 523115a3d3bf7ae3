"""What every framework adapter shares: scripts, the capped script source, counters, the tools.

A script is framework-neutral: `turn(i)` gives the model's i-th reply (0-based) as either a list of
calls `[(tool_name, raw_argument_text), ...]` or a final answer text. Each adapter turns that into its
framework's own test-model objects; each tool counts its real executions.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Call", "Turn", "Script", "Source", "CapReached", "Outcome", "Workspace", "CAP",
           "final_text", "calls_of", "describe_exception", "quiet"]

CAP = 10_000  # model calls; the scripted model raises on the next one

Call = tuple[str, str]  # (tool name, raw JSON argument text exactly as the model sent it)
Turn = list[Call] | str  # calls, or a final answer


@dataclass(frozen=True)
class Script:
    name: str
    turn: Callable[[int], Turn]
    kinds: dict[str, str] = field(default_factory=dict)  # loopfence tool kinds by tool name
    note: str = ""


def final_text(t: Turn) -> str | None:
    return t if isinstance(t, str) else None


def calls_of(t: Turn) -> list[Call]:
    return [] if isinstance(t, str) else t


class CapReached(RuntimeError):
    """The scripted model was asked for more replies than the cap allows."""


class Source:
    """Serves a script's turns in order and counts model calls; raises past the cap."""

    def __init__(self, script: Script, cap: int = CAP) -> None:
        self.script = script
        self.cap = cap
        self.calls = 0
        self.capped = False

    def next(self) -> Turn:
        if self.calls >= self.cap:
            self.capped = True
            raise CapReached(f"scripted model cap reached: {self.cap} model calls")
        turn = self.script.turn(self.calls)
        self.calls += 1
        return turn


@dataclass
class Outcome:
    model_calls: int
    executions: int
    ended: str  # how the run ended, in the framework's own terms
    answer: str | None = None  # the final answer, when the run produced one

    @property
    def answered(self) -> bool:
        return bool(self.answer)


class Workspace:
    """A temporary folder with real files, and the tools every framework gets (same functions)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="loopfence-bench-")
        self.root = Path(self._tmp.name)
        (self.root / "app").mkdir()
        (self.root / "app" / "config.py").write_text("DEBUG = False\nPORT = 8080\n", encoding="utf-8")
        (self.root / "src").mkdir()
        (self.root / "src" / "main.ts").write_text("export const main = () => 42;\n", encoding="utf-8")
        self.executions = 0
        self.polls = 0
        self.tools = make_tools(self)

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_tools(ws: Workspace) -> dict[str, Callable[..., Any]]:
    """Plain functions with type hints and Google-style docstrings (smolagents requires the Args)."""

    def read_file(path: str, encoding: str = "utf-8") -> str:
        """Read a text file from the workspace.

        Args:
            path: File path relative to the workspace.
            encoding: Text encoding of the file.
        """
        ws.executions += 1
        target = ws.root / path
        if not target.is_file():
            return json.dumps({"ok": False, "error": "missing_file", "path": path})
        return target.read_text(encoding=encoding)

    def read_page(path: str, page: int) -> str:
        """Read one page of a long document.

        Args:
            path: Document path.
            page: Page number, starting at 1.
        """
        ws.executions += 1
        marker = "end of document" if page >= 5 else f"call read_page with page={page + 1} for more"
        return f"page {page} of 5 of {path}: lorem ipsum {page}\n[{marker}]"

    def job_status(job_id: str) -> str:
        """Check whether a background job has finished.

        Args:
            job_id: The job to check.
        """
        ws.executions += 1
        ws.polls += 1
        return "done" if ws.polls >= 8 else "running"

    def record(note: str) -> str:
        """Record a note.

        Args:
            note: The note to record.
        """
        ws.executions += 1
        return "ok"

    def write_file(path: str, content: str) -> str:
        """Write a text file in the workspace, replacing it.

        Args:
            path: File path relative to the workspace.
            content: The whole new text of the file.
        """
        ws.executions += 1
        target = ws.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {path}"

    def run_tests(path: str) -> str:
        """Run the tests of a module: a line ending in `# ok` is a passing test, `# bug` a failing one.

        Args:
            path: The module, relative to the workspace.
        """
        ws.executions += 1
        target = ws.root / path
        if not target.is_file():
            return f"no module {path}"
        lines = [line.rstrip() for line in target.read_text(encoding="utf-8").splitlines()]
        passed, failed = sum(x.endswith("# ok") for x in lines), sum(x.endswith("# bug") for x in lines)
        return f"{failed} failed, {passed} passed" if failed else f"{passed} passed"

    def noop(i: int) -> str:
        """Do nothing with a number.

        Args:
            i: Any number.
        """
        ws.executions += 1
        return f"ok {i}"

    return {f.__name__: f for f in (read_file, read_page, job_status, record, write_file, run_tests, noop)}


def describe_exception(exc: BaseException) -> str:
    """`ExceptionName: first line of the message`, short enough for a table cell."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text.split(". ")[0]
    text = text if len(text) <= 90 else text[:87] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Send what a framework prints (smolagents logs to the console by default) to /dev/null."""
    with open(os.devnull, "w", encoding="utf-8") as sink, contextlib.redirect_stdout(sink):
        yield
