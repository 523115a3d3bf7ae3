"""The four misbehaving stub tools (seed 004): each breaks a naive loop in one way tools really do.

| tool | behaviour | kind |
| ok_forever(n=0) | returns "ok" | side_effect |
| big_output(kb=300) | returns that many KB of text | read_only |
| sleep(seconds=300) | sleeps; runs in a child process so the timeout stops the work | side_effect |
| raise_after_write(path="out.txt") | writes a file in the workspace, then raises | side_effect |
"""

# No `from __future__ import annotations` here: tool() reads these signatures at runtime and
# must see the Annotated constraints as objects, not strings.
import time
from pathlib import Path
from typing import Annotated

from pydantic import Field

from ..tools._registry import Tool, tool

__all__ = ["STUB_NAMES", "stub_tools"]

STUB_NAMES = ("ok_forever", "big_output", "sleep", "raise_after_write")

_LINE = "".join(f"{i:04d} the quick brown fox jumps over the lazy dog; log line of a wide dump.\n"
                for i in range(16))


def ok_forever(n: int = 0) -> str:
    """Do a healthy-looking no-op and answer "ok"."""
    return "ok"


def big_output(kb: Annotated[int, Field(ge=0, le=10_240)] = 300) -> str:
    """Return `kb` kilobytes of text (a log dump, a DOM snapshot, a wide query result)."""
    size = kb * 1024
    return (_LINE * (size // len(_LINE) + 1))[:size]


def sleep(seconds: Annotated[float, Field(ge=0, le=3_600)] = 300) -> str:
    """Wait `seconds` seconds (a hung dependency), then answer."""
    time.sleep(seconds)
    return f"slept {seconds:g}s"


def stub_tools(root: str | Path, names: list[str] | tuple[str, ...] | None = None) -> list[Tool]:
    """The stub tools bound to one workspace folder (raise_after_write writes there)."""
    base = Path(root).resolve()

    def raise_after_write(path: str = "out.txt") -> str:
        """Write a file in the workspace, then fail: a partial side effect behind an error."""
        target = (base / path).resolve()
        if target == base or base not in target.parents:
            raise PermissionError(f"{path!r} is outside the workspace; nothing was written")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"partial write by raise_after_write at {time.time():.3f}\n", encoding="utf-8")
        raise RuntimeError(f"raise_after_write failed after writing {path}")

    made = [
        tool(ok_forever, kind="side_effect"),
        tool(big_output, kind="read_only"),
        tool(sleep, kind="side_effect", isolation="process"),
        tool(raise_after_write, kind="side_effect"),
    ]
    return [t for t in made if names is None or t.name in names]
