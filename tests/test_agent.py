"""`Agent`: configured and checked once, then many tasks (run, arun, stream, batch), one connection
pool for all its runs, frozen, with per-call changes and the named limit profiles."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _http_support import CountingServer, counting_server

from loopfence import Agent, Limits, ScriptedModel, StopReason, Verdict, batch, run, tool
from loopfence.models import OpenAIModel
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

SRC = str(Path(__file__).resolve().parent.parent / "src")


@pytest.fixture
def server() -> Iterator[CountingServer]:
    with counting_server() as srv:
        yield srv


def _endpoint(server: CountingServer) -> OpenAIModel:
    return OpenAIModel(server.base_url, "m")


def _header(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text().splitlines()[0])


def test_one_agent_runs_many_tasks_under_one_configuration(server: CountingServer, tmp_path: Path) -> None:
    with Agent(model=_endpoint(server), system="Be brief.", limits={"max_steps": 4}, log=tmp_path / "runs") as agent:
        results = [agent.run(f"task {i}") for i in range(3)]
        results.append(asyncio.run(agent.arun("task 3")))
    assert [r.final_answer for r in results] == ["ok"] * 4
    assert [b["messages"][0] for b in server.bodies] == [{"role": "system", "content": "Be brief."}] * 4
    assert [b["messages"][1]["content"] for b in server.bodies] == [f"task {i}" for i in range(4)]
    logs = sorted((tmp_path / "runs").glob("run-*.jsonl"))  # a log of its own for each run
    assert len(logs) == 4 and sorted(str(r.log_path) for r in results) == [str(p) for p in logs]
    assert {_header(p)["limits"]["max_steps"] for p in logs} == {4}


def test_sequential_runs_of_one_agent_share_one_connection(server: CountingServer) -> None:
    with Agent(model=_endpoint(server)) as agent:
        stops = {agent.run(f"task {i}").stop.reason for i in range(100)}
    assert stops == {StopReason.FINAL_ANSWER} and len(server.bodies) == 100
    assert server.accepted == 1


def test_async_runs_of_one_agent_share_one_connection(server: CountingServer) -> None:
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


def test_batch_takes_the_agent(server: CountingServer, tmp_path: Path) -> None:
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


def test_the_agent_streams_a_run() -> None:
    agent = Agent(model=ScriptedModel([text_reply("one"), text_reply("two")]), system="S.")
    events = agent.stream("first")
    assert [e.event for e in events][-1] == "stop" and events.result is not None
    assert events.result.final_answer == "one" and events.result.messages[0]["content"] == "S."

    async def main() -> str | None:
        async with agent.stream("second", system="T.") as run:
            async for _ in run:
                pass
        return run.result.final_answer if run.result else None
    assert asyncio.run(main()) == "two"


def test_sequential_sync_streams_of_one_agent_share_one_connection(server: CountingServer) -> None:
    with Agent(model=_endpoint(server)) as agent:
        ends = []
        for i in range(5):
            events = agent.stream(f"task {i}")
            ends.append([e.event for e in events][-1])
            assert events.result is not None and events.result.final_answer == "ok"
    assert ends == ["stop"] * 5 and len(server.bodies) == 5
    assert server.accepted == 1  # every stream ran on the agent's loop, over its pool


def test_the_run_keywords_are_the_agents_settings() -> None:
    from loopfence._loop import RunSettings

    fields = {f.name for f in dataclasses.fields(Agent) if f.init}
    assert set(RunSettings.__annotations__) | set(RunSettings.__optional_keys__) == fields


# -- Ctrl-C: a real SIGINT to a script mid-tool, under agent.run() and run() alike ------------------
SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from loopfence import Agent, ScriptedModel, run, tool
    from loopfence.testing import calls_reply, text_reply, tool_call

    def wait_here() -> str:
        \"\"\"Wait.\"\"\"
        Path(os.environ["MARK"]).write_text("started")
        time.sleep(60)
        return "never"

    model = ScriptedModel([calls_reply(tool_call("wait_here", "{}")), text_reply("never")])
    log = os.environ["LOG"]
    if sys.argv[1] == "agent":
        result = Agent(model=model, tools=[tool(wait_here)]).run("t", log=log)
    else:
        result = run("t", model=model, tools=[tool(wait_here)], log=log)
    print(json.dumps({"reason": str(result.stop.reason), "detail": result.stop.detail}))
""")


@pytest.mark.parametrize("how", ["agent", "run"])
def test_ctrl_c_mid_tool_returns_the_cancelled_result_under_agent_run_and_run(how: str, tmp_path: Path) -> None:
    (tmp_path / "go.py").write_text(SCRIPT)
    mark, log = tmp_path / "mark", tmp_path / "r.jsonl"
    env = {**os.environ, "MARK": str(mark), "LOG": str(log), "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "go.py", how], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        give_up = time.monotonic() + 30
        while not mark.exists() and time.monotonic() < give_up and proc.poll() is None:
            time.sleep(0.02)
        assert mark.exists(), proc.communicate(timeout=10)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # the tool sleeps 60 s: the run does not wait for it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0 and "KeyboardInterrupt" not in err, err  # the result came back
    returned = json.loads(out.splitlines()[-1])
    assert returned["reason"] == "cancelled" and "Ctrl-C" in returned["detail"]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[-1]["event"] == "stop" and events[-1]["reason"] == "cancelled"
    assert [e["error"] for e in events if e["event"] == "result"] == ["outcome_unknown"]
    assert reconcile(log).ok


class _TwoCallsEachRun:
    """Every run: a call, another, then an answer (the turn read from the request's own messages)."""

    def complete(self, request: Any) -> Any:
        from loopfence import Reply

        turn = sum(m["role"] == "assistant" for m in request.messages)
        return Reply.from_response(text_reply("done") if turn >= 2 else calls_reply(tool_call("peek", i=turn)))

    def describe(self) -> dict[str, Any]:
        return {"kind": "two-calls-each-run"}


def test_each_run_of_an_agent_has_its_own_guards_and_gate() -> None:
    """A guard's counts are one run's: the agent's second run starts where its first did, and the
    guard instance the user gave is left untouched."""
    from loopfence import Guard

    class AtMostThree(Guard):
        def __init__(self) -> None:
            self.seen = 0

        def after_execution(self, s: Any, c: Any, result: Any) -> Any:
            self.seen += 1
            return self.stop("a third execution", limit=3, value=self.seen) if self.seen >= 3 else None

    given = AtMostThree()
    with Agent(model=_TwoCallsEachRun(), tools=[tool(lambda i: "ok", name="peek")], guards=[given]) as agent:
        first, second = agent.run("one"), agent.run("two")
    assert [r.stop.reason for r in (first, second)] == [StopReason.FINAL_ANSWER] * 2
    assert second.ledger.tool_executions == 2 and given.seen == 0
    # run() with the caller's guard (one task): the instance is the run's, as it always was
    shared = AtMostThree()
    run("one", model=_TwoCallsEachRun(), tools=[tool(lambda i: "ok", name="peek")], guards=[shared])
    assert shared.seen == 2
