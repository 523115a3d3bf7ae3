"""The test infrastructure of issue 35 holds: a real redis-server that keeps its writes across a
kill -9 and leaves nothing running (tests/_redis_support.py), and a round-robin front that takes turns,
streams SSE as it arrives and answers 502 for a backend that gives no response (tests/_front.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from loopfence.testing import FakeServer, text_reply

from _front import Front, Served
from _redis_support import RedisServer


def _gone(pid: int) -> bool:
    """No redis-server process has this pid (it was reaped, or the pid now belongs to another program)."""
    try:
        return b"redis-server" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_redis_keeps_acknowledged_writes_across_kill_and_restart() -> None:
    with RedisServer() as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = server.client()
        client.set("run:r1:stopped", "budget")
        for _ in range(3):
            client.incr("run:r1:calls")
        client.close()
        first = server.pid
        assert first is not None
        server.kill()
        assert _gone(first) and _refused(server.port)
        server.restart()
        assert server.pid != first
        client = server.client()
        assert client.get("run:r1:stopped") == "budget" and client.get("run:r1:calls") == "3"
        client.close()
    assert server.pid is not None and _gone(server.pid) and _refused(server.port)  # __exit__ stopped it


def test_redis_stop_leaves_no_server_behind() -> None:
    server = RedisServer().start()
    pid, port, folder = server.pid, server.port, server.dir
    assert pid is not None and server.client().ping()
    server.stop()
    assert _gone(pid) and _refused(port) and not folder.exists()
    server.stop()  # twice is fine


def test_redis_is_stopped_when_the_test_body_fails() -> None:
    pid = None
    with pytest.raises(KeyError), RedisServer() as server:
        pid = server.pid
        raise KeyError("the test failed")
    assert pid is not None and _gone(pid)


def test_redis_restart_refuses_a_running_server() -> None:
    with RedisServer() as server, pytest.raises(RuntimeError, match="still running"):
        server.restart()


def _root(fake: FakeServer) -> str:
    return fake.base_url.removesuffix("/v1")


def _chat(url: str, **headers: str) -> httpx.Response:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/chat/completions?probe=1", json=body, headers=headers, timeout=30)


def _text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_front_takes_turns_and_passes_the_request_on() -> None:
    with FakeServer([text_reply("A")]) as a, FakeServer([text_reply("B")]) as b, \
            FakeServer([text_reply("C")]) as c, Front([_root(a), _root(b)]) as front:
        assert [_text(_chat(front.url, **{"X-Loopfence-Run": "r1"})) for _ in range(4)] == ["A", "B", "A", "B"]
        assert a.headers[0]["x-loopfence-run"] == "r1" and a.headers[0]["host"] == f"127.0.0.1:{a.port}"
        assert a.requests[0]["messages"][0]["content"] == "hi"
        front.backends[1] = _root(c)  # a restarted replica's new URL
        assert [_text(_chat(front.url)) for _ in range(2)] == ["A", "C"]
        assert front.routed == [_root(a), _root(b)] * 2 + [_root(a), _root(c)]


def _gated_sse(gate: threading.Event) -> Starlette:
    """SSE that sends its second event only once the test has read the first one (through the front)."""
    async def events() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        opened = await asyncio.to_thread(gate.wait, 30)
        yield b"data: two\n\n" if opened else b"data: the first event never reached the client\n\n"
        yield b"data: [DONE]\n\n"

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", stream, methods=["POST"])])


def test_front_relays_a_stream_event_by_event() -> None:
    gate = threading.Event()
    with Served(_gated_sse(gate)) as backend, Front([backend.url]) as front:
        body = {"model": "fake", "stream": True, "messages": []}
        with httpx.stream("POST", front.url + "/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = []
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                    gate.set()
    assert lines == ["data: one", "data: two", "data: [DONE]"]


def test_front_answers_502_for_a_dead_backend_and_does_not_retry() -> None:
    dead = FakeServer([text_reply("never")]).start()
    dead_url = _root(dead)
    dead.close()
    with FakeServer([{"fault": "close"}]) as closing, FakeServer([text_reply("B")]) as live, \
            Front([dead_url, _root(closing), _root(live)]) as front:
        refused, dropped = _chat(front.url), _chat(front.url)
        for response, backend in ((refused, dead_url), (dropped, _root(closing))):
            assert response.status_code == 502
            error = response.json()["error"]
            assert error["type"] == "bad_gateway" and backend in error["message"], error
        assert closing.headers and not live.headers  # the dropped POST reached its backend, went nowhere else
        assert _text(_chat(front.url)) == "B"
