"""`loopfence proxy`: the latency it adds per request, side by side in one run with the same loopback
upstream reached directly, through a bare Starlette + uvicorn + httpx pass-through, and through
LiteLLM's proxy (from its own venv, bench/.venv-litellm: its pins conflict with the peers'; never in --quick); then many
concurrent conversations through it, and the memory each open run holds.

Every path gets the same traffic: conversations of a no-op call with fresh arguments per turn, then
an answer (the client sends each turn's result back, as an agent does), one request at a time over a
keep-alive connection, the paths in lockstep (each turn's request along every path in turn, `_lockstep`:
a drift over the run, such as a process's heap growing, falls on every path alike). The upstream answers
from the request itself, in a process of its own; each server is a process of its own. Added latency =
the path's percentile minus the direct one's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from ..report import Section, table

TITLE = "Proxy"
# grown: conversations grown to the longest length; short: more grown only through the shortest length's
# window (its goals are read there: 8 conversations give it 32 requests, too few for a stable p50)
# agent: conversations declaring a coding agent's tools (AGENT_TOOLS)
FULL = {"conversations": 200, "steps": 4, "concurrent": 100, "lengths": (10, 100, 500), "grown": 8, "short": 50,
        "agent": 100}
QUICK = {"conversations": 4, "steps": 2, "concurrent": 10, "lengths": (10, 30), "grown": 2, "short": 2, "agent": 2}
RESULT_BYTES = 3900  # each tool result of the length sweep: ~1 MB of history at 500 messages
GOAL_GROWTH = 1.5  # the proxy/bare ratio of added p50 at the longest length: at most this multiple of the shortest's
SWEEP_LIMITS = ("max_steps=none", "max_tool_calls=none", "max_prompt_tokens=none", "max_completion_tokens=none",
                "max_wall_seconds=none")  # the proxy's budgets lifted: runs that grow past the coding profile's
# (the sweep's 550 messages; 68 KiB of agent tools a request pass max_prompt_tokens at the third); none stops here
GOAL_VS_LITELLM = 0.25  # the proxy's p50 addition: at most this share of LiteLLM's
GOAL_VS_BARE = 2.0  # and at most this multiple of a bare pass-through's
START_S = 120.0  # how long a server may take to start: bounds a failure, not a speed
ROOT = Path(__file__).resolve().parents[2]
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]  # no 40 ms delayed-ACK stall between a request's head and body
_URL = re.compile(r"(http://127\.0\.0\.1:\d+/v1)")


def _upstream_main(steps: int) -> None:
    """The stateless upstream: a no-op call per turn (a fresh call id each) until `steps` results,
    then an answer."""
    from loopfence.testing import calls_reply, text_reply, tool_call

    from .concurrency import PerRunServer

    class Upstream(PerRunServer):
        def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
            done = sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "tool")
            return calls_reply(tool_call("noop", {"i": done}, id=f"call_{done}")) if done < self.steps \
                else text_reply("done")

    with Upstream(steps) as srv:
        print(f"upstream listening on {srv.base_url}", flush=True)
        sys.stdin.read()  # until the parent closes our stdin


def _passthrough_main(upstream: str) -> None:
    """A bare pass-through on the same kind of stack as the proxy: Starlette on uvicorn, httpx upstream."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    client = httpx.AsyncClient(timeout=60, transport=httpx.AsyncHTTPTransport(socket_options=NODELAY, limits=httpx.Limits(
        max_connections=200, max_keepalive_connections=200)))

    async def chat(request: Request) -> Response:
        got = await client.post(f"{upstream}/chat/completions", content=await request.body(),
                                headers={"content-type": "application/json"})
        return Response(got.content, status_code=got.status_code, media_type=got.headers.get("content-type"))

    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an
    # accepted socket inherits it; without it every reply waits ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"pass-through listening on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    asyncio.run(server.serve(sockets=[sock]))


class Child:
    """A server in a process of its own; its URL is the first http://127.0.0.1:PORT/v1 it prints."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, **(env or {})))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = _URL.search(line)
        if not found:
            self.close()
            raise RuntimeError(f"{argv[:4]} printed {line!r}, not its URL")
        self.url = found.group(1)

    def rss_kib(self) -> int:
        """Resident memory (Linux /proc), KiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 30 s; returns once the process is gone."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _module(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench.sections.proxy", *args]


TOOLS = [{"type": "function", "function": {"name": "noop", "description": "Do nothing.", "parameters": {
    "type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}}}]
# a coding agent's tools (tens of KB sent with every request): the upstream's noop and 19 more like an agent's
AGENT_TOOLS = TOOLS + [{"type": "function", "function": {
    "name": f"tool_{i}", "description": "Reads a file from the local filesystem. You can access any file directly "
    "by using this tool; the path must be absolute. " * 18, "parameters": {
        "type": "object", "properties": {f"arg_{j}": {"type": "string", "description": f"what argument {j} says, "
                                                      "as the agent's documentation puts it " * 3} for j in range(6)},
        "required": ["arg_0"], "additionalProperties": False}}} for i in range(19)]


class Conversation:
    """One agent's conversation: each reply pushed back as it came, each call answered."""

    tools = TOOLS

    def __init__(self, k: int) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": f"Conversation {k}: call noop, then answer."}]
        self.answered = False

    def body(self) -> dict[str, Any]:
        return {"model": "fake", "messages": self.messages, "tools": self.tools}

    def take(self, got: httpx.Response) -> None:
        got.raise_for_status()
        message = got.json()["choices"][0]["message"]
        self.messages.append(message)
        calls = message.get("tool_calls") or []
        self.messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"ok {c['function']['arguments']}"}
                          for c in calls]
        self.answered = not calls


class AgentConversation(Conversation):
    """A conversation that declares a coding agent's tools (AGENT_TOOLS) with every request."""

    tools = AGENT_TOOLS


class Growing(Conversation):
    """A conversation that grows by one call and a RESULT_BYTES result per turn, without end."""

    def take(self, got: httpx.Response) -> None:
        got.raise_for_status()
        message = got.json()["choices"][0]["message"]
        self.messages.append(message)
        for c in message.get("tool_calls") or []:
            head = f"ok {c['function']['arguments']} "
            self.messages.append({"role": "tool", "tool_call_id": c["id"],
                                  "content": head + "".join(f"line {j} of {head}\n" for j in range(400))[:RESULT_BYTES]})


def _window(length: int) -> range:
    """The message counts a length's figures are read from (a request carries 1 + 2t messages)."""
    spread = max(4, length // 10)
    return range(length - spread, length + spread + 1)


def _lockstep(urls: dict[str, str], talk: Any, first: int, n: int,
              reach: dict[str, int] | None = None) -> dict[str, list[tuple[int, float]]]:
    """Conversations first..first+n-1 (`talk(k)`: a Conversation), each along every path in lockstep:
    each turn's request goes to every path, one after the other (which path goes first rotates turn by
    turn), so the paths are measured side by side, under the same drift (a process's heap growing, the
    machine's clock), never one path's whole share before the next's. Each path's (messages sent,
    seconds) per request; a conversation goes on until its answer, or past `reach[path]` messages."""
    out: dict[str, list[tuple[int, float]]] = {name: [] for name in urls}
    clients = {name: httpx.Client(timeout=120, transport=httpx.HTTPTransport(socket_options=NODELAY)) for name in urls}
    try:
        for c in range(first, first + n):
            talks = {name: talk(c) for name in urls}
            for turn in itertools.count():
                live = [name for name, t in talks.items()
                        if not t.answered and len(t.messages) <= (reach or {}).get(name, sys.maxsize)]
                if not live:
                    break
                for name in live[turn % len(live):] + live[:turn % len(live)]:
                    t, size = talks[name], len(talks[name].messages)
                    t0 = time.perf_counter()
                    got = clients[name].post(f"{urls[name]}/chat/completions", json=t.body())
                    out[name].append((size, time.perf_counter() - t0))
                    t.take(got)
    finally:
        for client in clients.values():
            client.close()
    return out


def _pct(xs: list[float], p: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] if len(xs) > 1 else xs[0]


async def _concurrent(url: str | list[str], first: int, n: int, upto: int, seconds: list[float] | None = None,
                      failed: dict[str, list[str]] | None = None) -> tuple[int, int, float]:
    """n conversations at once, each up to `upto` requests (fewer than its answer: left open):
    (requests answered, conversations ended with their answer, wall s). Given a list of URLs, each
    request goes to the next one in turn (round-robin, request by request, as a load balancer would).
    `seconds` collects each answered request's time; `failed`, when given, collects each failed
    request's message by kind (its conversation ends there) instead of raising."""
    urls = [url] if isinstance(url, str) else url
    talks = [Conversation(k) for k in range(first, first + n)]
    requests = 0
    turn = itertools.count()

    async def one(client: httpx.AsyncClient, talk: Conversation) -> None:
        nonlocal requests
        for _ in range(upto):
            t0 = time.perf_counter()
            try:
                talk.take(await client.post(f"{urls[next(turn) % len(urls)]}/chat/completions", json=talk.body()))
            except httpx.HTTPError as exc:
                if failed is None:
                    raise
                kind, message = _failure(exc)
                failed.setdefault(kind, []).append(message)
                return
            if seconds is not None:
                seconds.append(time.perf_counter() - t0)
            requests += 1
            if talk.answered:
                return

    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(one(client, talk) for talk in talks))
    return requests, sum(t.answered for t in talks), time.perf_counter() - t0


def _failure(exc: httpx.HTTPError) -> tuple[str, str]:
    """A failed request's kind (HTTP status and error code, or the transport error's class) and message."""
    if isinstance(exc, httpx.HTTPStatusError):
        got = exc.response
        try:
            error = got.json().get("error") or {}
        except ValueError:
            error = {}
        return f"HTTP {got.status_code} {error.get('code') or ''}".strip(), str(error.get("message") or got.text)[:300]
    return type(exc).__name__, str(exc)[:300]


def _litellm(upstream: str, tmp: Path) -> Child | str:
    """LiteLLM's proxy in front of the upstream, or why not."""
    exe = next((p for p in (ROOT / "bench" / ".venv-litellm" / "bin" / "litellm", Path(sys.executable).parent / "litellm")
                if p.exists()), None)
    if exe is None:
        return "not installed (`make bench` puts bench/requirements-litellm.txt in bench/.venv-litellm)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp / "litellm.yaml"
    config.write_text(f"model_list:\n  - model_name: fake\n    litellm_params:\n      model: openai/fake\n"
                      f"      api_base: {upstream}\n      api_key: sk-bench\n", encoding="utf-8")
    proc = subprocess.Popen([str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
                            cwd=tmp, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, LITELLM_TELEMETRY="False", LITELLM_LOG="ERROR"))
    child = Child.__new__(Child)
    child.proc, child.url = proc, f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=2).status_code == 200:
                return child
        except httpx.TransportError:
            time.sleep(0.5)
    child.close()
    return f"did not start in {START_S:.0f} s (exit {proc.poll()})"


def _sweep(cfg: dict[str, Any], tmp: Path, litellm: Child | str) -> tuple[str, dict[str, Any]]:
    """The added latency by conversation length (p50, p99), each path side by side: the proxy's
    cost must not grow with the history faster than a bare pass-through's."""
    lengths, k = cfg["lengths"], cfg["grown"]
    upto = max(_window(max(lengths)))
    upstream = Child(_module("upstream", "1000000"))
    servers: dict[str, Child | str] = {"direct": upstream}
    samples: dict[str, list[tuple[int, float]]] = {}
    try:
        servers["bare pass-through"] = Child(_module("passthrough", upstream.url))
        servers["loopfence proxy"] = Child([sys.executable, "-m", "loopfence", "proxy", "--upstream", upstream.url,
                                            "--port", "0", "--logs", str(tmp / "sweep-logs"),
                                            *(a for limit in SWEEP_LIMITS for a in ("--limit", limit))])
        if isinstance(litellm, Child):  # the shortest length only: LiteLLM is the per-request floor's peer
            servers["LiteLLM proxy"] = litellm
        urls = {name: server.url for name, server in servers.items() if isinstance(server, Child)}
        for url in urls.values():
            _lockstep({"warm-up": url}, Growing, 90_000, 1, {"warm-up": 12})
        reach = {name: max(_window(min(lengths))) if name == "LiteLLM proxy" else upto for name in urls}
        samples = _lockstep(urls, Growing, 100_000, k, reach)
        shortest = dict.fromkeys(urls, max(_window(min(lengths))))
        for name, got in _lockstep(urls, Growing, 200_000, cfg["short"], shortest).items():
            samples[name] += got
    finally:
        for name, server in servers.items():
            if isinstance(server, Child) and name != "LiteLLM proxy":
                server.close()
    data: dict[str, Any] = {}
    rows = []
    for length in lengths:
        window = _window(length)
        at = {name: [t for n, t in got if n in window] for name, got in samples.items()}
        base = {p: _pct(at["direct"], p) for p in (50, 99)}
        row: dict[str, Any] = {"requests": len(at["direct"])}
        for name, xs in at.items():
            if xs and name != "direct":
                row[name] = {"added_p50_ms": (_pct(xs, 50) - base[50]) * 1e3, "added_p99_ms": (_pct(xs, 99) - base[99]) * 1e3}
        bare, ours = row["bare pass-through"]["added_p50_ms"], row["loopfence proxy"]["added_p50_ms"]
        row["ratio"] = ours / bare if bare > 0 else float("inf")
        data[str(length)] = row
        lite = row.get("LiteLLM proxy")
        rows.append([length, row["requests"], f"{base[50] * 1e3:.2f}", f"{bare:+.2f}",
                     f"{row['bare pass-through']['added_p99_ms']:+.2f}", f"{ours:+.2f}",
                     f"{row['loopfence proxy']['added_p99_ms']:+.2f}", f"{row['ratio']:.1f}x",
                     f"{lite['added_p50_ms']:+.2f}" if lite else ""])
    short, long = data[str(min(lengths))], data[str(max(lengths))]
    goals = {"vs_bare": short["ratio"] <= GOAL_VS_BARE,
             "growth": long["ratio"] <= GOAL_GROWTH * short["ratio"]}
    lite = short.get("LiteLLM proxy")
    if lite is not None:
        goals["vs_litellm"] = short["loopfence proxy"]["added_p50_ms"] <= GOAL_VS_LITELLM * lite["added_p50_ms"]
    data["goals"] = goals
    said = [f"at {min(lengths)} messages the proxy adds {short['ratio']:.1f}x the bare pass-through's p50 (goal "
            f"at most {GOAL_VS_BARE:g}x): {'met' if goals['vs_bare'] else 'not met'}",
            f"from {min(lengths)} to {max(lengths)} messages that ratio goes from {short['ratio']:.1f}x to "
            f"{long['ratio']:.1f}x (goal: at most {GOAL_GROWTH:g} times the first, {GOAL_GROWTH * short['ratio']:.1f}x): "
            f"{'met' if goals['growth'] else 'not met'}"]
    if lite is not None:
        said.append(f"at {min(lengths)} messages it adds {short['loopfence proxy']['added_p50_ms']:.2f} ms against "
                    f"LiteLLM's {lite['added_p50_ms']:.2f} (goal at most {GOAL_VS_LITELLM:g} of it): "
                    f"{'met' if goals['vs_litellm'] else 'not met'}")
    md = "\n\n".join([
        f"By conversation length: {k} conversations per path (in lockstep, as above), each grown by one no-op call and a "
        f"{RESULT_BYTES / 1024:.1f} KiB result per turn to {upto} messages, and {cfg['short']} more to "
        f"{max(_window(min(lengths)))} messages (LiteLLM goes that far only); each length's figures are the requests "
        f"carrying {min(_window(min(lengths)))}-{max(_window(min(lengths)))} ... "
        f"{min(_window(max(lengths)))}-{max(_window(max(lengths)))} messages, the added latency the path's "
        "percentile minus the direct one's over the same requests.",
        table(["messages", "requests", "direct p50 ms", "bare added p50", "bare added p99", "loopfence added p50",
               "loopfence added p99", "ratio (p50)", "LiteLLM added p50"], rows),
        "; ".join(said) + "."])
    return md, data


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cfg = QUICK if quick else FULL
    n, steps = cfg["conversations"], cfg["steps"]
    rows, data, notes = [], {}, []
    with tempfile.TemporaryDirectory(prefix="loopfence-bench-proxy-") as tmp_name:
        tmp = Path(tmp_name)
        upstream = Child(_module("upstream", str(steps)))
        servers: dict[str, Child | str] = {"direct": upstream}
        try:
            servers["bare pass-through (Starlette + uvicorn + httpx)"] = Child(_module("passthrough", upstream.url))
            servers["loopfence proxy"] = Child([sys.executable, "-m", "loopfence", "proxy", "--upstream", upstream.url,
                                                "--port", "0", "--logs", str(tmp / "logs"),  # 100 conversations at
                                                "--max-concurrent", str(2 * cfg["concurrent"]),  # once, below
                                                *(a for limit in SWEEP_LIMITS for a in ("--limit", limit))])
            litellm: Child | str = "skipped in --quick" if quick else _litellm(upstream.url, tmp)
            servers["LiteLLM proxy"] = litellm
            for name, server in servers.items():
                if isinstance(server, str):
                    notes.append(f"{name}: {server}.")
                else:  # warm-up: connections, imports, first runs
                    _lockstep({name: server.url}, Conversation, 10_000, 2)
            urls = {name: server.url for name, server in servers.items() if isinstance(server, Child)}
            for name, got in _lockstep(urls, Conversation, 0, n).items():
                lat = [t for _, t in got]
                data[name] = {"p50_ms": _pct(lat, 50) * 1e3, "p99_ms": _pct(lat, 99) * 1e3, "requests": len(lat)}
            agent = {name: url for name, url in urls.items() if name != "LiteLLM proxy"}  # (the floor's peer only)
            for name, got in _lockstep(agent, AgentConversation, 40_000, cfg["agent"]).items():
                lat = [t for _, t in got]
                data[name]["agent_tools"] = {"p50_ms": _pct(lat, 50) * 1e3, "requests": len(lat)}
            direct = data["direct"]
            for name, d in data.items():
                d["added_p50_ms"], d["added_p99_ms"] = d["p50_ms"] - direct["p50_ms"], d["p99_ms"] - direct["p99_ms"]
                rows.append([name, d["requests"], f"{d['p50_ms']:.2f}", f"{d['p99_ms']:.2f}",
                             "" if name == "direct" else f"{d['added_p50_ms']:+.2f}",
                             "" if name == "direct" else f"{d['added_p99_ms']:+.2f}"])
            proxy = servers["loopfence proxy"]
            assert isinstance(proxy, Child)
            conc = cfg["concurrent"]
            before = proxy.rss_kib()
            opened, _, _ = asyncio.run(_concurrent(proxy.url, 20_000, conc, steps))  # every run left open
            held = proxy.rss_kib()
            requests, ended, wall = asyncio.run(_concurrent(proxy.url, 30_000, conc, steps + 1))  # to their answers
            data["concurrent"] = {"conversations": conc, "requests": requests, "answered_all": ended == conc,
                                  "wall_s": wall, "rss_before_kib": before, "rss_open_kib": held,
                                  "kib_per_open_run": (held - before) / conc, "open_requests": opened}
            sweep_md, data["by_length"] = _sweep(cfg, tmp, litellm)
        finally:
            for server in servers.values():
                if isinstance(server, Child):
                    server.close()
    bare = data.get("bare pass-through (Starlette + uvicorn + httpx)", {}).get("added_p50_ms")
    ours = data["loopfence proxy"]["added_p50_ms"]
    lite = data.get("LiteLLM proxy", {}).get("added_p50_ms")
    goals = [f"p50 added by loopfence proxy: {ours:.2f} ms; goal: at most {GOAL_VS_BARE:g}x the bare "
             f"pass-through's ({bare:.2f} ms): {'met' if ours <= GOAL_VS_BARE * bare else 'not met'}"]
    if lite is not None:
        goals.append(f"and at most {GOAL_VS_LITELLM:g} of LiteLLM's ({lite:.2f} ms): "
                     f"{'met' if ours <= GOAL_VS_LITELLM * lite else 'not met'}")
    c = data["concurrent"]
    with_tools = {name: d["agent_tools"]["p50_ms"] - data["direct"]["agent_tools"]["p50_ms"]
                  for name, d in data.items() if name != "direct" and "agent_tools" in d}
    agent_md = (f"The same with a coding agent's tools declared in every request ({len(AGENT_TOOLS)} tools, "
                f"{len(json.dumps(AGENT_TOOLS)) // 1024} KiB; {cfg['agent']} conversations per path, in lockstep): "
                + ", ".join(f"{name} adds {v:+.2f} ms p50" for name, v in with_tools.items()) + ".")
    md = "\n\n".join([
        f"{n} conversations per path, each {steps} no-op calls with fresh arguments then an answer "
        f"({n * (steps + 1)} requests, one at a time over keep-alive, the paths in lockstep: each turn's request "
        "along every path in turn); every server a process of its own, "
        "the upstream answering from the request itself; the proxy's budgets lifted (no run here may stop).",
        table(["path", "requests", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms"], rows),
        "; ".join(goals) + ".", *notes, agent_md,
        f"{c['conversations']} conversations at once through the proxy: {c['requests']} requests, "
        f"{'all answered' if c['answered_all'] else 'NOT all answered'}, {c['wall_s']:.2f} s. "
        f"Memory: {c['rss_before_kib'] / 1024:.1f} MiB resident before, {c['rss_open_kib'] / 1024:.1f} MiB with "
        f"{c['conversations']} more runs open ({c['open_requests']} requests in): "
        f"{c['kib_per_open_run']:.0f} KiB per open run.",
        sweep_md,
    ])
    return Section(TITLE, md, data)


if __name__ == "__main__":
    if sys.argv[1] == "upstream":
        _upstream_main(int(sys.argv[2]))
    else:
        _passthrough_main(sys.argv[2])
