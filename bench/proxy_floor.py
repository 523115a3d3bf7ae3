"""The proxy's own work per request, in process: its ASGI app against a bare Starlette pass-through,
both in front of the same canned upstream (an httpx.MockTransport answering from the request), driven
over httpx's ASGI transport, no sockets. What the proxy adds over the bare app here is its own work:
the body weighed and parsed, the Chat Completions check and the digests, the fence's steps (results,
budgets, the reply, its calls prechecked, the log and the notes), the upstream body, the answer.

    .venv/bin/python bench/proxy_floor.py [--conversations 200] [--agent-tools] [--rounds 2]

Short conversations as the proxy section drives them (4 no-op calls, then an answer); `--agent-tools`
declares the section's coding-agent tools (AGENT_TOOLS, 68 KiB) with every request. Each round runs
the bare app, then the proxy; a figure is the time from the ASGI call to its end, per request, p50 and
mean (a run's first request, which starts it, included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.sections.proxy import AGENT_TOOLS, TOOLS  # noqa: E402
from loopfence import Limits  # noqa: E402
from loopfence.proxy import Proxy, Settings  # noqa: E402
from loopfence.testing import calls_reply, text_reply, tool_call  # noqa: E402

UPSTREAM = "http://127.0.0.1:9/v1"


def _upstream(request: httpx.Request) -> httpx.Response:
    done = sum(1 for m in json.loads(request.content)["messages"] if m.get("role") == "tool")
    return httpx.Response(200, json=calls_reply(tool_call("noop", {"i": done}, id=f"call_{done}")) if done < 4
                          else text_reply("done"))


def _timed(app: Any, seconds: list[float]) -> Any:
    async def timed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        t0 = time.perf_counter()
        await app(scope, receive, send)
        if scope["type"] == "http":
            seconds.append(time.perf_counter() - t0)
    return timed


async def _drive(app: Any, first: int, n: int, tools: list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1/v1") as client:
        for k in range(first, first + n):
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"Conversation {k}: call noop, then answer."}]
            while True:
                got = await client.post("/chat/completions", json={"model": "fake", "messages": messages, "tools": tools})
                got.raise_for_status()
                message = got.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"ok {c['function']['arguments']}"}
                             for c in calls]
                if not calls:
                    break


async def main(n: int, tools: list[dict[str, Any]], rounds: int) -> None:
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(_upstream))

    async def chat(request: Request) -> Response:
        got = await upstream.post(f"{UPSTREAM}/chat/completions", content=await request.body(),
                                  headers={"content-type": "application/json"})
        return Response(got.content, status_code=got.status_code, media_type=got.headers.get("content-type"))

    bare = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with tempfile.TemporaryDirectory(prefix="loopfence-proxy-floor-") as tmp:
        lifted = Limits(max_prompt_tokens=None, max_completion_tokens=None)  # 68 KiB of tools a request: past 3
        proxy = Proxy(UPSTREAM, Settings(limits=lifted, logs=Path(tmp)), transport=httpx.MockTransport(_upstream))
        for r in range(rounds):
            for name, app in (("bare pass-through", bare), ("loopfence proxy", proxy.app)):
                seconds: list[float] = []
                await _drive(app, 1_000_000 * (r + 1), 20, tools)  # warm-up
                await _drive(_timed(app, seconds), 10_000 * (r + 1), n, tools)
                print(f"round {r + 1}: {name:18s} p50 {statistics.median(seconds) * 1e3:.3f} ms, mean "
                      f"{statistics.mean(seconds) * 1e3:.3f} ms ({len(seconds)} requests)", flush=True)
        await proxy.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--agent-tools", action="store_true", help="declare the coding-agent tools (68 KiB) each request")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    asyncio.run(main(a.conversations, AGENT_TOOLS if a.agent_tools else TOOLS, a.rounds))
