"""Helpers for tests/test_mcp*.py: the real MCP server (tests/_mcp_server.py) and what it saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

SERVER = Path(__file__).resolve().parent / "_mcp_server.py"

pytest.importorskip("mcp", reason="loopfence[mcp] is not installed")


def server(log: Path, *args: str, **options: Any) -> Any:
    """An McpServer spec for the test server (stdio), recording its calls in `log`."""
    from loopfence.mcp import McpServer

    return McpServer.stdio([sys.executable, str(SERVER), *args], env={"MCP_TEST_LOG": str(log)}, **options)


def seen(log: Path) -> list[dict[str, Any]]:
    """What the servers recorded: one dict per call, cancel or start."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]


def calls(log: Path, tool: str, server_name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in seen(log) if e.get("tool") == tool and "cancelled" not in e
            and (server_name is None or e.get("server") == server_name)]


def wait_for(what: Callable[[], Any], limit_s: float = 30.0) -> Any:
    """Poll until `what()` is truthy (a condition, not a speed: the limit only bounds a failure)."""
    end = time.monotonic() + limit_s
    while True:
        value = what()
        if value or time.monotonic() > end:
            return value
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaped is gone too, as far as work goes
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def pids(log: Path, server_name: str | None = None) -> list[int]:
    return [e["pid"] for e in seen(log) if e.get("event") == "started"
            and (server_name is None or e.get("server") == server_name)]


@contextmanager
def http_server(log: Path, *args: str) -> Iterator[str]:
    """The test server over Streamable HTTP on 127.0.0.1 (a process of its own); yields its URL."""
    env = {**os.environ, "MCP_TEST_LOG": str(log)}
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("PORT "), f"the HTTP test server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
