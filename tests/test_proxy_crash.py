"""kill -9 `loopfence proxy` in the middle of a run, restart it on the same --logs folder and port, and
the client's loop goes on as if nothing happened: the same run (one id, one log), with its ledger as it
was (the run ends at the same turn, with the same executions and the same stop as a run never
interrupted, so counts and repeat state survived), no request answered twice (one request line and
one reply line per turn the client was answered), and every log reconciles.

The kill comes between two requests, or while a request is in flight: the upstream holds that
request's reply until the proxy is dead, so the client's connection breaks and it sends the same
request again to the restarted proxy. The client is a plain HTTP loop (as an agent written against
the wire is), executing the bench's tools for real. Two trials run in every suite; twenty (five
scripts, two kill points each, both kinds of kill) under the slow marker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence import tool
from loopfence.runlog import read_log

from _proxy_support import Proxy, ScriptServer, kinds_file, logs_in, reconciles, run_calls, task
from bench.common import Workspace  # _proxy_support put the root on sys.path

HOLD_S = 120.0  # how long the upstream holds a reply for the kill: bounds a failure, not a speed


class HeldServer(ScriptServer):
    """ScriptServer that, when `hold` names (task, turn), holds that request's reply until `release`
    is set, and sets `arrived` when it comes in."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: tuple[str, int] | None = None
        self.arrived, self.release = threading.Event(), threading.Event()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        form = super()._next(body, headers)
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if self.hold is not None and self.hold[1] == turn and any(m.get("content") == self.hold[0] for m in messages):
            self.hold = None
            self.arrived.set()
            self.release.wait(HOLD_S)
        return form


@dataclass
class Ended:
    """How a client's run ended: its answer, turns, executions, and every X-Loopfence-Run it saw."""

    answer: str | None = None
    turns: int = 0
    executions: int = 0
    runs: set[str] = field(default_factory=set)
    kills: int = 0


class Fence:
    """The upstream and one `loopfence proxy` on a fixed port and logs folder, restarted after a kill."""

    def __init__(self, upstream: HeldServer, tmp: Path) -> None:
        self.upstream, self.tmp, self.logs = upstream, tmp, tmp / "logs"
        self.args = ["--upstream", upstream.base_url, "--logs", str(self.logs), "--kinds", str(kinds_file(tmp))]
        self.proxy = Proxy(*self.args, stderr=tmp / "proxy.err")
        self.port = self.proxy.base_url.rsplit(":", 1)[1].split("/")[0]
        self.args += ["--port", self.port]  # restarts listen where the first start did (the last --port wins)

    def restart(self) -> None:
        self.proxy.kill()  # kill -9 (a no-op if the killer thread already did)
        self.proxy = Proxy(*self.args, stderr=self.tmp / "proxy.err")
        assert self.proxy.base_url.endswith(f":{self.port}/v1"), self.proxy.line

    def close(self) -> None:
        self.proxy.stop()


def client_loop(fence: Fence, name: str, ws: Workspace, tag: str, *, kill_at: int | None = None,
                mid_request: bool = False, turns: int = 40, headers: dict[str, str] | None = None) -> Ended:
    """The script's conversation over plain HTTP, tools run for real; with `kill_at`, the proxy is killed
    -9 before that turn's request (between requests) or while it is in flight (`mid_request`), then
    restarted, and the request that broke is sent again. `headers`: sent with every request."""
    schemas = [tool(fn).schema() for fn in ws.tools.values()]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."},
                                      {"role": "user", "content": task(name, tag)}]
    ended = Ended()
    for turn in range(turns):
        if turn == kill_at and not mid_request:
            fence.restart()
            ended.kills += 1
        elif turn == kill_at:
            killer = threading.Thread(target=_kill_when_held, args=(fence, task(name, tag), turn), daemon=True)
            killer.start()
        body = {"model": "fake", "messages": messages, "tools": schemas}
        try:
            response = httpx.post(f"{fence.proxy.base_url}/chat/completions", json=body, timeout=HOLD_S,
                                  headers=headers)
        except httpx.TransportError:  # the proxy died with our request in flight: the same request again
            assert turn == kill_at and mid_request
            fence.restart()
            ended.kills += 1
            response = httpx.post(f"{fence.proxy.base_url}/chat/completions", json=body, timeout=HOLD_S,
                                  headers=headers)
        assert response.status_code == 200, response.text
        ended.runs.add(response.headers["x-loopfence-run"])
        message = response.json()["choices"][0]["message"]
        messages.append(message)
        ended.turns = turn + 1
        if not message.get("tool_calls"):
            ended.answer = message.get("content")
            return ended
        ended.executions += run_calls(ws, message, messages)
    pytest.fail(f"{name}: no answer in {turns} turns")


def _kill_when_held(fence: Fence, prompt: str, turn: int) -> None:
    fence.upstream.release.clear()
    fence.upstream.arrived.clear()
    fence.upstream.hold = (prompt, turn)
    if fence.upstream.arrived.wait(HOLD_S):
        fence.proxy.proc.kill()  # kill -9 while the request is in flight
    fence.upstream.release.set()


@pytest.fixture(scope="module")
def fence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fence]:
    with HeldServer() as upstream:
        f = Fence(upstream, tmp_path_factory.mktemp("proxy-crash"))
        try:
            yield f
        finally:
            f.close()


@pytest.fixture(scope="module")
def uninterrupted(fence: Fence) -> dict[str, Ended]:
    """Each script once without a kill: what every trial must end with."""
    out = {}
    for name in SCRIPTS:
        with Workspace() as ws:
            out[name] = client_loop(fence, name, ws, "uninterrupted")
    return out


SCRIPTS = ["ok_forever", "ping_pong", "edit_and_test", "polling_8", "retry_storm"]
# (script, the turn before which or during which the proxy dies, killed mid-request)
TRIALS = [(name, at, mid) for name in SCRIPTS for at in (1, 2) for mid in (False, True)]
QUICK = [("ping_pong", 2, True), ("edit_and_test", 3, False)]


COUNTS = ("model_requests", "tool_calls", "tool_executions", "reused", "refused", "rejected")


def _finished_log(fence: Fence, ended: Ended) -> tuple[Path, dict[str, Any]]:
    """The one log of the client's run (one run id across the restart): it reconciles, and it holds
    one request line and one reply line per request forwarded (steps 1..n, none twice). Returns the
    log and its ledger's counts."""
    assert len(ended.runs) == 1, ended.runs
    log = fence.logs / f"{next(iter(ended.runs))}.jsonl"
    reconciles(log)
    run = read_log(log)
    assert run.stop is not None
    counts = {k: run.stop.ledger[k] for k in COUNTS}
    for kind in ("request", "reply"):
        steps = [e.step for e in run.events if e.event == kind]
        assert steps == list(range(1, counts["model_requests"] + 1)), (kind, steps)
    assert counts["model_requests"] in (ended.turns, ended.turns - 1)  # the last: answered by a stop, or forwarded
    assert counts["tool_executions"] == ended.executions
    return log, counts


def _trial(fence: Fence, uninterrupted: dict[str, Ended], name: str, at: int, mid: bool) -> None:
    before = set(logs_in(fence.logs))
    with Workspace() as ws:
        ended = client_loop(fence, name, ws, f"killed at {at} {mid}", kill_at=at, mid_request=mid)
    same = uninterrupted[name]
    assert ended.kills == 1
    assert (ended.answer, ended.turns, ended.executions) == (same.answer, same.turns, same.executions)
    log, counts = _finished_log(fence, ended)
    assert sorted(set(logs_in(fence.logs)) - before) == [log]  # no second run, no stray log
    assert counts == _finished_log(fence, same)[1]  # the ledger as if never killed


@pytest.mark.parametrize(("name", "at", "mid"), QUICK, ids=[f"{n}-turn{a}-{'mid' if m else 'between'}"
                                                          for n, a, m in QUICK])
def test_a_run_goes_on_after_kill_9_and_restart(fence: Fence, uninterrupted: dict[str, Ended], name: str, at: int,
                                                mid: bool) -> None:
    _trial(fence, uninterrupted, name, at, mid)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "at", "mid"), TRIALS, ids=[f"{n}-turn{a}-{'mid' if m else 'between'}"
                                                           for n, a, m in TRIALS])
def test_twenty_kill_9_trials(fence: Fence, uninterrupted: dict[str, Ended], name: str, at: int, mid: bool) -> None:
    _trial(fence, uninterrupted, name, at, mid)


def test_a_finished_run_with_the_same_conversation_does_not_take_over_after_a_restart(tmp_path: Path) -> None:
    """Two clients send the same conversation: the first run finishes (named by the header "zzzz-twin",
    so the restart reads its log after the other's), the second is killed between two requests. After
    the restart the second run goes on under its own id, with the counts of the first."""
    with HeldServer() as upstream:
        fence = Fence(upstream, tmp_path)
        try:
            with Workspace() as ws:
                first = client_loop(fence, "ping_pong", ws, "twin", headers={"X-Loopfence-Run": "zzzz-twin"})
            with Workspace() as ws:
                ended = client_loop(fence, "ping_pong", ws, "twin", kill_at=2)
        finally:
            fence.close()
    assert first.runs == {"zzzz-twin"} and ended.runs != first.runs
    assert (ended.answer, ended.turns, ended.executions, ended.kills) == (first.answer, first.turns, first.executions, 1)
    assert _finished_log(fence, ended)[1] == _finished_log(fence, first)[1]
    assert len(logs_in(fence.logs)) == 2


def test_every_log_reconciles(fence: Fence, uninterrupted: dict[str, Ended]) -> None:
    """After the trials (this test runs last in the file): every run the proxy logged is finished."""
    for log in logs_in(fence.logs):
        reconciles(log)
