"""Two replicas on one real redis-server, in one process (two `Proxy` apps, each its own store client):
a copy of a request that waits on its twin at work on the other replica gets the twin's answer, even
when the answer was stored, delivered and the run moved on before the copy looked again (a hook in
the store holds the copy at exactly that point); a copy whose twin never answers gives up with a
clear 503 after `WAIT_S`, never hangs; a store found empty marks itself lost (`connect`, `watch`).
The upstream is a mock transport (below the line: the proxies and Redis are real)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _redis_support import RedisServer

from loopfence.proxy import Proxy, Settings
from loopfence.proxy import _redis
from loopfence.testing import calls_reply, tool_call

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
FIRST = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "twins: read the file"}]}


class Upstream:
    """Answers a fresh read_file call each time; the first request of a conversation waits for `release`."""

    def __init__(self) -> None:
        self.firsts = 0  # first requests (one message) that reached it
        self.seen = 0
        self.arrived, self.release = asyncio.Event(), asyncio.Event()

    def transport(self) -> httpx.MockTransport:
        async def answer(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            self.seen += 1
            k = self.seen
            if len(body["messages"]) == 1:
                self.firsts += 1
                self.arrived.set()
                await self.release.wait()
            return httpx.Response(200, json=calls_reply(tool_call("read_file", {"path": f"p{k}"}, id=f"call_{k}")))
        return httpx.MockTransport(answer)


def _replica(url: str, logs: Path, upstream: Upstream, **settings: Any) -> tuple[Proxy, httpx.AsyncClient]:
    """A replica on the store at `url` logging into `logs`, and a client of its app (restore() not yet called)."""
    proxy = Proxy("http://upstream.invalid/v1", Settings(logs=logs, **settings), transport=upstream.transport(),
                  state=url)
    return proxy, httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app), base_url="http://127.0.0.1/v1",
                                    timeout=120)


@asynccontextmanager
async def replicas(url: str, logs: list[Path], upstream: Upstream) -> AsyncIterator[list[tuple[Any, httpx.AsyncClient]]]:
    """A replica per log folder: (its store, a client of its app)."""
    proxies, clients = (list(x) for x in zip(*(_replica(url, d, upstream) for d in logs), strict=True))
    try:
        for p in proxies:
            assert await p.restore() == 0
        yield [(p.runs, c) for p, c in zip(proxies, clients, strict=True)]
    finally:
        for c in clients:
            await c.aclose()
        for p in proxies:
            await p.aclose()


def test_a_copy_gets_its_twins_answer_stored_before_it_looked_again(tmp_path: Path) -> None:
    """The copy on B is told to wait (its twin is at work on A); the hook then lets the twin answer,
    waits for that answer to be delivered, and moves the run on with its next request, all before the
    copy asks the store again. The copy still gets the twin's answer, and the upstream saw it once."""

    async def go(url: str) -> None:
        upstream = Upstream()
        async with replicas(url, [tmp_path / "logs"] * 2, upstream) as ((_, a), (store_b, b)):
            lead = asyncio.ensure_future(a.post("/chat/completions", json=FIRST))
            await asyncio.wait_for(upstream.arrived.wait(), 60)
            moved: list[httpx.Response] = []

            async def hook() -> None:
                store_b.waiting = None  # once
                upstream.release.set()
                first = await lead
                message = first.json()["choices"][0]["message"]
                after = {**FIRST, "messages": [*FIRST["messages"], message, {
                    "role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "the text"}]}
                moved.append(await a.post("/chat/completions", json=after))

            store_b.waiting = hook
            copy = await asyncio.wait_for(b.post("/chat/completions", json=FIRST), 120)
            assert moved and moved[0].status_code == 200, "the hook never ran: the copy was not told to wait"
            assert copy.status_code == 200, copy.text
            assert copy.content == lead.result().content  # the one answer, id and all
            assert upstream.firsts == 1

    with RedisServer(tmp_path / "redis") as redis:
        asyncio.run(go(redis.url))


def test_a_copy_whose_twin_never_answers_gives_up_with_a_clear_503(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_redis, "WAIT_S", 0.5)

    async def go(url: str) -> None:
        upstream = Upstream()
        async with replicas(url, [tmp_path / "logs"] * 2, upstream) as ((_, a), (_, b)):
            lead = asyncio.ensure_future(a.post("/chat/completions", json=FIRST))
            await asyncio.wait_for(upstream.arrived.wait(), 60)
            copy = await asyncio.wait_for(b.post("/chat/completions", json=FIRST), 60)  # never hangs
            assert copy.status_code == 503, copy.text
            message = copy.json()["error"]["message"]
            assert "at work on this same request for 0.5s" in message and "not forwarded" in message
            upstream.release.set()
            assert (await lead).status_code == 200
            assert upstream.firsts == 1

    with RedisServer(tmp_path / "redis") as redis:
        asyncio.run(go(redis.url))


def _named(i: int) -> dict[str, Any]:
    return {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": f"budget: branch {i}"}]}


LIMITED = "max_steps=4"


async def _used(client: httpx.AsyncClient, n: int) -> None:
    for i in range(n):
        r = await client.post("/chat/completions", json=_named(i), headers={"X-Loopfence-Run": "kept"})
        assert r.status_code == 200 and "x-loopfence-stop" not in r.headers, r.text


@pytest.mark.parametrize("folders", ["shared", "separate"])
def test_redis_restarted_empty_then_a_replica_restarted_never_gives_fresh_budgets(tmp_path: Path,
                                                                                   folders: str) -> None:
    """A named run has used 3 of max_steps=4 (all on replica A). Redis restarts empty (no persistence
    kept), then a replica restarts: the one that logged the run, or (separate folders) the one that
    never saw it. The run's next request, on any replica, gets a 503 or its budget's last step: never
    four more steps upstream."""
    from loopfence._limits import Limits

    async def go(redis: RedisServer, restarted: int) -> None:
        top = tmp_path / f"restarted{restarted}"  # (a folder with a recent log marks an empty store lost)
        logs = [top / "a", top / "a" if folders == "shared" else top / "b"]
        upstream = Upstream()
        upstream.release.set()
        limits = Limits.coding().replace(max_steps=4)
        made, clients = (list(x) for x in zip(*(_replica(redis.url, d, upstream, limits=limits) for d in logs),
                                             strict=True))
        try:
            for p in made:
                await p.restore()
            await _used(clients[0], 3)
            redis.client().flushall()  # restarted without persistence: empty (then restarted for real)
            redis.kill()
            redis.restart()
            await clients[restarted].aclose()
            await made[restarted].aclose()
            made[restarted], clients[restarted] = _replica(redis.url, logs[restarted], upstream, limits=limits)
            await made[restarted].restore()
            before = upstream.seen
            for turn in range(6):  # the rest of the run, each replica in turn
                r = await clients[turn % 2].post("/chat/completions", json=_named(10 + turn),
                                                 headers={"X-Loopfence-Run": "kept"})
                assert r.status_code in (200, 503), r.text
                if r.status_code == 503:
                    assert "lost its data" in r.json()["error"]["message"], r.text
            assert upstream.seen - before <= 1  # at most the one step its budget had left
        finally:
            for c in clients:
                await c.aclose()
            for p in made:
                await p.aclose()

    for restarted in (0, 1):
        with RedisServer(tmp_path / f"redis{restarted}") as redis:
            asyncio.run(go(redis, restarted))


def test_a_replica_that_joined_a_store_sees_it_made_anew_and_marks_it_lost(tmp_path: Path) -> None:
    """Separate folders: Redis flushed, and the replica that never logged the run restarts first: it
    finds the store empty and cannot tell lost from new, so it waits SETTLE_S before it serves; the
    replica that joined the store before sees its epoch changed meanwhile (`look`, every WATCH_S) and
    marks it for one expiry period."""

    async def go(url: str, redis: RedisServer) -> None:
        upstream = Upstream()
        upstream.release.set()
        async with replicas(url, [tmp_path / "a", tmp_path / "b"], upstream) as ((store_a, a), _):
            await _used(a, 2)
            redis.client().flushall()
            fresh, b = _replica(url, tmp_path / "b", upstream)
            try:
                await fresh.restore()  # (meanwhile A's watch looked: its loop is this one)
                assert redis.client().pttl("lf:lost") > 3_600_000, "the replica that joined before did not mark it"
                redis.client().delete("lf:lost")
                await store_a.look()  # (and looking again finds nothing new)
                assert redis.client().pttl("lf:lost") == -2
                redis.client().flushall()
                await store_a.look()  # gone under it: marked at once
                assert redis.client().pttl("lf:lost") > 3_600_000
                r = await b.post("/chat/completions", json=_named(9), headers={"X-Loopfence-Run": "kept"})
                assert r.status_code == 503 and "lost its data" in r.json()["error"]["message"], r.text
                new = await b.post("/chat/completions", json={**FIRST, "messages": [
                    {"role": "user", "content": "a new conversation"}]})
                assert new.status_code == 200, new.text  # a new conversation is served meanwhile
            finally:
                await b.aclose()
                await fresh.aclose()

    with RedisServer(tmp_path / "redis") as redis:
        asyncio.run(go(redis.url, redis))


def test_a_folder_of_in_process_runs_does_not_mark_a_new_store_lost(tmp_path: Path) -> None:
    """Moving from the in-process store to Redis on the same log folder: its runs were never the
    store's, so the first replica on the new store serves named runs (after SETTLE_S). The same folder,
    once it served a store (its EPOCH_FILE), marks an empty store lost."""

    async def go(url: str, redis: RedisServer) -> None:
        upstream = Upstream()
        upstream.release.set()
        logs = tmp_path / "logs"
        logs.mkdir()
        (logs / "earlier.jsonl").write_text("{}\n")  # a run the in-process store logged a moment ago
        async with replicas(url, [logs], upstream) as [(_, a)]:
            await _used(a, 1)
        assert (logs / _redis.EPOCH_FILE).exists()
        redis.client().flushall()
        async with replicas(url, [logs], upstream) as [(_, a)]:
            r = await a.post("/chat/completions", json=_named(5), headers={"X-Loopfence-Run": "kept"})
            assert r.status_code == 503 and "lost its data" in r.json()["error"]["message"], r.text

    with RedisServer(tmp_path / "redis") as redis:
        asyncio.run(go(redis.url, redis))
