"""Shared pieces of the batch tests: a loopback FakeServer that answers each episode by its own
conversation, the episodes that go with it, and a side-effect counter tool module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CALLS = 2  # tool calls of a normal episode before its answer

# Each episode's task says what it is: "episode ID: KIND". The server picks the reply from the
# request itself (FakeServer serves one shared list in order; this overrides only that choice):
#   normal  bump(key=ID-n) while the conversation holds fewer than CALLS tool results, then an answer
#   repeat  bump(key=ID-0) forever (the same call with nothing changed: repeated_call)
#   fresh   bump(key=ID-n) forever (fresh arguments, identical results: repeated_result)
SERVER = textwrap.dedent(f"""
    import re, sys, time
    from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

    DELAY = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0

    class PerEpisode(FakeServer):
        def _next(self, body, headers):
            msgs = [m for m in body.get("messages", []) if isinstance(m, dict)]
            task = next((m.get("content") or "" for m in msgs if m.get("role") == "user"), "")
            found = re.match(r"episode (\\S+): (\\w+)", task)
            if found is None:  # a body cut short (its client was killed mid-send)
                return {{"status": 400, "body": {{"error": {{"message": "not an episode"}}}}}}
            ident, kind = found.groups()
            done = sum(1 for m in msgs if m.get("role") == "tool")
            if DELAY:
                time.sleep(DELAY)
            key = f"{{ident}}-{{done}}"
            if kind == "normal" and done >= {CALLS}:
                return text_reply(f"answer {{ident}}", usage=(40 + done, 5))
            if kind == "repeat":
                key = f"{{ident}}-0"
            return calls_reply(tool_call("bump", key=key), usage=(30 + 10 * done, 8))

    srv = PerEpisode([text_reply("unused")]).start()
    srv._httpd.socket.listen(2048)
    print(srv.base_url, flush=True)
    sys.stdin.read()
""")

# The side-effect counter: every execution appends its key to $BATCH_SIDE_EFFECTS, then waits
# $BATCH_TOOL_SLEEP seconds (a window where the effect happened and its result is not logged yet).
TOOLS_MODULE = textwrap.dedent('''
    import os
    import time
    from loopfence import tool

    def bump(key: str) -> str:
        """Record one side effect under a key.

        Args:
            key: What to record.
        """
        fd = os.open(os.environ["BATCH_SIDE_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (key + "\\n").encode())
        finally:
            os.close(fd)
        time.sleep(float(os.environ.get("BATCH_TOOL_SLEEP") or 0))
        return "ok"

    TOOLS = [tool(bump, kind="side_effect")]
''')


@contextmanager
def episode_server(delay_s: float = 0.0) -> Iterator[str]:
    """The per-episode FakeServer in a child process (a core of its own); yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(delay_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait(10)


def write_tools_module(folder: Path) -> Path:
    (folder / "batch_side_effects.py").write_text(TOOLS_MODULE, encoding="utf-8")
    return folder


def kinds(n: int, every: int = 10, runaways: tuple[str, ...] = ("repeat", "fresh")) -> list[str]:
    """Mostly normal episodes; every `every`-th a runaway (taking turns through `runaways`)."""
    return [runaways[(i // every) % len(runaways)] if i % every == every - 1 else "normal" for i in range(n)]


def write_episodes(path: Path, kinds_: list[str]) -> list[dict[str, Any]]:
    eps = [{"id": f"ep{i:04d}", "task": f"episode ep{i:04d}: {k}", "metadata": {"kind": k, "i": i}}
           for i, k in enumerate(kinds_)]
    path.write_text("".join(json.dumps(e) + "\n" for e in eps), encoding="utf-8")
    return eps


def result_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text(encoding="utf-8").splitlines() if x]


def log_ledgers(out: Path) -> dict[str, dict[str, Any]]:
    """Each episode log's stop ledger, read from the logs themselves (not from the rows)."""
    found = {}
    for p in sorted((out / "episodes").glob("*.jsonl")):
        last = json.loads(p.read_text(encoding="utf-8").splitlines()[-1])
        assert last["event"] == "stop", f"{p} does not end with its stop"
        found[p.stem] = last["ledger"]
    return found


def side_effects(path: Path) -> Counter[str]:
    return Counter(path.read_text(encoding="utf-8").split()) if path.exists() else Counter()
