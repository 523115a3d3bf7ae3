"""Sessions (docs/proxy.md, "Which run a request belongs to"): under one session id, an agent's main
conversation, its side requests with no tools (titles, summaries) and its sub-agents with other tools
are each a run of their own. A property test over generated sessions: side requests interleaved
anywhere never stop one of the main conversation's legitimate calls, and never reset its repetition
counts (a main conversation that asks for the same read again and again stops at the same request
with or without them). The proxy runs in process (httpx's ASGI transport) in front of a real HTTP
upstream on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence.proxy import Proxy, Settings
from loopfence.testing._builders import calls_reply, text_reply, tool_call

from _proxy_support import ReplyServer


def _tool(name: str, arg: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}


MAIN_TOOLS = [_tool("read", "path"), _tool("edit", "path")]
SUB_TOOLS = [_tool("grep", "pattern")]
SESSION = {"x-session-id": "ses_prop"}


def _turn(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The main conversation reads the paths its task lists, one a turn, then answers; a sub-agent
    greps twice, then answers; a request with no tools gets a title."""
    names = {t["function"]["name"] for t in body.get("tools") or []}
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    turn = _turn(body)
    if "read" in names:
        plan = json.loads(task.removeprefix("main:"))
        if turn < len(plan):
            return calls_reply(tool_call("read", {"path": plan[turn]}, id=f"r{turn}"))
        return text_reply("done")
    if "grep" in names:
        return calls_reply(tool_call("grep", {"pattern": f"p{turn}"}, id=f"g{turn}")) if turn < 2 else text_reply("found")
    return text_reply(f"A title for {task[:20]}")


@pytest.fixture(scope="module")
def upstream() -> Iterator[ReplyServer]:
    with ReplyServer(reply) as up:
        yield up


async def session(base_url: str, plan: list[str], sides: list[list[str]]) -> list[httpx.Response]:
    """The main conversation through the proxy, with `sides[i]` (side requests: "title", "sub") sent
    before its i-th request under the same session id; its responses, until a stop or its answer."""
    proxy = Proxy(base_url, Settings(logs=None))
    main: list[dict[str, Any]] = [{"role": "system", "content": "You are the agent."},
                                  {"role": "user", "content": "main:" + json.dumps(plan)}]
    sub: list[dict[str, Any]] = [{"role": "system", "content": "You are a sub-agent."},
                                 {"role": "user", "content": "find the callers"}]
    got = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app), base_url="http://127.0.0.1/v1",
                                 timeout=30) as client:
        async def post(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> httpx.Response:
            r = await client.post("/chat/completions", headers=SESSION,
                                  json={"model": "m", "messages": messages, **({"tools": tools} if tools else {})})
            assert r.status_code == 200, r.text
            return r

        for step in range(len(plan) + 1):
            for side in sides[step] if step < len(sides) else []:
                if side == "title":
                    await post([{"role": "system", "content": "You are a title generator."},
                                {"role": "user", "content": f"title the conversation at step {step}"}], [])
                elif not sub or sub[-1]["role"] != "assistant" or sub[-1].get("tool_calls"):
                    message = (await post(sub, SUB_TOOLS)).json()["choices"][0]["message"]
                    sub.append(message)
                    for c in message.get("tool_calls") or []:
                        sub.append({"role": "tool", "tool_call_id": c["id"], "content": "callers: a.py"})
            r = await post(main, MAIN_TOOLS)
            got.append(r)
            message = r.json()["choices"][0]["message"]
            if "x-loopfence-stop" in r.headers or not message.get("tool_calls"):
                break
            main.append(message)
            for c in message["tool_calls"]:
                path = json.loads(c["function"]["arguments"])["path"]
                main.append({"role": "tool", "tool_call_id": c["id"], "content": f"the text of {path}"})
    await proxy.aclose()
    return got


SIDES = st.lists(st.lists(st.sampled_from(["title", "sub"]), max_size=3), max_size=9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.sampled_from([f"f{i}.py" for i in range(12)]), min_size=1, max_size=8, unique=True),
       sides=SIDES)
def test_side_requests_never_stop_a_legitimate_call_of_the_main_conversation(
        upstream: ReplyServer, plan: list[str], sides: list[list[str]]) -> None:
    got = asyncio.run(session(upstream.base_url, plan, sides))
    assert all("x-loopfence-stop" not in r.headers for r in got), got[-1].text
    asked = [c["function"]["name"] for r in got for c in r.json()["choices"][0]["message"].get("tool_calls") or []]
    assert asked == ["read"] * len(plan)  # every call released, none refused as unknown
    assert got[-1].json()["choices"][0]["message"]["content"] == "done"
    assert len({r.headers["x-loopfence-run"] for r in got}) == 1  # the main conversation is one run


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sides=SIDES)
def test_side_requests_never_reset_the_main_conversations_repetition_counts(
        upstream: ReplyServer, sides: list[list[str]]) -> None:
    """The same read asked again and again stops at its third ask (max_repeats=3), side requests or not."""
    got = asyncio.run(session(upstream.base_url, ["same.py"] * 8, sides))
    assert [r.headers.get("x-loopfence-stop") for r in got] == [None, None, "repeated_call"], \
        [r.json()["choices"][0]["message"] for r in got]
