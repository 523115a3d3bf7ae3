"""Real clients against `loopfence proxy`, changed in nothing but their base URL: the official openai
Python SDK driving a tool loop (the cookbook's: the reply object pushed back as it came), the OpenAI
Agents SDK's chat-completions model and pydantic-ai's OpenAI chat model, each over the bench's
scripts served by the FakeServer. Each run is one run of the proxy's (one log), told apart by its
conversation alone; a runaway ends the framework's run as a model's answer would, naming the stop;
a legitimate script reaches its answer.

With `--on-stop error` the stop is an HTTP 400 with an OpenAI-style error body; the official openai
clients for Python and for Node, at their default retry settings, do not send it again: the HTTP
requests each sent (counted at its own HTTP layer) are its turns, one each.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from loopfence import tool
from loopfence.runlog import read_log

from _proxy_support import (TS, Proxy, ScriptServer, kinds_file, logs_in, node_script, reconciles, replays,
                            stops_at_the_minimum, task)
from bench.common import Workspace  # _proxy_support put the root on sys.path
from bench.scripts import HONEST, RUNAWAY

SYSTEM = "You work in a folder of files. Use the tools, then answer."


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptServer]:
    with ScriptServer() as srv:
        yield srv


def _proxy(upstream: ScriptServer, tmp: Path, *args: str) -> Proxy:
    return Proxy("--upstream", upstream.base_url, "--logs", str(tmp / "logs"), "--kinds", str(kinds_file(tmp)),
                 *args, stderr=tmp / "proxy.err")


@pytest.fixture(scope="module")
def answering(upstream: ScriptServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with _proxy(upstream, tmp_path_factory.mktemp("answering")) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def erroring(upstream: ScriptServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with _proxy(upstream, tmp_path_factory.mktemp("erroring"), "--on-stop", "error") as proxy:
        yield proxy


class Counted:
    """An httpx client for the SDK that counts the HTTP requests it sends (retries included) and keeps
    the last response's headers."""

    def __init__(self) -> None:
        self.attempts = 0
        self.headers: dict[str, str] = {}
        self.client = httpx.Client(event_hooks={"request": [self._sent], "response": [self._got]})

    def _sent(self, request: httpx.Request) -> None:
        self.attempts += 1

    def _got(self, response: httpx.Response) -> None:
        self.headers = dict(response.headers)


def sdk_loop(base_url: str, name: str, ws: Workspace, counted: Counted, messages: list[Any] | None = None,
             turns: int = 60, tag: str = "") -> tuple[Any, list[Any], int]:
    """The cookbook's tool loop with the openai SDK (default retries): (the last reply message, the
    conversation, turns)."""
    client = openai.OpenAI(base_url=base_url, api_key="sk-client", http_client=counted.client)
    schemas = [tool(fn).schema() for fn in ws.tools.values()]
    messages = messages or [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task(name, tag)}]
    for turn in range(1, turns + 1):
        message = client.chat.completions.create(model="fake", messages=messages, tools=schemas).choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message, messages, turn
        for call in message.tool_calls:
            fn = ws.tools.get(call.function.name)
            try:
                result = fn(**json.loads(call.function.arguments)) if fn else f"error: no tool {call.function.name}"
            except Exception as exc:  # noqa: BLE001 - the error goes back to the model, as in the cookbook
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    pytest.fail(f"{name}: no answer in {turns} turns")


def _the_new_log(proxy: Proxy, before: set[Path]) -> Path:
    """The one log the proxy started since `before`: the client's run was one run."""
    new = sorted(_logs(proxy) - before)
    assert len(new) == 1, f"expected one run, got {[p.name for p in new]}; stderr: {proxy.stderr()}"
    return new[0]


def _logs(proxy: Proxy) -> set[Path]:
    assert proxy.logs is not None
    return set(logs_in(proxy.logs))


def _ended(log: Path, reason: str | None) -> None:
    """The run's log ends with `reason` (None: a final answer, SHIP), reconciles and replays."""
    stop = read_log(log).stop
    assert stop is not None
    if reason is None:
        assert (stop.reason, stop.verdict) == ("final_answer", "SHIP"), stop
    else:
        assert (stop.reason, stop.verdict) == (reason, "KILL"), stop
    reconciles(log)
    replays(log)


# -- the official openai Python SDK ------------------------------------------------------------------------


@pytest.mark.parametrize("script", RUNAWAY + HONEST, ids=lambda s: s.name)
def test_openai_python_sdk_tool_loop(answering: Proxy, upstream: ScriptServer, script: Any) -> None:
    before, counted, sent = _logs(answering), Counted(), upstream.by_script.get(script.name, 0)
    with Workspace() as ws:
        message, _, turns = sdk_loop(answering.base_url, script.name, ws, counted)
        executions = ws.executions
    stop = counted.headers.get("x-loopfence-stop")
    assert counted.attempts == turns  # one HTTP request per turn
    log = _the_new_log(answering, before)
    assert log.stem == counted.headers.get("x-loopfence-run")
    if script in HONEST:
        assert (stop, message.content) == (None, script.turn(turns - 1)), message
        assert upstream.by_script[script.name] - sent == turns  # each request went upstream once
        _ended(log, None)
    else:
        stops_at_the_minimum(script.name, executions, stop)
        assert stop in message.content, (stop, message)
        assert upstream.by_script[script.name] - sent <= turns
        _ended(log, stop)


def test_a_stopped_run_answers_every_later_request_the_same_without_the_upstream(
        answering: Proxy, upstream: ScriptServer) -> None:
    """The client goes on after the stop (the stop's answer, then a new user message): the same
    answer, and nothing reaches the upstream."""
    counted = Counted()
    with Workspace() as ws:
        first, messages, _ = sdk_loop(answering.base_url, "duplicate_args", ws, counted, tag="go on")
        sent = upstream.by_script["duplicate_args"]
        again, _, turns = sdk_loop(answering.base_url, "duplicate_args", ws, counted,
                                   messages=[*messages, {"role": "user", "content": "Go on."}])
    assert (turns, again.content, again.tool_calls) == (1, first.content, None)
    assert upstream.by_script["duplicate_args"] == sent


# -- frameworks, by base URL only --------------------------------------------------------------------------


def _agents_sdk(base_url: str, prompt: str, ws: Workspace) -> str:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # its exporter would call the OpenAI platform (this suite reaches loopback only)
    model = agents.OpenAIChatCompletionsModel(model="fake", openai_client=openai.AsyncOpenAI(
        base_url=base_url, api_key="sk-client"))
    agent = agents.Agent(name="proxy", instructions=SYSTEM, model=model,
                         tools=[agents.function_tool(fn) for fn in ws.tools.values()])
    return str(asyncio.run(agents.Runner.run(agent, prompt, max_turns=50)).final_output)


def _pydantic_ai(base_url: str, prompt: str, ws: Workspace) -> str:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("fake", provider=OpenAIProvider(base_url=base_url, api_key="sk-client"))
    return Agent(model, instructions=SYSTEM, tools=list(ws.tools.values())).run_sync(prompt).output


FRAMEWORKS = {"agents_sdk": _agents_sdk, "pydantic_ai": _pydantic_ai}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("name", "reason"), [("ok_forever", "repeated_result"), ("paging_5", None),
                                              ("polling_8", None)])
def test_a_framework_pointed_at_the_proxy(answering: Proxy, framework: str, name: str, reason: str | None) -> None:
    before = _logs(answering)
    with Workspace() as ws:
        output = FRAMEWORKS[framework](answering.base_url, task(name, framework), ws)
        executions = ws.executions
    log = _the_new_log(answering, before)
    if reason is None:
        script = next(s for s in HONEST if s.name == name)
        assert output == script.turn(executions)  # one call per turn: the answer is turn `executions`
    else:
        stops_at_the_minimum(name, executions, reason)
        assert reason in output, output
    _ended(log, reason)


# -- --on-stop error: a 400 the official clients do not retry ----------------------------------------------


def test_openai_python_sdk_does_not_retry_the_stop(erroring: Proxy, upstream: ScriptServer) -> None:
    before, counted = _logs(erroring), Counted()
    with Workspace() as ws, pytest.raises(openai.BadRequestError) as raised:
        sdk_loop(erroring.base_url, "retry_storm", ws, counted, tag="python")
    error = raised.value
    assert error.status_code == 400 and error.response.headers.get("x-loopfence-stop") == error.code
    assert error.body == {"message": error.body["message"], "type": "loopfence_stop", "code": error.code,
                          "param": None}, error.body
    assert error.code in error.body["message"]
    assert counted.attempts == 3  # read, read again, then the stop: never sent twice
    _ended(_the_new_log(erroring, before), error.code)


def test_openai_node_sdk_does_not_retry_the_stop(erroring: Proxy, tmp_path: Path) -> None:
    before = _logs(erroring)
    done = node_script(TS / "sdk_loop.ts", erroring.base_url, str(tmp_path), task("retry_storm", "node"))
    out = json.loads(done.stdout.splitlines()[-1])
    assert (done.returncode, out["status"], out["type"]) == (2, 400, "loopfence_stop"), (out, done.stderr)
    assert out["attempts"] == out["turns"] == 3 and out["executions"] == 2, out
    _ended(_the_new_log(erroring, before), out["code"])
