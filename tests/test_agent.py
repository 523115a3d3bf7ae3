"""`Agent`: configured and checked once, then many tasks (run, arun, stream, batch), one connection
pool for all its runs, frozen, with per-call changes and the named limit profiles."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from loopfence import Agent, Limits, ScriptedModel, StopReason, Verdict, batch, run, tool
from loopfence.models import OpenAIModel
from loopfence.testing import calls_reply, text_reply, tool_call


class _Server(ThreadingHTTPServer):
    """A chat endpoint on 127.0.0.1 that answers "ok" and counts the TCP connections it accepts."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.accepted = 0
        self.bodies: list[dict[str, Any]] = []

    def get_request(self) -> Any:
        conn = super().get_request()
        self.accepted += 1
        return conn


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: _Server

    def do_POST(self) -> None:  # noqa: N802
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        self._send(200, text_reply("ok"))

    def do_GET(self) -> None:  # noqa: N802 - the token counter's probe (GET /props): not llama.cpp, kept alive
        self._send(404, {"error": {"message": "no such route"}})

    def _send(self, status: int, reply: dict[str, Any]) -> None:
        body = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _endpoint(server: _Server) -> OpenAIModel:
    return OpenAIModel(f"http://127.0.0.1:{server.server_port}/v1", "m")


def _header(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text().splitlines()[0])


def test_one_agent_runs_many_tasks_under_one_configuration(server: _Server, tmp_path: Path) -> None:
    with Agent(model=_endpoint(server), system="Be brief.", limits={"max_steps": 4}, log=tmp_path / "runs") as agent:
        results = [agent.run(f"task {i}") for i in range(3)]
        results.append(asyncio.run(agent.arun("task 3")))
    assert [r.final_answer for r in results] == ["ok"] * 4
    assert [b["messages"][0] for b in server.bodies] == [{"role": "system", "content": "Be brief."}] * 4
    assert [b["messages"][1]["content"] for b in server.bodies] == [f"task {i}" for i in range(4)]
    logs = sorted((tmp_path / "runs").glob("run-*.jsonl"))  # a log of its own for each run
    assert len(logs) == 4 and sorted(str(r.log_path) for r in results) == [str(p) for p in logs]
    assert {_header(p)["limits"]["max_steps"] for p in logs} == {4}


def test_sequential_runs_of_one_agent_share_one_connection(server: _Server) -> None:
    with Agent(model=_endpoint(server)) as agent:
        stops = {agent.run(f"task {i}").stop.reason for i in range(100)}
    assert stops == {StopReason.FINAL_ANSWER} and len(server.bodies) == 100
    assert server.accepted == 1


def test_async_runs_of_one_agent_share_one_connection(server: _Server) -> None:
    agent = Agent(model=_endpoint(server))

    async def main() -> set[StopReason]:
        try:
            return {(await agent.arun(f"task {i}")).stop.reason for i in range(20)}
        finally:
            await agent.model.aclose()  # type: ignore[attr-defined]
    assert asyncio.run(main()) == {StopReason.FINAL_ANSWER}
    assert server.accepted == 1


def test_the_agent_is_frozen() -> None:
    agent = Agent(model=ScriptedModel([text_reply("done")]), params={"temperature": 0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.limits = Limits(max_steps=1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        agent.params["temperature"] = 1  # type: ignore[index]
    assert agent.params == {"temperature": 0}


def test_a_call_changes_a_setting_for_itself_only(tmp_path: Path) -> None:
    loop_reply = calls_reply(tool_call("ping"))
    agent = Agent(model=ScriptedModel([loop_reply, loop_reply, text_reply("done")]), tools=[tool(ping)])
    short = agent.run("ping until told", limits={"max_steps": 1}, log=tmp_path / "one.jsonl")
    assert short.stop.reason is StopReason.MAX_STEPS and short.log_path == str(tmp_path / "one.jsonl")
    assert _header(tmp_path / "one.jsonl")["limits"]["max_steps"] == 1
    assert agent.limits == Limits() and agent.log is None
    assert agent.run("go on").verdict is Verdict.SHIP  # the agent's own limits again: the script ends
    with pytest.raises(TypeError, match="'max_step'"):
        agent.run("x", max_step=3)


def ping() -> str:
    """Answer pong."""
    return "pong"


def test_batch_takes_the_agent(server: _Server, tmp_path: Path) -> None:
    episodes = [{"id": "a", "task": "first"}, {"id": "b", "task": "second", "system": "Its own."}]
    with Agent(model=_endpoint(server), system="Be brief.", limits="chat") as agent:
        done = agent.batch(episodes, out=tmp_path / "job", concurrency=1)
    assert [(r.id, r.verdict, r.final_answer) for r in done.rows] == [("a", "SHIP", "ok"), ("b", "SHIP", "ok")]
    systems = sorted(b["messages"][0]["content"] for b in server.bodies)
    assert systems == ["Be brief.", "Its own."]  # the agent's system where the episode has none
    headers = [_header(tmp_path / "job" / r.log) for r in done.rows]  # type: ignore[operator]
    assert [h["limits"] for h in headers] == [Limits.chat().to_json()] * 2
    assert server.accepted == 1  # the batch ran on the agent's loop, over its pool


def test_the_named_profiles_are_taken_everywhere(tmp_path: Path) -> None:
    assert Agent(model=ScriptedModel([text_reply("x")]), limits="coding").limits == Limits.coding()
    assert Agent(model=ScriptedModel([text_reply("x")]), limits=Limits.chat()).limits == Limits.chat()
    run("t", model=ScriptedModel([text_reply("x")]), limits="coding", log=tmp_path / "r.jsonl")
    assert _header(tmp_path / "r.jsonl")["limits"] == Limits.coding().to_json()
    done = batch([{"id": "e", "task": "t"}], model=ScriptedModel([text_reply("x")]), out=tmp_path / "job",
                 limits="coding")
    assert _header(tmp_path / "job" / done.rows[0].log)["limits"] == Limits.coding().to_json()  # type: ignore[operator]


def test_bad_settings_raise_when_the_agent_is_made(tmp_path: Path) -> None:
    model = ScriptedModel([text_reply("x")])
    with pytest.raises(TypeError, match="not a name"):
        Agent(model="gpt-4o")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'max_stepz'"):
        Agent(model=model, limits={"max_stepz": 3})
    with pytest.raises(ValueError, match="unknown limit profile 'huge'.*coding"):
        Agent(model=model, limits="huge")
    with pytest.raises(ValueError, match="max_steps"):
        Agent(model=model, limits={"max_steps": -1})
    with pytest.raises(ValueError, match="'ping' is registered twice"):
        Agent(model=model, tools=[ping, ping])
    with pytest.raises(ValueError, match="is a folder"):
        Agent(model=model, log=tmp_path / "run.jsonl")
    with pytest.raises(ValueError, match="price"):
        Agent(model=model, limits={"max_cost_usd": 1.0})
