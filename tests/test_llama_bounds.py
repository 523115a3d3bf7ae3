"""Every request is bounded, against a real `python -m llama_cpp.server` (SmolLM2) started here:
the bodies the server received (recorded on the way out by an httpx transport over real sockets)
carry `tool_choice` and `max_tokens`, and a run whose completion budget is nearly spent sends a
`max_tokens` that fits what is left of it.

Seen on llama-cpp-python 0.3.36 (chatml-function-calling): without `tool_choice` the server leaves
the tools out of the prompt (the model never sees them); with "auto" they are in it (~450 prompt
tokens instead of ~30). Its function-calling handler applies `max_tokens` to each of its inner
generations (the name, then the arguments), so a reply may report a few tokens more than it was
given: the completion guard counts those and stops before the next request.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from _local_support import SAMPLE_SYSTEM, SAMPLE_TASK, SAMPLE_WORKSPACE, read_valid_log
from test_llama_server import pytestmark as _server_marks
from test_llama_server import server  # noqa: F401 - the module's own server (a pytest fixture)

from loopfence import Limits, RunResult, StopReason, run, workspace_tools
from loopfence.models._openai import OpenAIModel

pytestmark = _server_marks
PARAMS = {"temperature": 0, "seed": 0}  # no max_tokens of the user's: the run's bound is what goes


class Recorder(httpx.AsyncBaseTransport):
    """Real HTTP (httpx's own transport), keeping each chat/completions body as it leaves."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(await request.aread()))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _run(base: str, tmp_path: Path, limits: Limits, *, stream: bool = False) -> tuple[RunResult, list[dict], list[dict]]:
    workspace = tmp_path / "workspace"
    shutil.copytree(SAMPLE_WORKSPACE, workspace)
    recorder = Recorder()
    log = tmp_path / "run.jsonl"
    with OpenAIModel(base, "smollm2", max_retries=0, stream=stream, transport=recorder) as model:
        result = run(SAMPLE_TASK, model=model, tools=workspace_tools(workspace), system=SAMPLE_SYSTEM,
                     limits=limits, params=PARAMS, log=log)
    return result, recorder.bodies, read_valid_log(log)


def _charged(events: list[dict]) -> list[int]:
    return [e["usage"]["completion_tokens"] for e in events if e["event"] == "reply"]


def test_requests_carry_tool_choice_and_max_tokens(server: str, tmp_path: Path) -> None:
    limits = Limits(max_steps=2, max_wall_seconds=120)
    result, bodies, events = _run(server, tmp_path, limits)
    assert bodies and len(bodies) == result.ledger.model_requests
    for body in bodies:
        assert body["tools"] and body["tool_choice"] == "auto"
        assert body["max_tokens"] == limits.max_tokens_per_request  # 8,000 left: the cap is smaller
    replies = [e for e in events if e["event"] == "reply"]
    assert replies[0]["usage"]["reported"] is True
    # the server put the tools in the prompt: hundreds of tokens, not the ~30 of the bare messages
    assert replies[0]["usage"]["prompt_tokens"] > 200


def test_a_nearly_spent_budget_sends_a_max_tokens_that_fits_it(server: str, tmp_path: Path) -> None:
    budget = 25  # the first reply (a call, ~17 tokens) leaves a few
    result, bodies, events = _run(server, tmp_path, Limits(max_steps=4, max_wall_seconds=120,
                                                           max_completion_tokens=budget))
    charged = _charged(events)
    assert len(bodies) >= 2, f"the first reply did not leave the run going: {result.stop}"
    spent = 0
    for body, cost in zip(bodies, charged):
        assert body["max_tokens"] == min(budget - spent, Limits().max_tokens_per_request)
        assert body["tool_choice"] == "auto"
        spent += cost
    assert 0 < bodies[-1]["max_tokens"] < budget  # what was left, not the cap
    assert result.ledger.completion_tokens == sum(charged)
    if result.stop.reason is StopReason.MAX_COMPLETION_TOKENS:  # stopped before a request it could not pay
        assert len(bodies) == len(charged)


def test_a_streamed_auto_request_asks_for_usage_and_its_empty_stream_costs_nothing(server: str,
                                                                                   tmp_path: Path) -> None:
    result, bodies, events = _run(server, tmp_path, Limits(max_steps=2, max_wall_seconds=120), stream=True)
    assert bodies[0]["stream_options"] == {"include_usage": True} and bodies[0]["tool_choice"] == "auto"
    assert result.stop.reason is StopReason.INCOMPLETE_STREAM, result.stop  # llama-cpp-python's empty body
    reply = next(e for e in events if e["event"] == "reply")
    assert reply["raw"]["stream"]["chunks"] == 0
    assert reply["usage"]["completion_tokens"] == 0 and result.ledger.completion_tokens == 0
