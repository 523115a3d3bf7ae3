"""The proxy under a hostile client (issue "the proxy as a shared service, part 2"), the real process:
bodies that balloon once parsed, too many requests at once, connections that never finish their head.
Memory is the process's resident size read from outside (/proc); every test that sends large bodies
runs the proxy under an address-space cap (`prlimit --as`), so that a regression fails here instead of
taking the machine.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopfence.testing import text_reply

from _proxy_support import Proxy, ReplyServer

CAPPED = ("prlimit", "--as=3221225472")  # 3 GiB of address space: a proxy that balloons dies, not the machine
BOUND_MIB = 400  # docs/proxy.md, "Running it for others": the resident size a proxy stays under here
USER = [{"role": "user", "content": "hello"}]


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """The process's resident size (VmRSS) or its peak (VmHWM), in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def empty_parts(mb: int) -> bytes:
    """A chat request of `mb` MB that is almost all empty text parts (half a million objects)."""
    part = '{"type":"text","text":""},'
    n = mb * 1_000_000 // len(part)
    return ('{"model":"m","messages":[{"role":"user","content":[' + part * n + '{"type":"text","text":"hi"}]}]}').encode()


def huge_tools(n_tools: int = 512, n_props: int = 900) -> dict[str, Any]:
    props = {f"p{i}": {"type": "string"} for i in range(n_props)}  # 512 x 900: 12.9 MB of JSON
    tools = [{"type": "function", "function": {"name": f"t{j}", "parameters": {"type": "object", "properties": props}}}
             for j in range(n_tools)]
    return {"model": "m", "messages": USER, "tools": tools}


@pytest.fixture
def upstream() -> Any:
    with ReplyServer(lambda body: text_reply("ok")) as up:
        yield up


def test_a_body_that_balloons_once_parsed_is_refused_before_it_is(upstream: ReplyServer, tmp_path: Path) -> None:
    raw = empty_parts(13)
    with Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err", wrap=CAPPED) as p:
        def send() -> httpx.Response:
            return httpx.post(f"{p.base_url}/chat/completions", content=raw, timeout=120,
                              headers={"Content-Type": "application/json"})
        with ThreadPoolExecutor(10) as pool:  # ten at once
            answers = list(pool.map(lambda _: send(), range(10)))
        peak = rss_mib(p.proc.pid, "VmHWM")
        ok = httpx.post(f"{p.base_url}/chat/completions", json={"model": "m", "messages": USER}, timeout=60)
    assert {r.status_code for r in answers} <= {413, 429}, [r.text[:200] for r in answers]
    assert any(r.status_code == 413 and "MiB" in r.json()["error"]["message"] for r in answers)
    assert ok.status_code == 200 and upstream.requests == [{"model": "m", "messages": USER, **_bound(upstream)}]
    assert peak < BOUND_MIB, f"the proxy peaked at {peak:.0f} MiB reading ten 13 MB bodies"


def _bound(up: ReplyServer) -> dict[str, Any]:
    """The fields the proxy adds to a request (its token bound) as the upstream saw them."""
    return {k: v for k, v in up.requests[0].items() if k not in ("model", "messages")}


def test_past_max_concurrent_a_request_gets_429_at_once(tmp_path: Path) -> None:
    gate = threading.Event()

    def slow(body: dict[str, Any]) -> dict[str, Any]:
        gate.wait(30)
        return text_reply("ok")

    with ReplyServer(slow) as up, Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--max-concurrent", "2",
                                        stderr=tmp_path / "err") as p:
        def send(i: int) -> httpx.Response:
            return httpx.post(f"{p.base_url}/chat/completions", timeout=60,
                              json={"model": "m", "messages": [{"role": "user", "content": f"task {i}"}]})
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(send, i) for i in range(2)]
            deadline = time.monotonic() + 60
            while len(up.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(up.requests) == 2
            busy = send(99)
            gate.set()
            done = [f.result() for f in held]
        after = send(100)
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "proxy_busy" and "--max-concurrent 2" in busy.json()["error"]["message"]
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200
    assert len(up.requests) == 3  # the refused one never went upstream


def test_huge_tool_specs_then_small_runs_stay_within_the_bound(upstream: ReplyServer, tmp_path: Path) -> None:
    """Eight requests of 12.9 MB of tool specs (refused at the door), eight runs of 2 MB of tool specs
    (served: their runs keep one copy of the same specs between them), then 200 small runs: the resident
    size stays within the bound the docs state, and the logs written are under twice the bytes received."""
    spec = huge_tools()
    served = huge_tools(512, 140)  # 2.0 MB
    received = 0
    logs = tmp_path / "logs"
    with Proxy("--upstream", upstream.base_url, "--logs", str(logs), stderr=tmp_path / "err", wrap=CAPPED) as p:
        with httpx.Client(timeout=120) as client:
            for i in range(8):  # eight runs of their own
                big = json.dumps({**spec, "messages": [{"role": "user", "content": f"use the tools ({i})"}]}).encode()
                r = client.post(f"{p.base_url}/chat/completions", content=big,
                                headers={"Content-Type": "application/json"})
                received += len(big)
                assert r.status_code == 413, r.text[:300]
            for i in range(8):  # admitted: eight runs that each keep their tools
                body = {**served, "messages": [{"role": "user", "content": f"use these tools ({i})"}]}
                received += len(json.dumps(body))
                assert client.post(f"{p.base_url}/chat/completions", json=body).status_code == 200
            for i in range(200):
                body = {"model": "m", "messages": [{"role": "user", "content": f"small task {i}"}]}
                received += len(json.dumps(body))
                assert client.post(f"{p.base_url}/chat/completions", json=body).status_code == 200
        rss = rss_mib(p.proc.pid)
    written = sum(f.stat().st_size for f in logs.rglob("*.jsonl"))
    assert rss < BOUND_MIB, f"{rss:.0f} MiB resident after 8 x {len(big) >> 20} MB of tool specs and 200 runs"
    assert written < 2 * received, (written, received)


@pytest.mark.parametrize("header_timeout", ["2", "600"], ids=["the-head-timeout", "the-connection-cap"])
def test_half_open_connections_do_not_keep_a_request_out(header_timeout: str, upstream: ReplyServer,
                                                         tmp_path: Path) -> None:
    """500 connections that never finish their request head, under a 300-descriptor limit: a real request
    is still answered, the stalled ones are closed (by the head timeout, or as the cap makes room when
    the timeout is too long to help), and stderr says so in a few lines."""
    with Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path), "--header-timeout", header_timeout,
               stderr=tmp_path / "err", wrap=("prlimit", "--nofile=300")) as p:
        port = int(p.base_url.rsplit(":", 1)[1].split("/")[0])
        held = []
        for _ in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
            held.append(s)
        r = httpx.post(f"{p.base_url}/chat/completions", json={"model": "m", "messages": USER}, timeout=60)
        assert r.status_code == 200, r.text
        closed = 0
        for s in held:  # the head never came: closed by the proxy (at 2 s; or as newer ones came, past the cap)
            s.settimeout(30 if header_timeout == "2" else 0.05)
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
            s.close()
        lines = p.stderr().splitlines()
    assert closed >= (500 if header_timeout == "2" else 450), closed
    assert len(lines) < 100, lines[:20]
    assert any("connections closed:" in line for line in lines), lines


def test_an_idle_keep_alive_connection_outlives_the_head_timeout(upstream: ReplyServer, tmp_path: Path) -> None:
    """The head timeout times a request head, not a client resting between requests (an agent running a
    tool): the same connection serves its next request after the timeout has passed."""
    with Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path), "--header-timeout", "1",
               stderr=tmp_path / "err") as p, httpx.Client(timeout=60) as client:
        body = {"model": "m", "messages": USER}
        first = client.post(f"{p.base_url}/chat/completions", json=body)
        time.sleep(2.5)
        second = client.post(f"{p.base_url}/chat/completions", json={**body, "messages": [
            *USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]})
        assert first.status_code == second.status_code == 200
        assert "connections closed" not in p.stderr()  # nothing was cut: the one connection served both


@given(st.binary(max_size=300) | st.text(alphabet='{["x\\', max_size=300).map(str.encode))
def test_a_body_is_weighed_by_its_brackets_and_quotes(data: bytes) -> None:
    """`weigh` keeps the three bytes it counts in one pass: the same estimate as counting each."""
    from loopfence.proxy._load import NODE_BYTES, STRING_BYTES, weigh

    assert weigh(data) == len(data) * 2 + (data.count(b"{") + data.count(b"[")) * NODE_BYTES + \
        data.count(b'"') // 2 * STRING_BYTES
