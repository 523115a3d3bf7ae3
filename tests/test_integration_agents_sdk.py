"""loopfence around an OpenAI Agents SDK agent (loopfence.integrations.agents_sdk, issue 22).

The bench's own scripts (bench/scripts.py) are served by the bench's scripted Model to an Agent with
the bench's tools, run as `Runner.run(fence.agent(agent), ...)`: each runaway stops at loopfence's own
execution figure with a FenceStop that is also the SDK's AgentsException; each legitimate script
reaches its answer; every log reconciles (all invariants) and replays, also through the SDK's own
ScriptedModel. A property: on any script, the fenced agent and loopfence's own ring execute, reuse
and stop alike.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path
from typing import Any

import pytest
from agents import (Agent, AgentsException, MaxTurnsExceeded, ModelSettings, RunConfig, Runner, UserError,
                    function_tool)
from agents.retry import ModelRetrySettings
from agents.testing import ScriptedModel, assistant_message, function_call
from hypothesis import HealthCheck, given, settings

from loopfence import Limits, Policy, StopReason
from loopfence.integrations import FenceStop
from loopfence.integrations.agents_sdk import AgentsFence, AgentsFenceStop, recorded_model
from loopfence.runlog import read_log

from _integration_support import (CAP, DRAWN_TURNS, drawn_script, ends_at_the_frameworks_limit, gated_tools,
                                  reaches_its_answer, reconciles, replays_reports_and_exports, runs_like_the_ring,
                                  stops_like_the_ring)
from bench.common import Script, Source, Workspace  # the bench: on sys.path by the support module
from bench.frameworks.agents_sdk_fw import SourceModel  # the bench's Model over a script
from bench.scripts import HONEST, RUNAWAY

logging.getLogger("openai.agents").setLevel(logging.ERROR)  # tracing without an API key only warns


def _agent(model: Any, tools: list[Any]) -> Agent[Any]:
    return Agent(name="test", instructions="Do the task.", model=model, tools=[function_tool(t) for t in tools])


def _fenced(script: Script, ws: Workspace, log: Path, *, sync: bool = False,
            **options: Any) -> tuple[Source, AgentsFence, Any]:
    """The script through an Agent with the fence: (source, fence, the output or the exception raised)."""
    source = Source(script, CAP)
    agent = _agent(SourceModel(source), list(ws.tools.values()))
    fence = AgentsFence(kinds=script.kinds, log=str(log), **options)  # the added lines
    try:
        if sync:
            ended: Any = Runner.run_sync(fence.agent(agent), "Do the task.").final_output
        else:
            ended = asyncio.run(Runner.run(fence.agent(agent), "Do the task.")).final_output
    except Exception as exc:  # noqa: BLE001 - how it ended is what is checked
        ended = exc
    return source, fence, ended


@pytest.mark.parametrize("script", RUNAWAY, ids=lambda s: s.name)
def test_runaway_stops_at_loopfences_own_figure_with_a_named_stop(script: Script, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    ended = stops_like_the_ring(script, log, lambda ws: _fenced(script, ws, log),
                                raised=(AgentsFenceStop, AgentsException),  # the SDK's own error
                                framework="openai-agents", version="0.24.0")
    assert ended.run_data is not None  # the SDK attached its run details, as to its own errors


@pytest.mark.parametrize("script", HONEST, ids=lambda s: s.name)
def test_legitimate_script_reaches_its_answer(script: Script, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    reaches_its_answer(script, log, lambda ws: _fenced(script, ws, log, sync=True))  # Runner.run_sync


def test_the_log_replays_reports_and_exports(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    with Workspace() as ws:
        _fenced(RUNAWAY[1], ws, log)  # duplicate_args: reused calls, no_progress

    def again(ws: Workspace, rerun: Path) -> None:  # the agent again, fed the recording by the SDK's ScriptedModel
        fence = AgentsFence(kinds=RUNAWAY[1].kinds, log=str(rerun))
        with pytest.raises(AgentsFenceStop):
            Runner.run_sync(fence.agent(_agent(recorded_model(log), list(ws.tools.values()))), "Do the task.")

    replays_reports_and_exports(log, tmp_path, "no_progress", again=again)  # again: one execution, the same events


_IDS = itertools.count()


def _calls(*calls: tuple[str, str]) -> list[Any]:
    """One reply's function calls (call ids unique: the SDK refuses a reused one)."""
    return [function_call(name, raw, call_id=f"call_{next(_IDS)}") for name, raw in calls]


def flaky(n: int) -> str:
    """Answer for n: 3 raises."""
    if n == 3:
        raise ValueError("boom")
    return f"ok {n}"


def test_a_budget_is_checked_before_the_request_and_every_request_carries_max_tokens(tmp_path: Path) -> None:
    model = ScriptedModel([_calls(("flaky", '{"n": 2}')), _calls(("flaky", '{"n": 4}')),
                           _calls(("flaky", '{"n": 5}')), [assistant_message("done")]])
    fence = AgentsFence(limits=Limits(max_steps=2, max_tokens_per_request=300), log=str(tmp_path / "r.jsonl"))
    with pytest.raises(FenceStop) as stopped:
        asyncio.run(Runner.run(fence.agent(_agent(model, [flaky])), "go"))
    assert (stopped.value.reason, stopped.value.limit, stopped.value.value) == (StopReason.MAX_STEPS, 2, 3)
    assert "max_steps=2" in stopped.value.detail
    assert len(model.calls) == 2 and model.remaining_steps == 2  # the third request was never sent
    assert [c.model_settings.max_tokens for c in model.calls] == [300, 300]
    assert fence.result.ledger.model_requests == 2 and fence.result.ledger.tool_executions == 2
    reconciles(tmp_path / "r.jsonl")


def test_tool_errors_and_model_errors_end_as_the_sdk_ends_them_with_the_stop_written(tmp_path: Path) -> None:
    # the SDK's default: a tool's exception is a message to the model, and the run goes on
    model = ScriptedModel([_calls(("flaky", '{"n": 3}')), [assistant_message("done")]])
    fence = AgentsFence(log=str(tmp_path / "handled.jsonl"))
    assert Runner.run_sync(fence.agent(_agent(model, [flaky])), "go").final_output == "done"
    results = [e.record for e in read_log(tmp_path / "handled.jsonl").events if e.event == "result"]
    given = [i["output"] for i in model.calls[1].input if isinstance(i, dict) and i.get("type") == "function_call_output"]
    assert [r["decision"] for r in results] == ["executed"] and results[0]["content"] == given[0]  # what the model got
    assert given[0].startswith("An error occurred while running the tool")
    reconciles(tmp_path / "handled.jsonl")

    # a tool without a failure handler: the SDK raises on (its UserError); the fence writes the stop
    model = ScriptedModel([_calls(("flaky", '{"n": 3}')), [assistant_message("done")]])
    agent = Agent(name="t", model=model, tools=[function_tool(flaky, failure_error_function=None)])
    fence = AgentsFence(log=str(tmp_path / "raise.jsonl"))
    with pytest.raises(UserError, match="boom"):
        Runner.run_sync(fence.agent(agent), "go")
    assert fence.result.stop.reason is StopReason.INTERNAL_ERROR and "boom" in fence.result.stop.detail
    results = [e.record for e in read_log(tmp_path / "raise.jsonl").events if e.event == "result"]
    assert [(r["decision"], r["ok"]) for r in results] == [("executed", False)]
    reconciles(tmp_path / "raise.jsonl")

    # the model's own error: raised unchanged, the run ends endpoint_error (the SDK's retries, asked
    # for here, are not made: the run has ended)
    model = ScriptedModel([_calls(("flaky", '{"n": 2}')), RuntimeError("HTTP 500"), [assistant_message("done")]])
    retried = ModelSettings(retry=ModelRetrySettings(max_retries=2, policy=lambda _: True))
    agent = Agent(name="t", model=model, tools=[function_tool(flaky)], model_settings=retried)
    fence = AgentsFence(log=str(tmp_path / "model.jsonl"))
    with pytest.raises(RuntimeError, match="HTTP 500"):
        Runner.run_sync(fence.agent(agent), "go")
    assert fence.result.stop.reason is StopReason.ENDPOINT_ERROR and len(model.calls) == 2
    reconciles(tmp_path / "model.jsonl")



@pytest.mark.parametrize("max_turns", [2, 3])
def test_the_sdks_own_max_turns_is_a_named_stop_that_replays(max_turns: int, tmp_path: Path) -> None:
    """Its MaxTurnsExceeded is raised unchanged; the fenced run ends framework_limit naming
    max_turns and its value (not internal_error), and the log reconciles and replays to that stop."""
    model = ScriptedModel([_calls(("flaky", f'{{"n": {i}}}')) for i in (4, 5, 6, 7)])
    fence = AgentsFence(log=str(tmp_path / "turns.jsonl"))
    with pytest.raises(MaxTurnsExceeded):
        Runner.run_sync(fence.agent(_agent(model, [flaky])), "go", max_turns=max_turns)
    ends_at_the_frameworks_limit(tmp_path / "turns.jsonl", fence.result, "openai-agents", "max_turns", max_turns,
                                 requests=max_turns, executions=max_turns)


def test_untrusted_content_gates_a_privileged_call_and_the_sdk_gets_the_refusal(tmp_path: Path) -> None:
    wrote, tools = gated_tools()
    model = ScriptedModel([_calls(("fetch", '{"url": "http://x"}')),
                           _calls(("write_file", '{"path": "evil.sh", "content": "x"}')), [assistant_message("done")]])
    fence = AgentsFence(untrusted={"fetch"}, log=str(tmp_path / "gate.jsonl"))
    result = Runner.run_sync(fence.agent(_agent(model, tools)), "go")
    assert wrote == [] and result.final_output == "done"
    outputs = [item for item in model.calls[2].input if isinstance(item, dict) and item.get("type") == "function_call_output"]
    assert len(outputs) == 2 and "permission_denied" in str(outputs[1]["output"])  # what the model was given
    gates = [e.record["decision"] for e in read_log(tmp_path / "gate.jsonl").events if e.event == "gate"]
    assert gates == ["tainted", "refused"]
    reconciles(tmp_path / "gate.jsonl")


def test_each_run_is_its_own_fenced_run_and_concurrent_runs_need_their_own_agent(tmp_path: Path) -> None:
    paths = iter([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    model = ScriptedModel([_calls(("flaky", '{"n": 2}')), [assistant_message("one")],
                           _calls(("flaky", '{"n": 2}')), [assistant_message("two")]])
    fence = AgentsFence(log=lambda: next(paths))
    fenced = fence.agent(_agent(model, [flaky]))  # one fenced agent, run twice
    assert [Runner.run_sync(fenced, "go").final_output, Runner.run_sync(fenced, "go").final_output] == ["one", "two"]
    assert [r.final_answer for r in fence.results] == ["one", "two"]
    assert [r.ledger.tool_executions for r in fence.results] == [1, 1]  # the second run's cache starts empty
    for name in ("a.jsonl", "b.jsonl"):
        reconciles(tmp_path / name)

    async def both(agents: list[Agent[Any]]) -> list[Any]:
        return await asyncio.gather(*(Runner.run(a, "go") for a in agents), return_exceptions=True)

    def model_of() -> ScriptedModel:
        return ScriptedModel([_calls(("flaky", '{"n": 2}')), [assistant_message("done")]])

    fence = AgentsFence()
    shared = fence.agent(_agent(model_of(), [flaky]))  # two runs at once on one fenced agent: refused
    first, second = asyncio.run(both([shared, shared]))
    assert first.final_output == "done" and isinstance(second, UserError) and "one run at a time" in str(second)
    ended = asyncio.run(both([fence.agent(_agent(model_of(), [flaky])), fence.agent(_agent(model_of(), [flaky]))]))
    assert [e.final_output for e in ended] == ["done", "done"]


def test_a_nudge_reaches_the_model_as_a_message_and_the_run_goes_on(tmp_path: Path) -> None:
    script = RUNAWAY[2]  # ok_forever: the fifth identical result warns, the model then answers
    turns = [*(script.turn(i) for i in range(5)), "stopping: it always says ok"]
    steps = [[assistant_message(t)] if isinstance(t, str) else _calls(*t) for t in turns]
    model = ScriptedModel(steps)
    with Workspace() as ws:
        fence = AgentsFence(kinds=script.kinds, policy=Policy(nudge=True), log=str(tmp_path / "n.jsonl"))
        out = Runner.run_sync(fence.agent(_agent(model, list(ws.tools.values()))), "go").final_output
    assert out == "stopping: it always says ok" and fence.result.ledger.nudges == 1
    last = model.calls[-1].input[-1]
    assert last["role"] == "user" and last["content"].startswith("loopfence:")
    reconciles(tmp_path / "n.jsonl")


def test_what_the_fence_does_not_cover_is_refused_not_run_unfenced() -> None:
    fence = AgentsFence()
    model = ScriptedModel([[assistant_message("done")]])

    async def stream() -> None:
        async for _ in Runner.run_streamed(fence.agent(_agent(model, [flaky])), "go").stream_events():
            pass

    with pytest.raises(UserError, match="does not stream"):
        asyncio.run(stream())
    calls: list[int] = []

    def counted(n: int) -> str:
        """Count."""
        calls.append(n)
        return "ok"

    model = ScriptedModel([_calls(("counted", '{"n": 1}')), [assistant_message("done")]])
    with pytest.raises(UserError, match="RunConfig"):  # a run-wide model replaces the fenced one
        Runner.run_sync(fence.agent(_agent(None, [counted])), "go", run_config=RunConfig(model=model))
    assert calls == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=DRAWN_TURNS)
def test_the_fenced_agent_and_the_ring_execute_reuse_and_stop_alike(turns: list[list[tuple[str, str]]],
                                                                     tmp_path: Path) -> None:
    script = drawn_script(turns)
    log = tmp_path / "drawn.jsonl"
    runs_like_the_ring(script, log, lambda ws: _fenced(script, ws, log))
