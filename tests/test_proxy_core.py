"""The proxy's core, in process: `Proxy.app` (Starlette) driven over httpx's ASGI transport, in front of
a FakeServer over real HTTP. The wire tests (subprocess, node, SDKs, kill -9) are the other
tests/test_proxy_*.py files."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence._drivers._reconcile import reconcile
from loopfence.proxy import Proxy, Settings
from loopfence.runlog import read_log
from loopfence.testing import FakeServer
from loopfence.testing._builders import calls_reply, text_reply, tool_call

TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {
    "type": "object", "properties": {"pattern": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
    "required": ["pattern"]}}}]


def _client(proxy: Proxy) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app), base_url="http://127.0.0.1/v1", timeout=30)


async def _loop(client: httpx.AsyncClient, task: str, steps: int = 10) -> tuple[list[httpx.Response], int]:
    """A minimal agent loop: every call answered "no match"; (responses, executions)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    seen, executions = [], 0
    for _ in range(steps):
        r = await client.post("/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS})
        seen.append(r)
        if r.status_code != 200:
            break
        msg = r.json()["choices"][0]["message"]
        messages.append(msg)
        if not msg.get("tool_calls"):
            break
        for c in msg["tool_calls"]:
            executions += 1
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "no match"})
    return seen, executions


def _grep_script(n: int = 6) -> list[dict[str, Any]]:
    # the same call spelt two ways: the default bound from the schema makes them one key
    args = [{"pattern": "x"}, {"pattern": "x", "limit": 5}]
    return [calls_reply(tool_call("grep", args[i % 2], id=f"c{i}")) for i in range(n)] + [text_reply("done")]


def test_a_runaway_stops_at_the_third_ask_and_its_log_reconciles(tmp_path: Path) -> None:
    async def go() -> tuple[list[httpx.Response], int]:
        proxy = Proxy(fs.base_url, Settings(logs=tmp_path))
        async with _client(proxy) as client:
            return await _loop(client, "find x")

    with FakeServer(_grep_script()) as fs:
        seen, executions = asyncio.run(go())
    last = seen[-1]
    assert executions == 2
    assert last.headers["x-loopfence-stop"] == "repeated_call"
    msg = last.json()["choices"][0]
    assert msg["finish_reason"] == "stop" and "tool_calls" not in msg["message"]
    assert "repeated_call" in msg["message"]["content"] and "limit 3" in msg["message"]["content"]
    assert len(fs.requests) == 3
    logs = sorted(tmp_path.glob("*.jsonl"))
    assert [p.stem for p in logs] == [last.headers["x-loopfence-run"]]
    assert reconcile(logs[0]).ok


def test_a_stopped_run_answers_every_later_request_the_same_without_the_upstream(tmp_path: Path) -> None:
    async def go() -> list[httpx.Response]:
        proxy = Proxy(fs.base_url, Settings(logs=tmp_path, on_stop="error"))
        async with _client(proxy) as client:
            seen, _ = await _loop(client, "find x")
            again = await client.post("/chat/completions", json=json.loads(seen[-1].request.content))
            return [*seen, again]

    with FakeServer(_grep_script()) as fs:
        seen = asyncio.run(go())
    stop, again = seen[-2], seen[-1]
    assert stop.status_code == 400
    assert stop.json() == again.json()
    assert stop.json()["error"]["type"] == "loopfence_stop" and stop.json()["error"]["code"] == "repeated_call"
    assert len(fs.requests) == 3


def test_identical_requests_in_flight_are_forwarded_once(tmp_path: Path) -> None:
    async def go() -> list[httpx.Response]:
        proxy = Proxy(fs.base_url, Settings(logs=tmp_path))
        body = {"model": "m", "messages": [{"role": "user", "content": "slow"}], "tools": TOOLS}
        async with _client(proxy) as client:
            return list(await asyncio.gather(*(client.post("/chat/completions", json=body) for _ in range(3))))

    slow = {"fault": "slow_stream", "delay_s": 0.3, "reply": text_reply("late")}
    with FakeServer([slow, text_reply("second")]) as fs:
        answers = asyncio.run(go())
    assert len(fs.requests) == 1
    assert len({r.text for r in answers}) == 1
    assert len({r.headers["x-loopfence-run"] for r in answers}) == 1


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "z", "content": "r"}]},
     "messages[1].tool_call_id"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}, "max_tokens"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "grep", "arguments": "{}"}},
        {"id": "a", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}]},
     "messages[0].tool_calls[1].id"),
    ({"messages": [{"role": "user", "content": "x"}] * 5000}, "messages"),
])
def test_a_malformed_request_is_a_400_naming_the_field_and_never_forwarded(body: dict[str, Any], param: str) -> None:
    async def go() -> httpx.Response:
        async with _client(Proxy(fs.base_url, Settings(logs=None))) as client:
            return await client.post("/chat/completions", json=body)

    with FakeServer([text_reply("hi")]) as fs:
        r = asyncio.run(go())
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert fs.requests == []


def test_an_idle_run_is_forgotten_after_expire_after_and_its_log_stays(tmp_path: Path) -> None:
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "find x"}]}

    async def go() -> tuple[int, int, str, str]:
        proxy = Proxy(fs.base_url, Settings(logs=tmp_path, expire_after=0.5))
        async with _client(proxy) as client:
            first = await client.post("/chat/completions", json=body, headers={"X-Loopfence-Run": "idle"})
            seen = (await client.get("http://127.0.0.1/loopfence/runs/idle")).status_code
            await asyncio.sleep(0.8)
            other = {**body, "messages": [{"role": "user", "content": "something else"}]}
            await client.post("/chat/completions", json=other)  # any request sweeps the idle runs
            gone = (await client.get("http://127.0.0.1/loopfence/runs/idle")).status_code
            again = await client.post("/chat/completions", json=body, headers={"X-Loopfence-Run": "idle"})
            return seen, gone, first.headers["x-loopfence-run"], again.headers["x-loopfence-run"]

    with FakeServer(_grep_script()) as fs:
        seen, gone, first, again = asyncio.run(go())
    assert (seen, gone) == (200, 404)
    assert first == "idle" and again == "idle-2"  # a run of its own: the forgotten one's log is not reused
    checks = reconcile(tmp_path / "idle.jsonl").checks
    assert checks and all(c.ok for c in checks)


def _open_logs(folder: Path) -> int:
    """This process's file descriptors open on a file in `folder` (a waiting run's log and notes)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd).startswith(str(folder.resolve()) + os.sep))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_runs_waiting_on_their_clients_past_max_open_logs_rest_their_log_files(tmp_path: Path) -> None:
    """One-shot requests with no tools leave runs waiting (a text reply is a text action): past
    `max_open_logs` the longest-waiting rest their logs (closed), and a rested run goes on whole."""

    async def go() -> list[str]:
        proxy = Proxy(fs.base_url, Settings(logs=tmp_path))
        proxy.runs.max_open_logs = 2
        async with _client(proxy) as client:
            ids = []
            for i in range(6):
                r = await client.post("/chat/completions", json={"model": "m", "messages": [
                    {"role": "user", "content": f"classify {i}"}]})
                ids.append(r.headers["x-loopfence-run"])
            assert _open_logs(tmp_path) == 4  # two runs: each its log and its notes
            first = [{"role": "user", "content": "classify 0"}, {"role": "assistant", "content": "positive"},
                     {"role": "user", "content": "and now?"}]
            again = await client.post("/chat/completions", json={"model": "m", "messages": first})
            assert again.headers["x-loopfence-run"] == ids[0]  # the rested run, continued
            assert _open_logs(tmp_path) == 4
            for rid in ids:
                assert (await client.post(f"http://127.0.0.1/loopfence/runs/{rid}/reset")).status_code == 200
            assert _open_logs(tmp_path) == 0
            return ids

    with FakeServer([text_reply("positive")], across_runs=True) as fs:
        ids = asyncio.run(go())
    for rid in ids:
        checks = reconcile(tmp_path / f"{rid}.jsonl").checks
        assert all(c.ok for c in checks), [(c.name, c.detail) for c in checks if not c.ok]
    assert len(read_log(tmp_path / f"{ids[0]}.jsonl").of("request")) == 2


def test_a_run_opens_its_notes_once_and_leaves_them_closed_with_every_line(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's notes file stays open while it goes on and closes when it ends: opened once in its life
    (its last line is not written by closing the file and opening it again)."""
    opened: list[Path] = []
    real_open = Path.open

    def counted(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.parent.name == ".proxy":
            opened.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)

    async def go() -> tuple[list[httpx.Response], int]:
        proxy = Proxy(fs.base_url, Settings(logs=tmp_path))
        async with _client(proxy) as client:
            return await _loop(client, "find x")

    with FakeServer([calls_reply(tool_call("grep", {"pattern": f"p{i}"}, id=f"c{i}")) for i in range(2)]
                    + [text_reply("done")]) as fs:
        seen, _ = asyncio.run(go())
    assert [r.status_code for r in seen] == [200, 200, 200] and seen[-1].json()["choices"][0]["message"]["content"] == "done"
    assert len(opened) == 1, opened
    notes = [json.loads(line) for line in opened[0].read_text(encoding="utf-8").splitlines()]
    assert [next(iter(n)) for n in notes] == ["start"] + ["asked", "answered"] * 3  # every line, the last one included
    assert _open_logs(tmp_path) == 0
