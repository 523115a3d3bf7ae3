"""What the proxy's end-to-end tests share (tests/test_proxy_*.py): the bench's scripts served by a
real FakeServer on 127.0.0.1, `loopfence proxy` started as a real process in front of it, the
TypeScript loop (tests/ts/loop.ts) run with node, and the checks every log must pass.

The upstream picks each reply from the request itself: the script is named in the task ("Run the
bench script NAME."), and the turn is the number of assistant messages the conversation already
holds. So the proxy's own forwarding (which run id it sends, whether it sends one) and a restart of
the proxy change nothing about which reply comes next. Call ids are unique in a conversation
(`call_<turn>_<j>`): a real model never reuses one, and the proxy may refuse a request that does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopfence.cli import cli
from loopfence.runlog import read_log
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Script, calls_of, final_text  # noqa: E402
from bench.scripts import HONEST, RUNAWAY  # noqa: E402

__all__ = ["ROOT", "TS", "SCRIPTS", "Ended", "KINDS", "REASONS", "stops_at_the_minimum", "ScriptServer", "Proxy", "task", "kinds_file", "seed_workspace",
           "node_modules", "run_loop", "node_script", "logs_in", "reconciles", "replays", "first_json", "run_calls",
           "ReplyServer", "reset_all", "ended", "built", "wire_proxy", "bench_run_ended"]

TS = ROOT / "tests" / "ts"
SCRIPTS: dict[str, Script] = {s.name: s for s in RUNAWAY + HONEST}
KINDS: dict[str, str] = {name: kind for s in RUNAWAY + HONEST for name, kind in s.kinds.items()}
# The rules' minimum without a cache (a fence on the wire cannot serve a recorded result): the runaways
# stop after 2, 2, at most 6, 0, 0 and at most 6 (ping-pong) executions; the reasons they may name.
_EXECUTIONS = {"retry_storm": 2, "duplicate_args": 2, "unknown_tool": 0, "truncated_json": 0}
_AT_MOST = {"ok_forever": 6, "ping_pong": 6}
REASONS = {"retry_storm": {"no_progress", "repeated_call"}, "duplicate_args": {"no_progress", "repeated_call"},
           "ok_forever": {"repeated_result"}, "unknown_tool": {"unknown_tool"}, "truncated_json": {"invalid_json"},
           "ping_pong": {"repeated_result", "repeated_call", "cycle"}}
START_S = 120.0  # how long a process may take to start here: bounds a failure on a busy machine, not a speed
_LISTENING = re.compile(r"^loopfence proxy: listening on (http://\S+/v1) \(upstream: .*\)$")
_TASK = re.compile(r"Run the bench script (\w+)\.")


@dataclass
class Ended:
    """How a client's conversation ended: its answer, turns, executions, run, stop, and the 502/503
    bodies it met on the way (then retried)."""

    answer: str | None = None
    turns: int = 0
    executions: int = 0
    run: str = ""
    stop: str | None = None
    outages: list[dict[str, Any]] = field(default_factory=list)


def stops_at_the_minimum(name: str, executions: int, reason: str | None) -> None:
    """A runaway script's run executed the rules' minimum without a cache and named one of its reasons."""
    if name in _EXECUTIONS:
        assert executions == _EXECUTIONS[name], (name, executions)
    else:
        assert 0 < executions <= _AT_MOST[name], (name, executions)
    assert reason in REASONS[name], (name, reason)


def task(name: str, tag: str = "") -> str:
    """The user message that makes ScriptServer serve the script `name`; `tag` tells apart two runs of
    one script (the proxy takes a conversation it has seen before for the same run)."""
    return f"Run the bench script {name}.{tag and ' ' + tag}"


def kinds_file(folder: Path, kinds: dict[str, str] = KINDS) -> Path:
    """A --kinds TOML file (tool name = kind) in `folder`."""
    path = folder / "kinds.toml"
    path.write_text("".join(f'{name} = "{kind}"\n' for name, kind in sorted(kinds.items())), encoding="utf-8")
    return path


class ScriptServer(FakeServer):
    """The bench's scripts over real HTTP: the reply to a request is its script's next turn, picked from
    the request itself (the task names the script; the assistant messages so far are the turn).
    `by_script[name]`: the chat requests that reached this upstream for each script."""

    def __init__(self, scripts: dict[str, Script] = SCRIPTS) -> None:
        super().__init__([text_reply("unused")])
        self.scripts = scripts
        self.by_script: dict[str, int] = {}

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        found = next((_TASK.search(str(m.get("content"))) for m in messages if m.get("role") == "user"), None)
        name = found.group(1) if found else ""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self.by_script[name] = self.by_script.get(name, 0) + 1
        if name not in self.scripts:
            return text_reply(f"no bench script named in this conversation ({name!r})")
        turn_no = sum(1 for m in messages if m.get("role") == "assistant")
        turn = self.scripts[name].turn(turn_no)
        text = final_text(turn)
        if text is not None:
            return text_reply(text, usage=(40 + 10 * turn_no, 5))
        calls = [tool_call(n, raw, id=f"call_{turn_no}_{j}") for j, (n, raw) in enumerate(calls_of(turn))]
        return calls_reply(*calls, usage=(40 + 10 * turn_no, 12))


class ReplyServer(FakeServer):
    """An upstream whose reply to each request is `reply(body)` (a FakeServer reply form), over real
    HTTP; `requests` holds every body it got."""

    def __init__(self, reply: Any) -> None:
        super().__init__([text_reply("unused")])
        self.reply = reply

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
        return self.reply(body)


class Proxy:
    """`loopfence proxy` as a real process: started with `args` (under `wrap`, a command such as
    `prlimit --as=...`), its base URL read from the one line it prints. `stop()` sends SIGTERM and checks it exits 0; `kill()` is kill -9. stderr goes to a file."""

    def __init__(self, *args: str, stderr: Path, wrap: tuple[str, ...] = ()) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
        self.stderr_path = stderr
        self.logs = Path(args[args.index("--logs") + 1]) if "--logs" in args else None  # its --logs folder
        self._err = stderr.open("ab")
        self.proc = subprocess.Popen([*wrap, sys.executable, "-m", "loopfence", "proxy", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=self._err, stdin=subprocess.DEVNULL, env=env)
        self.line = self._first_line()
        found = _LISTENING.match(self.line)
        if not found:
            self.kill()
            pytest.fail(f"loopfence proxy printed {self.line!r}, not its URL; stderr: {self.stderr()}")
        self.base_url = found.group(1)
        assert self.proc.stdout is not None  # the address each kind of client takes: printed with the first
        hint = self.proc.stdout.readline().decode("utf-8", "replace")
        anthropic = re.search(r"ANTHROPIC_BASE_URL=(\S+?);", hint)
        assert anthropic is not None, hint
        self.anthropic_url = anthropic.group(1)  # as printed: what ANTHROPIC_BASE_URL is set to

    def _first_line(self) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(START_S):
                self.kill()
                pytest.fail(f"loopfence proxy printed nothing in {START_S:.0f} s; stderr: {self.stderr()}")
        return self.proc.stdout.readline().decode("utf-8", "replace").rstrip("\n")

    def stderr(self) -> str:
        self._err.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> int:
        """SIGTERM, then its exit status (checked: 0), once it is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"loopfence proxy did not exit on SIGTERM; stderr: {self.stderr()}")
        self._close()
        assert rc == 0, f"loopfence proxy exited {rc} on SIGTERM; stderr: {self.stderr()}"
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.stop()
        else:
            self.kill()


def tag(key: str) -> str:
    """The tag a client key puts before the ids of the runs it names (`_runs.id_base`)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def seed_workspace(folder: Path) -> Path:
    """The files the bench's scripts read (as bench.common.Workspace lays them)."""
    (folder / "app").mkdir(parents=True, exist_ok=True)
    (folder / "app" / "config.py").write_text("DEBUG = False\nPORT = 8080\n", encoding="utf-8")
    (folder / "src").mkdir(exist_ok=True)
    (folder / "src" / "main.ts").write_text("export const main = () => 42;\n", encoding="utf-8")
    return folder


def built(path: Path, target: str, ready: bool | None = None) -> Path:
    """`path`, which `make TARGET` installs (`make test` does), if it is there (or `ready` says so).
    Missing: the test fails under CI and skips elsewhere, naming the target."""
    if path.exists() if ready is None else ready:
        return path
    message = f"{path.relative_to(ROOT)} is not installed: run `make {target}` (make test does)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def node_modules() -> Path:
    """tests/ts/node_modules (`npm ci` there; `make ts-deps`)."""
    path = TS / "node_modules"
    return built(path, "ts-deps", (path / ".bin" / "tsx").exists() and (path / "openai").is_dir())


def node_script(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A TypeScript file under tests/ts run with node (tsx as its loader)."""
    node_modules()
    return subprocess.run(["node", "--import", "tsx", str(script), *args], cwd=TS, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **(env or {})))


def run_loop(base_url: str, workspace: Path, prompt: str, **env: str) -> dict[str, Any]:
    """tests/ts/loop.ts against `base_url`: its summary (answer, turns, executions, stop, run, and
    error/status after an HTTP error) with its exit code as `rc`."""
    done = node_script(TS / "loop.ts", base_url, str(workspace), prompt, env=env)
    summary = first_json(done.stdout.splitlines()[-1:] or [""], done)
    return dict(summary, rc=done.returncode, stderr=done.stderr)


def first_json(lines: list[str], done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return json.loads(lines[0])
    except (ValueError, IndexError):
        pytest.fail(f"no JSON summary (exit {done.returncode}); stdout: {done.stdout[-2000:]!r}; "
                    f"stderr: {done.stderr[-2000:]!r}")


def logs_in(folder: Path) -> list[Path]:
    """The run logs the proxy left in its --logs folder."""
    return sorted(folder.glob("*.jsonl"))


def reconciles(log: Path) -> None:
    """`loopfence reconcile LOG` exits 0: every invariant holds and the run is finished."""
    assert cli(["reconcile", str(log)]) == 0, f"{log.name} does not reconcile"


def replays(log: Path) -> None:
    """`loopfence replay LOG` exits 0: the rules, fed the recorded traffic, reach the same stop."""
    assert cli(["replay", str(log)]) == 0, f"{log.name} does not replay"



def reset_all(base_url: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """POST /loopfence/runs/{id}/reset for every run the client sees (an agent's episode is over:
    each run ends, its log gets its stop line): what each reset returned."""
    import httpx

    root = base_url.removesuffix("/v1")
    listed = httpx.get(f"{root}/loopfence/runs", headers=headers, timeout=30).json()["data"]
    out = []
    for run in listed:
        r = httpx.post(f"{root}/loopfence/runs/{run['id']}/reset", headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


@contextlib.contextmanager
def wire_proxy(server: Any, wire: str, tmp: Path) -> Iterator[tuple[Any, Proxy, Path]]:
    """`server` (a FakeServer of another wire, serving the bench's scripts) and `loopfence proxy` in
    front of it as that wire's upstream: (the server, the proxy, its log folder)."""
    with server as up, Proxy("--upstream", f"{wire}={up.root}", "--logs", str(tmp / "logs"),
                             "--kinds", str(kinds_file(tmp)), stderr=tmp / "err") as proxy:
        yield up, proxy, tmp / "logs"


def bench_run_ended(script: Any, ended: Ended, logs: Path, wire: str) -> None:
    """A bench script's conversation over `wire`: a runaway stopped at the rules' minimum, a legitimate
    one finished; its log reconciles, replays and records the wire."""
    log = logs / f"{ended.run}.jsonl"
    if script.name in _EXECUTIONS or script.name in _AT_MOST:
        assert ended.stop is not None and ended.answer is not None and ended.answer.startswith("[loopfence stop]")
        stops_at_the_minimum(script.name, ended.executions, ended.stop)
    else:
        assert ended.stop is None and ended.answer and not ended.answer.startswith("[loopfence stop]"), ended
        stop = read_log(log).stop
        assert stop is not None and stop.reason == "final_answer"
    reconciles(log)
    replays(log)
    assert read_log(log).header.record["proxy"]["wire"] == wire


def ended(base_url: str, logs: Path) -> list[Path]:
    """The client is done: its runs end (the reset route); every log in `logs` reconciles and replays."""
    reset_all(base_url)
    found = logs_in(logs)
    for log in found:
        reconciles(log)
        replays(log)
    return found


def run_calls(ws: Any, message: dict[str, Any], messages: list[dict[str, Any]]) -> int:
    """The calls of an assistant message run for real with `ws.tools`, each result appended to
    `messages` as a tool message: how many ran."""
    for call in message.get("tool_calls") or []:
        result = ws.tools[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
    return len(message.get("tool_calls") or [])
