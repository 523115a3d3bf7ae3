"""The proxy's own work per request, in process: its ASGI app against a bare Starlette pass-through,
both in front of the same canned upstream (an httpx.MockTransport answering from the request), driven
over httpx's ASGI transport, no sockets. What the proxy adds over the bare app here is its own work:
the body weighed and parsed, the Chat Completions check and the digests, the fence's steps (results,
budgets, the reply, its calls prechecked, the log and the notes), the upstream body, the answer.

    .venv/bin/python bench/proxy_floor.py [--conversations 200] [--agent-tools] [--length 10] [--stages]
        [--session ID] [--rounds 2]

Short conversations as the proxy section drives them (4 no-op calls, then an answer); `--agent-tools`
declares the section's coding-agent tools (AGENT_TOOLS, 68 KiB) with every request; `--length N`
drives the section's length sweep instead (conversations grown by a call and a RESULT_BYTES result per
turn, the figures read from the requests carrying N's window of messages, as the section reads them:
run starts fall outside it); `--session ID` sends every request under a session header. Each round
runs the bare app, then the proxy; a figure is the time from the ASGI call to its end, per request, p50
and mean. `--stages` says where the proxy's time goes: each stage's time per request (median, mean), a
nested stage part of the one above it (the timers add a microsecond or so per stage to the proxy's
figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.sections.proxy import AGENT_TOOLS, TOOLS, Conversation, Growing, _window  # noqa: E402
from loopfence import Limits  # noqa: E402
from loopfence.proxy import Proxy, Settings  # noqa: E402
from loopfence.testing import calls_reply, text_reply, tool_call  # noqa: E402

UPSTREAM = "http://127.0.0.1:9/v1"
WHOLE = "the whole request (ASGI call to its end)"
CANNED = "    of which the canned upstream's own answer"
SHORT_STEPS = 4  # a short conversation's calls before its answer (the proxy section's)


def _upstream(steps: int | None) -> Callable[[httpx.Request], httpx.Response]:
    """The canned upstream: a no-op call per turn until `steps` results (None: never), then an answer."""
    def answer(request: httpx.Request) -> httpx.Response:
        done = sum(1 for m in json.loads(request.content)["messages"] if m.get("role") == "tool")
        return httpx.Response(200, json=calls_reply(tool_call("noop", {"i": done}, id=f"call_{done}"))
                              if steps is None or done < steps else text_reply("done"))
    return answer


class Stages:
    """Time spent in named functions of the proxy, per request (`measure` wraps them in timers)."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.per_request: list[Counter[str]] = []
        self.labels: list[str] = []

    def measure(self, canned: Callable[[httpx.Request], httpx.Response]) -> Callable[[httpx.Request], httpx.Response]:
        """The stages wrapped in timers; `canned` (the upstream's handler) wrapped too, and returned."""
        from loopfence._log._writer import RunLog
        from loopfence.integrations._fence import FencedRun
        from loopfence.proxy import _app, _load, _runs, _upstream
        for label, owner, name in [
                ("body parsed (JSON)", _app, "loads"), ("body parsed (JSON)", _app, "parsed"),
                ("body weighed", _load.Load, "take"),
                ("request checked and read (parse: digests, view)", _app, "parse"),
                ("run placed, fenced and answered (Runs.answer)", _runs.Runs, "answer"),
                ("  run started (its first request)", _runs.Runs, "_start"),
                ("  results through the guards, logged", _runs.Runs, "_results"),
                ("  request's budgets, logged", FencedRun, "before_request"),
                ("  upstream: body written, sent, reply read", _upstream.Upstream, "complete"),
                (CANNED, None, ""),
                ("  reply checked, logged", FencedRun, "reply"),
                ("  reply's calls prechecked (settle)", _runs.Runs, "settle"),
                ("  of these: log events written", RunLog, "write"),
                ("  of these: notes written", _runs.WireRun, "note")]:
            if owner is not None:
                setattr(owner, name, self._timer(label, getattr(owner, name)))
            if label not in self.labels:  # (one stage, timed in two places: the body parsed whole, or what is new)
                self.labels.append(label)
        return self._timer(CANNED, canned)  # type: ignore[no-any-return]

    def _timer(self, label: str, fn: Any) -> Any:
        now = self.now
        if asyncio.iscoroutinefunction(fn):
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    now[label] += time.perf_counter() - t0
            return timed_async

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                now[label] += time.perf_counter() - t0
        return timed

    def report(self, kept: list[bool]) -> str:
        got = [c for c, k in zip(self.per_request, kept, strict=True) if k]
        lines = [f"  {'stage (ms per request)':52s} {'median':>7s} {'mean':>7s}"]
        for label in [WHOLE, *self.labels]:
            xs = [c[label] * 1e3 for c in got]
            lines.append(f"  {label:52s} {statistics.median(xs):7.3f} {statistics.mean(xs):7.3f}")
        return "\n".join(lines)


def _timed(app: Any, seconds: list[float], stages: Stages | None) -> Any:
    async def timed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if stages is not None:
            stages.now.clear()
        t0 = time.perf_counter()
        await app(scope, receive, send)
        if scope["type"] == "http":
            seconds.append(time.perf_counter() - t0)
            if stages is not None:
                stages.now[WHOLE] = seconds[-1]
                stages.per_request.append(Counter(stages.now))
    return timed


async def _drive(app: Any, first: int, n: int, tools: list[dict[str, Any]], upto: int | None,
                 sizes: list[int], session: str | None = None) -> None:
    """Conversations first..first+n-1 through `app`: short ones to their answer, or (`upto`) grown ones
    until they carry more than `upto` messages; each request's message count goes to `sizes`. `session`:
    sent as `x-session-id` with every request (as opencode sends its session's id)."""
    headers = {"x-session-id": session} if session is not None else None
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1/v1",
                                 headers=headers) as client:
        for k in range(first, first + n):
            talk = Growing(k) if upto is not None else Conversation(k)
            talk.tools = tools
            while not talk.answered and (upto is None or len(talk.messages) <= upto):
                sizes.append(len(talk.messages))
                talk.take(await client.post("/chat/completions", json=talk.body()))


async def main(n: int, tools: list[dict[str, Any]], rounds: int, length: int | None, staged: bool,
               session: str | None = None) -> None:
    canned = _upstream(None if length is not None else SHORT_STEPS)
    stages = Stages() if staged else None
    if stages is not None:
        canned = stages.measure(canned)
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(canned))
    window = _window(length) if length is not None else None
    upto = max(window) if window is not None else None

    async def chat(request: Request) -> Response:
        got = await upstream.post(f"{UPSTREAM}/chat/completions", content=await request.body(),
                                  headers={"content-type": "application/json"})
        return Response(got.content, status_code=got.status_code, media_type=got.headers.get("content-type"))

    bare = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with tempfile.TemporaryDirectory(prefix="loopfence-proxy-floor-") as tmp:
        lifted = Limits(max_steps=None, max_tool_calls=None, max_prompt_tokens=None,  # (68 KiB of tools a request:
                        max_completion_tokens=None)  # past max_prompt_tokens at 3; the sweep's 14 messages: max_steps)
        proxy = Proxy(UPSTREAM, Settings(limits=lifted, logs=Path(tmp)), transport=httpx.MockTransport(canned))
        for r in range(rounds):
            for name, app in (("bare pass-through", bare), ("loopfence proxy", proxy.app)):
                seconds: list[float] = []
                sizes: list[int] = []
                await _drive(app, 1_000_000 * (r + 1), 20, tools, upto, [], session)  # warm-up
                if stages is not None:
                    stages.per_request.clear()
                await _drive(_timed(app, seconds, stages if app is proxy.app else None), 10_000 * (r + 1), n, tools,
                             upto, sizes, session)
                kept = [window is None or size in window for size in sizes]
                xs = [s for s, k in zip(seconds, kept, strict=True) if k]
                print(f"round {r + 1}: {name:18s} p50 {statistics.median(xs) * 1e3:.3f} ms, mean "
                      f"{statistics.mean(xs) * 1e3:.3f} ms ({len(xs)} requests)", flush=True)
                if stages is not None and app is proxy.app:
                    print(stages.report(kept), flush=True)
        await proxy.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--agent-tools", action="store_true", help="declare the coding-agent tools (68 KiB) each request")
    p.add_argument("--length", type=int, help="the length sweep's conversations, read at this many messages (10: "
                   "the requests carrying 6-14)")
    p.add_argument("--stages", action="store_true", help="where the proxy's time goes, stage by stage")
    p.add_argument("--session", metavar="ID",
                   help="send x-session-id: ID with every request (a session's conversations)")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    if a.length is not None and a.length < 1:
        p.error(f"--length must be 1 or more, got {a.length}")
    asyncio.run(main(a.conversations, AGENT_TOOLS if a.agent_tools else TOOLS, a.rounds, a.length, a.stages, a.session))
