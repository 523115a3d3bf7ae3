"""A FakeServer reply counts as served only once it has been written whole to a client still there
(issue 30, item 7): when the client went away first (before its request was even read whole, or
before the reply was written, so that writes fail) or was killed with the reply unread, the run's next
request gets that reply again. Real sockets on 127.0.0.1 for the clients that go away (one a process
killed with SIGKILL), httpx for the ones that stay, and a real `loopfence batch` process killed while
its request waits, then resumed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call
from loopfence.testing._fakeserver import RUN_HEADER

WAIT_S = 30  # a hang, not a timing: each wait is for the server to finish with a client that left
CALL = calls_reply(tool_call("read_file", path="a.txt"))
DONE = text_reply("done")


def _request(run: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{RUN_HEADER}: {run}\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def _connect(srv: FakeServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S)


def _wait_until(what: Any, why: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.005)


def _given_back(srv: FakeServer, n: int = 1) -> None:
    """Wait until the server has handed `n` replies back (getattr: on a server without the notion,
    the wait runs out and the next request shows what the client gets)."""
    deadline = time.monotonic() + WAIT_S
    while len(getattr(srv, "undelivered", ())) < n and time.monotonic() < deadline:
        time.sleep(0.005)


def _next_reply(srv: FakeServer, run: str, **body: Any) -> dict[str, Any]:
    reply = httpx.post(f"{srv.base_url}/chat/completions", json={"messages": [], **body},
                       headers={RUN_HEADER: run}, timeout=WAIT_S)
    assert reply.status_code == 200
    if body.get("stream"):
        return {"text": reply.text}
    return reply.json()["choices"][0]["message"]


def test_a_request_cut_short_by_its_client_gets_no_reply_from_the_sequence() -> None:
    with FakeServer([CALL, DONE]) as srv:
        whole = _request("r1", {"messages": [{"role": "user", "content": "hi"}]})
        with _connect(srv) as s:
            s.sendall(whole[: len(whole) - 10])  # the body cut short, then the client is gone
        _wait_until(lambda: srv.served == 1, "the server never read the request")
        _given_back(srv)
        assert _next_reply(srv, "r1")["tool_calls"][0]["function"]["name"] == "read_file"  # the same reply
        assert _next_reply(srv, "r1")["content"] == "done"
        assert srv.undelivered == [("r1", 0)] and len(srv.runs["r1"]) == 3  # every request is still recorded


class Held(FakeServer):
    """Holds each reply until `release` is set: a client can go away before it is written."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.release = threading.Event()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        form = super()._next(body, headers)
        self.release.wait(WAIT_S)
        return form


KILLED_CLIENT = """
import select, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(bytes.fromhex(sys.argv[2]))
select.select([s], [], [])  # the reply is here, unread
print("ready", flush=True)
sys.stdin.read()  # until it is killed
"""


def test_a_reply_its_killed_client_never_read_is_served_again() -> None:
    with FakeServer([CALL, DONE]) as srv:
        client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, str(srv.port),
                                   _request("r2", {"messages": []}).hex()], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        assert client.stdout is not None
        assert client.stdout.readline() == b"ready\n"
        os.kill(client.pid, signal.SIGKILL)  # its socket closes with the reply unread: a reset
        client.wait(WAIT_S)
        _given_back(srv)
        assert _next_reply(srv, "r2")["tool_calls"][0]["function"]["name"] == "read_file"
        assert srv.undelivered == [("r2", 0)]
        assert _next_reply(srv, "r2")["content"] == "done"
        assert _next_reply(srv, "other")["tool_calls"]  # another run: its own sequence, from the start


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_whose_writes_fail_is_served_again(stream: bool) -> None:
    with Held([CALL, DONE]) as srv:
        with _connect(srv) as s:
            s.sendall(_request("r3", {"messages": [], "stream": stream}))
            _wait_until(lambda: srv.served == 1, "the server never read the request")
        srv.release.set()  # the client is gone: the server writes to a closed connection
        _given_back(srv)
        again = _next_reply(srv, "r3", stream=stream)
        assert '"read_file"' in again["text"] if stream else again["tool_calls"]
        assert srv.undelivered == [("r3", 0)]
        assert _next_reply(srv, "r3")["content"] == "done"


def test_a_reply_read_whole_moves_the_sequence_on() -> None:
    with FakeServer([CALL, DONE]) as srv:
        with _connect(srv) as s:  # reads the whole reply, then closes: the reply was served
            s.sendall(_request("r4", {"messages": []}))
            got = b""
            while b'"read_file"' not in got or not got.rstrip().endswith(b"}"):
                got += s.recv(65536)
        assert _next_reply(srv, "r4")["content"] == "done"
        assert srv.undelivered == []


def test_a_resumed_batch_episode_gets_the_reply_its_killed_process_never_read(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("hello\n")
    (tmp_path / "eps.jsonl").write_text(json.dumps({"id": "e1", "task": "read a.txt", "workspace": "ws"}) + "\n")
    out = tmp_path / "job"
    argv = [sys.executable, "-m", "loopfence", "batch", "--quiet"]
    with Held([CALL, DONE]) as srv:
        first = subprocess.Popen([*argv, "eps.jsonl", "--out", str(out), "--base-url", srv.base_url,
                                  "--model", "fake"], cwd=tmp_path, stderr=subprocess.PIPE)
        try:
            _wait_until(lambda: srv.served == 1 or first.poll() is not None, "the batch sent no request")
            assert first.poll() is None, first.communicate()[1]
        finally:
            os.kill(first.pid, signal.SIGKILL)  # killed while its request waits for the reply
            first.communicate(timeout=WAIT_S)
        srv.release.set()
        _given_back(srv)
        again = subprocess.run([*argv, "--resume", str(out)], cwd=tmp_path, capture_output=True, text=True,
                               timeout=WAIT_S * 4)
    assert again.returncode == 0, again.stderr
    [row] = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert (row["stop"], row["resumed"]) == ("final_answer", True)
    assert (row["requests"], row["executions"]) == (2, 1), row  # not 1 request and its call skipped
