"""Helpers for the run-log tests (replay, reconcile, resume, export): real runs, real logs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loopfence import Limits, RunLog, ScriptedModel, run, tool, workspace_tools
from loopfence.tools import Tool
from loopfence.testing import calls_reply, text_reply, tool_call

__all__ = ["make_workspace", "counter_tools", "record", "read_lines", "write_lines", "edit_events",
           "config_script", "counter_script"]


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "app").mkdir(parents=True, exist_ok=True)
    (ws / "app" / "config.py").write_text("DEBUG = True\n", encoding="utf-8")
    (ws / "README.md").write_text("# demo\n", encoding="utf-8")
    return ws


def counter_tools(counter: Path) -> list[Tool]:
    """A side-effecting tool that appends a line to a file, and a read-only one that reads it."""

    def append_line(text: str) -> str:
        """Append one line to the counter file."""
        with counter.open("a", encoding="utf-8") as fh:
            fh.write(text + "\n")
        return f"appended {text}"

    def read_counter() -> str:
        """Read the counter file."""
        return counter.read_text(encoding="utf-8") if counter.exists() else ""

    return [tool(append_line, kind="side_effect"), tool(read_counter, kind="read_only")]


def config_script() -> list[dict[str, Any]]:
    """Read, re-read in another spelling (reused), list, answer."""
    return [calls_reply(tool_call("read_file", path="app/config.py"), usage=(50, 10)),
            calls_reply(tool_call("list_dir"), tool_call("read_file", path="app/config.py", encoding="utf-8")),
            text_reply("DEBUG is True", usage=(90, 5))]


def counter_script(n: int = 4) -> list[dict[str, Any]]:
    replies = [calls_reply(tool_call("append_line", text=f"line-{i}"), tool_call("read_counter"))
               for i in range(n)]
    return [*replies, text_reply(f"wrote {n} lines")]


def record(path: Path, replies: Sequence[Any], tools: Sequence[Tool] | None = None, *,
           workspace: Path | None = None, limits: Limits | None = None, task: str = "Read app/config.py",
           **kwargs: Any) -> Any:
    """One real run through the ring, logged to `path`."""
    tools = list(tools) if tools is not None else workspace_tools(workspace or path.parent)
    header = {"workspace": str(workspace.resolve())} if workspace else None
    return run(task, model=ScriptedModel(list(replies)), tools=tools, limits=limits or Limits(),
               log=RunLog(path), header=header, **kwargs)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events), encoding="utf-8")


def edit_events(src: Path, dst: Path, change: Callable[[list[dict[str, Any]]], None]) -> Path:
    """A hand-edited copy of a log."""
    events = read_lines(src)
    change(events)
    write_lines(dst, events)
    return dst
