"""Many proxies, one fence: `loopfence proxy --state redis://...` replicas on one real redis-server,
behind a round-robin front (tests/_front.py), in front of a real upstream on 127.0.0.1.

Each replica is a real `loopfence proxy` process; the front sends each request to the next replica in
turn, so the requests of one conversation land on every replica. Checked: the bench's scripts stop
where one process stops them and the legitimate ones finish; a budget with room for 10 lets exactly 10
of 50 concurrent requests through; 10 copies of one request reach the upstream once; Redis killed and
restarted under load, and a replica killed -9 mid-request, lose and double nothing; a store that lost
its data fails closed; idle runs expire and their logs stay.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from _front import Front
from _proxy_support import (
    Ended,
    Proxy,
    tag,
    ScriptServer,
    kinds_file,
    reconciles,
    replays,
    run_calls,
    stops_at_the_minimum,
    task,
)
from _redis_support import RedisServer

from bench.common import Workspace  # _proxy_support put the root on sys.path
from bench.scripts import HONEST, RUNAWAY
from loopfence import tool
from loopfence._log import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

pytestmark = pytest.mark.slow

TRIALS = 20
HOLD_S = 120.0  # how long the upstream holds a reply for a kill: bounds a failure, not a speed
LEASE = "1"  # seconds a killed replica holds its run (short: the trials wait it out)
BUDGET = 10  # max_steps: the budget the race trials meet
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


class Upstream(ScriptServer):
    """The bench's scripts (ScriptServer), and for a conversation whose first user message starts with
    "race:<tag>", a fresh read_file call each time (counted per tag in `by_tag`; "race:text-<tag>": a
    fresh text answer). `hold` names a
    (task, turn) whose reply waits for `release`, setting `arrived` when it comes in."""

    def __init__(self) -> None:
        super().__init__()
        self.by_tag: dict[str, int] = {}
        self.hold: tuple[str, int] | None = None
        self.arrived, self.release = threading.Event(), threading.Event()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        first = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        if first.startswith("race:"):
            tag = first.split()[0]
            with self._lock:
                self.requests.append(body)
                self.by_tag[tag] = k = self.by_tag.get(tag, 0) + 1
            if tag.startswith("race:copies"):  # held, so that the copies are in flight at once
                time.sleep(0.5)
            if tag.startswith("race:text-"):  # answered in text
                return text_reply(f"answer {k}")
            return calls_reply(tool_call("read_file", {"path": f"p{k}"}, id=f"call_{k}"))
        form = super()._next(body, headers)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if self.hold is not None and self.hold[1] == turn and any(m.get("content") == self.hold[0] for m in messages):
            self.hold = None
            self.arrived.set()
            self.release.wait(HOLD_S)
        return form


@dataclass
class Replicas:
    """Three `loopfence proxy --state redis://` replicas behind one round-robin front."""

    upstream: Upstream
    redis: RedisServer
    tmp: Path
    args: list[str] = field(default_factory=list)
    procs: list[Proxy] = field(default_factory=list)
    front: Front | None = None

    def start(self, n: int = 3) -> None:
        self.args = ["--upstream", self.upstream.base_url, "--logs", str(self.tmp / "logs"), "--kinds",
                     str(kinds_file(self.tmp)), "--state", self.redis.url, "--lease", LEASE,
                     "--limit", f"max_steps={BUDGET}"]
        self.procs = [self.spawn(i) for i in range(n)]
        self.front = Front([self.root(p) for p in self.procs]).__enter__()

    def spawn(self, i: int) -> Proxy:
        return Proxy(*self.args, stderr=self.tmp / f"replica{i}.err")

    @staticmethod
    def root(p: Proxy) -> str:
        return p.base_url.removesuffix("/v1")

    def url(self, n: int | None = None) -> str:
        """The front's base URL, sending to the first `n` replicas only (None: all of them)."""
        assert self.front is not None
        self.front.backends[:] = [self.root(p) for p in self.procs[: n or len(self.procs)]]
        return f"{self.front.url}/v1"

    def replace(self, i: int) -> None:
        """Replica i killed -9 and a new one started in its place (another port)."""
        self.procs[i].kill()
        self.procs[i] = self.spawn(i)

    def close(self) -> None:
        if self.front is not None:
            self.front.__exit__(None, None, None)
        for p in self.procs:
            p.stop()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("replicas")
    with Upstream() as upstream, RedisServer(tmp / "redis") as redis:
        r = Replicas(upstream, redis, tmp)
        try:
            r.start()
            yield r
        finally:
            r.close()


def post(url: str, body: dict[str, Any], ended: Ended, **kw: Any) -> httpx.Response:
    """POST, sent again after a 503 (the store) or a 502 (the front: a replica gone) until it is answered."""
    deadline = time.monotonic() + HOLD_S
    while True:
        try:
            r = httpx.post(f"{url}/chat/completions", json=body, timeout=HOLD_S, **kw)
        except httpx.TransportError as exc:  # the front dropped us: the replica died mid-body
            ended.outages.append({"transport": str(exc)})
        else:
            if r.status_code not in (502, 503):
                return r
            ended.outages.append({"status": r.status_code, **r.json()})
        assert time.monotonic() < deadline, ended.outages[-3:]
        time.sleep(0.05)


def converse(url: str, name: str, ws: Workspace, tag: str, *, turns: int = 40,
             before: Any = None) -> Ended:
    """The script's conversation over plain HTTP through `url`, its tools run for real; `before(turn)`
    is called before each request."""
    schemas = [tool(fn).schema() for fn in ws.tools.values()]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."},
                                      {"role": "user", "content": task(name, tag)}]
    ended = Ended()
    for turn in range(turns):
        if before is not None:
            before(turn)
        r = post(url, {"model": "fake", "messages": messages, "tools": schemas}, ended)
        assert r.status_code == 200, r.text
        ended.run, ended.stop = r.headers["x-loopfence-run"], r.headers.get("x-loopfence-stop")
        message = r.json()["choices"][0]["message"]
        messages.append(message)
        ended.turns = turn + 1
        if not message.get("tool_calls"):
            ended.answer = message.get("content")
            return ended
        ended.executions += run_calls(ws, message, messages)
    pytest.fail(f"{name}: no answer in {turns} turns")


def finished_log(replicas: Replicas, ended: Ended) -> dict[str, Any]:
    """The run's one log: complete (reconcile, replay), one request line per request the client sent
    (the last may be a stop that was not sent)."""
    path = replicas.tmp / "logs" / f"{ended.run}.jsonl"
    reconciles(path)
    replays(path)
    log = read_log(path)
    # one request line per request answered; a stop may come before its request is sent
    least = ended.turns - (1 if ended.stop else 0)
    assert least <= len(log.of("request")) <= ended.turns, (ended, len(log.of("request")))
    assert log.stop is not None
    return log.stop.record


@pytest.mark.parametrize("n", [2, 3])
def test_the_bench_scripts_through_n_replicas_stop_where_one_process_does(replicas: Replicas, n: int) -> None:
    url = replicas.url(n)
    for script in RUNAWAY + HONEST:
        with Workspace() as ws:
            ended = converse(url, script.name, ws, f"rr{n}")
        stop = finished_log(replicas, ended)
        if script in RUNAWAY:
            stops_at_the_minimum(script.name, ended.executions, ended.stop)
        else:
            assert ended.stop is None and stop["reason"] == "final_answer", (script.name, ended)
    served = replicas.front.routed[-n:] if replicas.front else []
    assert len(set(served)) == n  # the requests went round every replica


async def _at_once(url: str, bodies: list[dict[str, Any]], headers: dict[str, str] | None = None) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=HOLD_S, limits=httpx.Limits(max_connections=len(bodies))) as client:
        return await asyncio.gather(*(client.post(f"{url}/chat/completions", json=b, headers=headers) for b in bodies))


def test_fifty_requests_of_one_run_against_room_for_ten_let_exactly_ten_through(replicas: Replicas) -> None:
    url = replicas.url()
    for trial in range(TRIALS):
        tag = f"race:fifty-{trial}"
        bodies = [{"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": f"{tag} request {i}"}]}
                  for i in range(50)]
        got = asyncio.run(_at_once(url, bodies, {"X-Loopfence-Run": f"fifty-{trial}"}))
        assert {r.status_code for r in got} == {200}, [r.text for r in got if r.status_code != 200][:2]
        assert replicas.upstream.by_tag[tag] == BUDGET, (trial, replicas.upstream.by_tag[tag])
        stops = [r.headers.get("x-loopfence-stop") for r in got]
        assert stops.count(None) == BUDGET and stops.count("max_steps") == 50 - BUDGET, (trial, stops)
        assert {r.headers["x-loopfence-run"] for r in got} == {f"fifty-{trial}"}
        log = read_log(replicas.tmp / "logs" / f"fifty-{trial}.jsonl")
        assert len(log.of("request")) == BUDGET and log.stop is not None and log.stop.reason == "max_steps"


def test_fifty_text_answered_branches_of_one_name_against_room_for_ten_let_exactly_ten_through(
        replicas: Replicas) -> None:
    """A text answer does not end a named run: 50 branches under one name, no tools, each answered
    in text, meet one budget of 10 however the replicas share them."""
    url = replicas.url()
    for trial in range(3):
        tag = f"race:text-{trial}"
        bodies = [{"model": "m", "messages": [{"role": "user", "content": f"{tag} branch {i}"}]} for i in range(50)]
        got = asyncio.run(_at_once(url, bodies, {"X-Loopfence-Run": f"text-{trial}"}))
        assert {r.status_code for r in got} == {200}, [r.text for r in got if r.status_code != 200][:2]
        assert replicas.upstream.by_tag[tag] == BUDGET, (trial, replicas.upstream.by_tag[tag])
        stops = [r.headers.get("x-loopfence-stop") for r in got]
        assert stops.count(None) == BUDGET and stops.count("max_steps") == 50 - BUDGET, (trial, stops)
        assert {r.headers["x-loopfence-run"] for r in got} == {f"text-{trial}"}


def test_reset_on_one_replica_ends_the_run_and_frees_its_name_for_all(replicas: Replicas) -> None:
    a, b = (p.base_url for p in replicas.procs[:2])
    tag, name = "race:text-reset", "text-reset"
    for i in range(BUDGET + 1):  # the budget, then its stop
        r = httpx.post(f"{a}/chat/completions", headers={"X-Loopfence-Run": name}, timeout=HOLD_S,
                       json={"model": "m", "messages": [{"role": "user", "content": f"{tag} {i}"}]})
    assert r.headers.get("x-loopfence-stop") == "max_steps"
    ended = httpx.post(f"{b.removesuffix('/v1')}/loopfence/runs/{name}/reset", timeout=HOLD_S)
    assert ended.status_code == 200 and ended.json()["stop"]["reason"] == "max_steps", ended.text
    again = httpx.post(f"{a}/chat/completions", headers={"X-Loopfence-Run": name}, timeout=HOLD_S,
                       json={"model": "m", "messages": [{"role": "user", "content": f"{tag} again"}]})
    assert again.headers["x-loopfence-run"] == f"{name}-2" and "x-loopfence-stop" not in again.headers
    assert replicas.upstream.by_tag[tag] == BUDGET + 1
    reset = httpx.post(f"{a.removesuffix('/v1')}/loopfence/runs/{name}-2/reset", timeout=HOLD_S)
    assert reset.status_code == 200 and reset.json()["stop"]["reason"] == "final_answer", reset.text
    reconciles(replicas.tmp / "logs" / f"{name}-2.jsonl")
    replays(replicas.tmp / "logs" / f"{name}-2.jsonl")


def test_ten_copies_of_one_request_reach_the_upstream_once_and_all_get_its_answer(replicas: Replicas) -> None:
    """Ten copies in flight at once (the upstream holds the reply 0.5 s): one reaches it. (A copy that
    came after the answer was delivered would be a new sample: the test after this one.)"""
    url = replicas.url()
    for trial in range(TRIALS):
        tag = f"race:copies-{trial}"
        body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": f"{tag} the same request"}]}
        got = asyncio.run(_at_once(url, [body] * 10))
        assert {r.status_code for r in got} == {200}
        assert replicas.upstream.by_tag[tag] == 1, (trial, replicas.upstream.by_tag[tag])
        assert len({r.content for r in got}) == 1  # one answer, id and all
        assert len({r.headers["x-loopfence-run"] for r in got}) == 1


def test_the_same_request_again_after_its_answer_was_delivered_reaches_the_upstream(replicas: Replicas) -> None:
    """One after another, on any replica, each copy is a new sample (the answer before was delivered);
    under one session id, a title request with no tools does not make the agent's call unknown."""
    url = replicas.url()
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "race:again the same"}]}
    got = [post(url, body, Ended()) for _ in range(3)]
    assert {r.status_code for r in got} == {200} and replicas.upstream.by_tag["race:again"] == 3
    sid = {"x-session-id": "ses_redis"}
    title = post(url, {"model": "m", "messages": [{"role": "system", "content": "You are a title generator."},
                                                  {"role": "user", "content": "race:text-title fix it"}]}, Ended(),
                 headers=sid)
    main = post(url, {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "race:main fix it"}]},
                Ended(), headers=sid)
    assert title.status_code == main.status_code == 200 and "x-loopfence-stop" not in main.headers, main.text
    assert main.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    assert {title.headers["x-loopfence-run"], main.headers["x-loopfence-run"]} == {"ses_redis", "ses_redis-2"}


def test_redis_killed_and_restarted_mid_load_lets_no_run_past_a_budget(replicas: Replicas) -> None:
    url = replicas.url()
    names = [s.name for s in RUNAWAY + HONEST]
    out: dict[str, Ended] = {}
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            with Workspace() as ws:
                out[name] = converse(url, name, ws, "outage", before=lambda turn: time.sleep(0.05))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    time.sleep(0.3)
    replicas.redis.kill()  # mid-load: requests in flight on every replica
    time.sleep(1.0)
    replicas.redis.restart()
    for t in threads:
        t.join(HOLD_S)
    assert not errors, errors[0]
    outages = [o for e in out.values() for o in e.outages]
    assert outages, "the outage was never met: nothing was checked"
    for o in outages:  # every answer during the outage says what is wrong
        if "status" in o:
            assert o["status"] == 503 and o["error"]["code"] == "state_store_unavailable", o
            assert "state store" in o["error"]["message"], o
    for script in RUNAWAY + HONEST:
        ended = out[script.name]
        stop = finished_log(replicas, ended)
        if script in RUNAWAY:
            stops_at_the_minimum(script.name, ended.executions, ended.stop)
        else:
            assert stop["reason"] == "final_answer", (script.name, ended)
        assert ended.turns <= BUDGET


def test_a_replica_killed_mid_request_loses_nothing_and_counts_nothing_twice(replicas: Replicas) -> None:
    url = replicas.url()
    scripts = itertools.cycle(["polling_8", "edit_and_test", "paging_5", "ok_forever"])
    with Workspace() as ws:
        base = {name: converse(url, name, ws, "uninterrupted") for name in ("polling_8", "edit_and_test", "paging_5",
                                                                            "ok_forever")}
    up = replicas.upstream
    for trial in range(TRIALS):
        name = next(scripts)
        at = 1 + trial % (base[name].turns - 2)  # a turn that reaches the upstream (a stop may end the last)
        tag = f"kill-{trial}"
        killed: list[int] = []

        def killer(turn: int, name: str = name, at: int = at, tag: str = tag, killed: list[int] = killed) -> None:
            if turn != at:
                return
            up.arrived.clear()
            up.release.clear()
            up.hold = (task(name, tag), at)

            def kill(killed: list[int] = killed) -> None:
                if up.arrived.wait(HOLD_S):
                    assert replicas.front is not None
                    victim = next(i for i, p in enumerate(replicas.procs)
                                  if replicas.root(p) == replicas.front.routed[-1])
                    replicas.procs[victim].proc.kill()  # -9, the request in flight
                    killed.append(victim)
                up.release.set()
            threading.Thread(target=kill, daemon=True).start()

        with Workspace() as ws:
            ended = converse(url, name, ws, tag, before=killer)
        assert killed, f"trial {trial}: the held request never arrived"
        assert ended.outages, f"trial {trial}: the kill was not met"
        assert (ended.answer, ended.executions, ended.turns) == (base[name].answer, base[name].executions,
                                                                 base[name].turns), (trial, ended)
        finished_log(replicas, ended)  # reconciles, replays, one request line per request answered
        replicas.replace(killed[0])
        replicas.url()


def test_a_store_that_lost_its_data_fails_closed_for_runs_under_way(replicas: Replicas) -> None:
    url = replicas.url()
    tools = TOOLS
    messages: list[dict[str, Any]] = [{"role": "user", "content": "race:lost the first request"}]
    r = httpx.post(f"{url}/chat/completions", json={"model": "m", "tools": tools, "messages": messages}, timeout=HOLD_S)
    assert r.status_code == 200
    messages.append(r.json()["choices"][0]["message"])
    messages.append({"role": "tool", "tool_call_id": messages[-1]["tool_calls"][0]["id"], "content": "text"})
    named = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "race:lost-named go"}]}
    assert httpx.post(f"{url}/chat/completions", json=named, headers={"X-Loopfence-Run": "lost-named"},
                      timeout=HOLD_S).status_code == 200
    replicas.redis.client().flushall()  # as a restart without persistence leaves it
    for _ in range(len(replicas.procs)):  # every replica: the one that finds the store empty, and the rest
        r = httpx.post(f"{url}/chat/completions", json={"model": "m", "tools": tools, "messages": messages},
                       timeout=HOLD_S)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "state_store_unavailable"
        r = httpx.post(f"{url}/chat/completions", json=named, headers={"X-Loopfence-Run": "lost-named"},
                       timeout=HOLD_S)
        assert r.status_code == 503 and "lost its data" in r.json()["error"]["message"], r.text
    fresh = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "race:lost-fresh a new one"}]}
    assert httpx.post(f"{url}/chat/completions", json=fresh, timeout=HOLD_S).status_code == 200
    replicas.redis.client().delete("lf:lost")  # the operator's way out, for the tests that follow


def test_runs_are_shared_between_replicas_and_keys_are_enforced(tmp_path: Path, replicas: Replicas) -> None:
    with RedisServer(tmp_path / "redis") as redis:
        args = ["--upstream", replicas.upstream.base_url, "--logs", str(tmp_path / "logs"), "--state", redis.url,
                "--key", "alice", "--key", "bob", "--expire-after", "1"]
        with Proxy(*args, stderr=tmp_path / "a.err") as a, Proxy(*args, stderr=tmp_path / "b.err") as b:
            body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "race:keys hello"}]}
            alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
            r = httpx.post(f"{a.base_url}/chat/completions", json=body, headers={**alice, "X-Loopfence-Run": "k1"})
            assert r.status_code == 200
            seen = httpx.get(f"{b.base_url.removesuffix('/v1')}/loopfence/runs/k1", headers=alice)
            assert seen.status_code == 200 and seen.json()["ledger"]["model_requests"] == 1, seen.text
            assert httpx.get(f"{b.base_url.removesuffix('/v1')}/loopfence/runs/k1", headers=bob).status_code == 404
            listed = httpx.get(f"{b.base_url.removesuffix('/v1')}/loopfence/runs", headers=alice).json()["data"]
            assert [d["id"] for d in listed] == [f"{tag('alice')}.k1"]
            # a run name is scoped to the client's key: bob's "k1" is a run of his own, alice's stays hers
            r = httpx.post(f"{b.base_url}/chat/completions", json=body, headers={**bob, "X-Loopfence-Run": "k1"})
            assert r.status_code == 200 and r.headers["x-loopfence-run"] == f"{tag('bob')}.k1", r.text
            mine = httpx.get(f"{a.base_url.removesuffix('/v1')}/loopfence/runs/k1", headers=alice).json()
            assert mine["id"] == f"{tag('alice')}.k1" and mine["ledger"]["model_requests"] == 1
            time.sleep(2.5)  # --expire-after 1: idle past it
            keys = redis.client().keys("lf:*k1*")
            assert keys == [], keys
            assert (tmp_path / "logs" / f"{tag('alice')}.k1.jsonl").is_file()  # the log stays


def test_an_unreachable_store_is_a_clear_503(tmp_path: Path, replicas: Replicas) -> None:
    with RedisServer(tmp_path / "redis") as redis:
        url = redis.url
    # the server is gone: nothing listens on its port now
    with Proxy("--upstream", replicas.upstream.base_url, "--logs", str(tmp_path / "logs"), "--state", url,
               stderr=tmp_path / "p.err") as p:
        body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "race:down hello"}]}
        r = httpx.post(f"{p.base_url}/chat/completions", json=body, timeout=HOLD_S)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "state_store_unavailable" and url.split("//")[1] in err["message"], err
        assert "race:down" not in str(replicas.upstream.by_tag)  # nothing was forwarded
        assert httpx.get(f"{p.base_url.removesuffix('/v1')}/loopfence/runs").status_code == 503
        assert "cannot be reached" in p.stderr()


def test_a_replica_starting_brings_short_log_files_up_to_the_store(replicas: Replicas) -> None:
    url = replicas.url()
    with Workspace() as ws:
        ended = converse(url, "paging_5", ws, "heal")
    path = replicas.tmp / "logs" / f"{ended.run}.jsonl"
    whole = path.read_bytes()
    lines = whole.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-3]) + lines[-3][:10])  # a replica killed after its commit, mid-write
    replicas.replace(0)  # a replica starts: it heals the files
    assert path.read_bytes() == whole
    finished_log(replicas, ended)
    replicas.url()


@pytest.fixture
def spinning() -> Iterator[None]:
    """Both cores kept busy by two spinning processes (started here, stopped by their PIDs)."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
             for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(30)


def test_under_cpu_load_copies_on_two_replicas_get_the_one_answer_after_a_burst(
        replicas: Replicas, spinning: None) -> None:
    """Two replicas, both cores busy: a burst of 50 branches of one named run, then 10 copies of one
    request at once, 20 times. Every copy gets the one answer (a copy on the other replica waits on
    its twin, never past its time), and the upstream sees the request once."""
    url = replicas.url(2)
    for trial in range(TRIALS):
        burst = [{"model": "m", "messages": [{"role": "user", "content": f"race:text-load-{trial} branch {i}"}]}
                 for i in range(50)]
        got = asyncio.run(_at_once(url, burst, {"X-Loopfence-Run": f"load-{trial}"}))
        assert {r.status_code for r in got} == {200}, [r.text for r in got if r.status_code != 200][:2]
        tag = f"race:copies-load-{trial}"
        body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": f"{tag} the same request"}]}
        got = asyncio.run(_at_once(url, [body] * 10))  # (a copy that waited past WAIT_S would get 503)
        assert {r.status_code for r in got} == {200}, (trial, [r.text for r in got if r.status_code != 200][:2])
        assert replicas.upstream.by_tag[tag] == 1, (trial, replicas.upstream.by_tag[tag])
        assert len({r.content for r in got}) == 1  # one answer, id and all
