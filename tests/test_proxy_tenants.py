"""Two client keys, one proxy: never a shared run, route, retry or word (issue "the proxy as a shared
service, part 1", item 1).

Both keys send the same conversations, the same run names (in the header and in the base URL) and the
same session headers, interleaved at random (hypothesis), each request sometimes a copy of one just
sent (a retry within RETRY_S), sometimes the next turn of an earlier one. The upstream numbers every
answer it makes, and the requests go one at a time, so each number belongs to the key whose request
made it. Then: no run id is ever given to both keys; no key is ever answered with a number the other
key's request made; no request is refused for the other's run (every answer is a 200); each key's
listing, and each run route, shows its own runs only; no response a key gets holds the other's run
ids. On the embedded store over 1,000 requests, and a fixed sample on a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence.proxy import Proxy, Settings

from _redis_support import RedisServer

KEYS = ("alice", "bob")
TASKS = ("read the config", "fix the test", "say hi")
NAMES = ("job", "build", "x" * 128)  # a 128-character name too: its second run must still be served
SESSIONS = ("ses_1", "ses_2")
RUN_HEADER = "x-loopfence-run"

step = st.fixed_dictionaries({
    "key": st.sampled_from(KEYS),
    "task": st.sampled_from(TASKS),
    "name": st.one_of(st.none(), st.sampled_from(NAMES)),
    "in_path": st.booleans(),
    "session": st.one_of(st.none(), st.sampled_from(SESSIONS)),
    "then": st.sampled_from(["new", "retry", "continue", "reset"]),
})


class Upstream:
    """An OpenAI-compatible upstream (an httpx transport) numbering its answers: `made[n]` is the key
    whose request was at the proxy when answer n was made."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.current = ""

    def transport(self) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            n = len(self.made)
            self.made.append(self.current)
            return httpx.Response(200, json={
                "id": f"up-{n}", "object": "chat.completion", "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"answer #{n}"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})
        return httpx.MockTransport(answer)


class Tenants:
    """The two keys' view of one proxy: what each was given."""

    def __init__(self, proxy: Proxy, upstream: Upstream) -> None:
        self.proxy, self.upstream = proxy, upstream
        self.ids: dict[str, set[str]] = {k: set() for k in KEYS}
        self.sent: dict[str, list[tuple[dict[str, Any], dict[str, str], str]]] = {k: [] for k in KEYS}
        self.texts: dict[str, list[str]] = {k: [] for k in KEYS}  # every response body a key got
        self.answers: dict[str, list[str]] = {k: [] for k in KEYS}  # the answers' texts, in order
        self.seen: dict[str, list[tuple[int, str, str | None]]] = {k: [] for k in KEYS}  # what each key observed

    async def drive(self, steps: list[dict[str, Any]]) -> None:
        transport = httpx.ASGITransport(app=self.proxy.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as client:
            for s in steps:
                await self.one(client, s)
            for key in KEYS:
                await self.look(client, key)

    async def one(self, client: httpx.AsyncClient, s: dict[str, Any]) -> None:
        key = s["key"]
        auth = {"Authorization": f"Bearer {key}"}
        earlier = self.sent[key]
        if s["then"] == "retry" and earlier:
            body, headers, path = earlier[-1]
        elif s["then"] == "continue" and earlier:
            body, headers, path = earlier[-1]
            body = {**body, "messages": [*body["messages"], {"role": "assistant", "content": self.last(key)},
                                         {"role": "user", "content": f"and then ({len(earlier)})?"}]}
        elif s["then"] == "reset" and s["name"] is not None:
            r = await client.post(f"/loopfence/runs/{s['name']}/reset", headers=auth)
            assert r.status_code in (200, 404), r.text
            self.texts[key].append(r.text)
            self.seen[key].append((r.status_code, _shape(r.json().get("id", "")), None))
            return
        else:
            headers = {**({"x-session-id": s["session"]} if s["session"] else {})}
            path = "/v1/chat/completions"
            if s["name"] is not None and s["in_path"]:
                path = f"/run/{s['name']}/v1/chat/completions"
            elif s["name"] is not None:
                headers["X-Loopfence-Run"] = s["name"]
            body = {"model": "m", "messages": [{"role": "user", "content": s["task"]}]}
        self.upstream.current = key
        r = await client.post(path, json=body, headers={**headers, **auth})
        assert r.status_code == 200, (key, s, r.status_code, r.text)
        rid = r.headers[RUN_HEADER]
        self.ids[key].add(rid)
        content = r.json()["choices"][0]["message"]["content"] or ""
        if content.startswith("answer #"):  # an upstream answer: made for this key, never the other's
            made_for = self.upstream.made[int(content.removeprefix("answer #"))]
            assert made_for == key, f"{key} was answered with #{content} made for {made_for} (run {rid})"
        self.sent[key].append((body, headers, path))
        self.answers[key].append(content)
        self.seen[key].append((r.status_code, _shape(rid), r.headers.get("x-loopfence-stop")))
        self.texts[key].append(r.text + json.dumps(dict(r.headers)))

    def last(self, key: str) -> str:
        return self.answers[key][-1] if self.answers[key] else "ok"

    async def look(self, client: httpx.AsyncClient, key: str) -> None:
        auth = {"Authorization": f"Bearer {key}"}
        listed, after = [], None
        while True:
            r = await client.get("/loopfence/runs", params={"limit": 7, **({"after": after} if after else {})},
                                 headers=auth)
            assert r.status_code == 200, r.text
            page = r.json()
            listed += [d["id"] for d in page["data"]]
            self.texts[key].append(r.text)
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert sorted(listed) == sorted(self.ids[key]), (key, listed)  # every run of its own, once, and only those
        self.seen[key].append((200, "listing", ",".join(sorted(_shape(i) for i in listed))))
        for rid in self.ids[self.other(key)]:  # the other's runs, by id: not there for this key
            r = await client.get(f"/loopfence/runs/{rid}", headers=auth)
            assert r.status_code == 404, (key, rid, r.text)

    @staticmethod
    def other(key: str) -> str:
        return KEYS[1 - KEYS.index(key)]

    def check(self) -> None:
        assert not self.ids["alice"] & self.ids["bob"], self.ids
        for key in KEYS:
            said = "\n".join(self.texts[key])
            leaked = [rid for rid in self.ids[self.other(key)] if rid not in self.ids[key] and rid in said]
            assert not leaked, f"{key} was shown the other key's run ids {leaked}"


def _shape(rid: str) -> str:
    """A run id as a key can compare it across proxies: a random id is any random id."""
    return "random" if re.fullmatch(r"[0-9a-f]{32}", rid) else rid


def _alone(tmp: Path, steps: list[dict[str, Any]], key: str, state: str | None = None) -> list[Any]:
    """What `key` observes sending its own steps with the other key silent."""
    upstream = Upstream()
    proxy = _proxy(tmp, upstream, state)
    solo = Tenants(proxy, upstream)

    async def go() -> None:
        try:
            await proxy.restore()
            await solo.drive([s for s in steps if s["key"] == key])
        finally:
            await proxy.aclose()

    asyncio.run(go())
    return solo.seen[key]


def _proxy(tmp: Path, upstream: Upstream, state: str | None = None) -> Proxy:
    return Proxy("http://upstream.invalid/v1", Settings(logs=tmp), keys=KEYS, transport=upstream.transport(),
                 state=state)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=50, max_size=50))
def test_two_keys_never_share_a_run_on_the_embedded_store(tmp_path_factory: pytest.TempPathFactory,
                                                          steps: list[dict[str, Any]]) -> None:
    upstream = Upstream()
    proxy = _proxy(tmp_path_factory.mktemp("tenants"), upstream)
    tenants = Tenants(proxy, upstream)

    async def go() -> None:
        try:
            await tenants.drive(steps)
        finally:
            await proxy.aclose()

    asyncio.run(go())
    tenants.check()
    for key in KEYS:  # and nothing a key sees depends on the other: its own steps alone look the same
        assert tenants.seen[key] == _alone(tmp_path_factory.mktemp("alone"), steps, key), key


def test_two_keys_never_share_a_run_on_redis(tmp_path: Path) -> None:
    rnd = random.Random(59)
    steps = [{"key": rnd.choice(KEYS), "task": rnd.choice(TASKS), "name": rnd.choice([None, *NAMES]),
              "in_path": rnd.random() < 0.5, "session": rnd.choice([None, *SESSIONS]),
              "then": rnd.choice(["new", "retry", "continue", "reset"])} for _ in range(200)]
    with RedisServer(tmp_path / "redis") as redis:
        upstream = Upstream()
        proxy = _proxy(tmp_path / "logs", upstream, state=redis.url)
        tenants = Tenants(proxy, upstream)

        async def go() -> None:
            try:
                assert await proxy.restore() == 0
                await tenants.drive(steps)
            finally:
                await proxy.aclose()

        asyncio.run(go())
    tenants.check()
    assert len(tenants.ids["alice"]) > 5 and len(tenants.ids["bob"]) > 5  # the sample reached many runs
