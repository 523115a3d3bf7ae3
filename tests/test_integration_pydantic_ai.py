"""loopfence around a pydantic-ai agent (loopfence.integrations.pydantic_ai, issue 22).

The bench's own scripts (bench/scripts.py) are served by pydantic-ai's FunctionModel to an Agent with
the bench's tools and the fence as a capability: each runaway stops at loopfence's own execution
figure with a FenceStop that is also pydantic-ai's AgentRunError; each legitimate script reaches its
answer; every log reconciles (all invariants) and replays. A property: on any script, the fenced
pydantic-ai run and loopfence's own ring execute, reuse and stop alike.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import AgentRunError, UsageLimitExceeded
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from loopfence import Limits, Policy, StopReason
from loopfence.integrations import FenceStop
from loopfence.integrations.pydantic_ai import FenceCapability, PydanticAIFenceStop, recorded_model
from loopfence.runlog import read_log

from _integration_support import (CAP, drawn_script, drawn_turns, ends_at_the_frameworks_limit, gated_tools,
                                  reaches_its_answer, reconciles, replays_reports_and_exports, runs_like_the_ring,
                                  stops_like_the_ring)
from bench.common import Script, Source, Workspace  # the bench: on sys.path by the support module
from bench.frameworks.pydantic_ai_fw import _model  # the bench's FunctionModel over a script
from bench.scripts import HONEST, RUNAWAY


def _fenced(script: Script, ws: Workspace, log: Path, **options: Any) -> tuple[Source, FenceCapability, Any]:
    """The script through an Agent with the fence: (source, fence, the output or the exception raised)."""
    source = Source(script, CAP)
    fence = FenceCapability(kinds=script.kinds, log=str(log), **options)
    agent = Agent(_model(source), tools=list(ws.tools.values()), capabilities=[fence])  # the added line
    try:
        ended: Any = agent.run_sync("Do the task.").output
    except Exception as exc:  # noqa: BLE001 - how it ended is what is checked
        ended = exc
    return source, fence, ended


@pytest.mark.parametrize("script", RUNAWAY, ids=lambda s: s.name)
def test_runaway_stops_at_loopfences_own_figure_with_a_named_stop(script: Script, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    stops_like_the_ring(script, log, lambda ws: _fenced(script, ws, log),
                        raised=(PydanticAIFenceStop, AgentRunError), framework="pydantic-ai")  # pydantic-ai's error


@pytest.mark.parametrize("script", HONEST, ids=lambda s: s.name)
def test_legitimate_script_reaches_its_answer(script: Script, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    reaches_its_answer(script, log, lambda ws: _fenced(script, ws, log))


def test_the_log_replays_reports_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    with Workspace() as ws:
        _fenced(RUNAWAY[1], ws, log)  # duplicate_args: reused calls, no_progress

    def again(ws: Workspace, rerun: Path) -> None:  # the agent again, fed the recording by pydantic-ai's FunctionModel
        fence = FenceCapability(kinds=RUNAWAY[1].kinds, log=str(rerun))
        with pytest.raises(FenceStop):
            Agent(recorded_model(log), tools=list(ws.tools.values()), capabilities=[fence]).run_sync("Do the task.")

    replays_reports_and_exports(log, tmp_path, "no_progress", again=again)  # again: one execution, the same events


def _scripted(turns: list[Any]) -> tuple[FunctionModel, dict[str, Any]]:
    served, seen = iter(turns), {}

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen["settings"] = info.model_settings
        turn = next(served)
        if isinstance(turn, Exception):
            raise turn
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(parts=[ToolCallPart(name, raw, tool_call_id=f"c{i}") for i, (name, raw) in enumerate(turn)])

    return FunctionModel(respond), seen


def flaky(n: int) -> str:
    """Answer for n: 1 asks for a retry, 3 raises."""
    if n == 1:
        raise ModelRetry("try n=2")
    if n == 3:
        raise ValueError("boom")
    return f"ok {n}"


def test_a_budget_is_checked_before_the_request_and_every_request_carries_max_tokens(tmp_path: Path) -> None:
    model, seen = _scripted([[("flaky", '{"n": 2}')], [("flaky", '{"n": 4}')], [("flaky", '{"n": 5}')], "done"])
    fence = FenceCapability(limits=Limits(max_steps=2, max_tokens_per_request=300), log=str(tmp_path / "r.jsonl"))
    with pytest.raises(FenceStop) as stopped:
        Agent(model, tools=[flaky], capabilities=[fence]).run_sync("go")
    assert (stopped.value.reason, stopped.value.limit, stopped.value.value) == (StopReason.MAX_STEPS, 2, 3)
    assert "max_steps=2" in stopped.value.detail
    assert seen["settings"]["max_tokens"] == 300
    assert fence.result.ledger.model_requests == 2 and fence.result.ledger.tool_executions == 2
    reconciles(tmp_path / "r.jsonl")


def test_one_loopfence_agent_configures_the_ring_and_the_fence_alike(tmp_path: Path) -> None:
    """Configured once: `FenceCapability(agent=...)` takes the loopfence Agent's limits and log folder,
    and the fenced framework stops where the agent's own ring stops."""
    import loopfence
    from loopfence.testing import calls_reply, tool_call

    config = loopfence.Agent(model=loopfence.ScriptedModel([calls_reply(tool_call("flaky", n=i)) for i in (2, 4, 5)]),
                             tools=[flaky], limits={"max_steps": 2}, log=tmp_path / "runs")
    ring = config.run("go")
    model, _ = _scripted([[("flaky", '{"n": 2}')], [("flaky", '{"n": 4}')], [("flaky", '{"n": 5}')], "done"])
    fence = FenceCapability(agent=config)
    with pytest.raises(FenceStop) as stopped:
        Agent(model, tools=[flaky], capabilities=[fence]).run_sync("go")
    assert (stopped.value.reason, stopped.value.limit) == (ring.stop.reason, 2) == (StopReason.MAX_STEPS, 2)
    assert fence.result.ledger.tool_executions == ring.ledger.tool_executions == 2
    logs = sorted((tmp_path / "runs").glob("run-*.jsonl"))  # each run, fenced or not, its own log there
    assert len(logs) == 2 and str(fence.result.log_path) in map(str, logs)
    for log in logs:
        reconciles(log)
    again = FenceCapability(agent=config, limits=Limits(max_steps=1), log=str(tmp_path / "own.jsonl"))
    with pytest.raises(FenceStop) as stopped:  # a keyword given as well goes over the agent's
        Agent(_scripted([[("flaky", '{"n": 2}')], [("flaky", '{"n": 4}')], "done"])[0], tools=[flaky],
              capabilities=[again]).run_sync("go")
    assert stopped.value.limit == 1 and (tmp_path / "own.jsonl").exists()


def test_a_tool_retry_is_a_result_and_a_tool_exception_is_raised_on_with_the_stop_written(tmp_path: Path) -> None:
    model, _ = _scripted([[("flaky", '{"n": 1}')], [("flaky", '{"n": 2}')], "done"])
    fence = FenceCapability(log=str(tmp_path / "retry.jsonl"))
    assert Agent(model, tools=[flaky], capabilities=[fence]).run_sync("go").output == "done"
    results = [e.record for e in read_log(tmp_path / "retry.jsonl").events if e.event == "result"]
    assert [(r["decision"], r["ok"]) for r in results] == [("executed", False), ("executed", True)]
    assert "try n=2" in results[0]["content"]
    reconciles(tmp_path / "retry.jsonl")

    model, _ = _scripted([[("flaky", '{"n": 3}')], "done"])
    fence = FenceCapability(log=str(tmp_path / "raise.jsonl"))
    with pytest.raises(ValueError, match="boom"):  # pydantic-ai's own behaviour, unchanged
        Agent(model, tools=[flaky], capabilities=[fence]).run_sync("go")
    assert fence.result.stop.reason is StopReason.INTERNAL_ERROR and "ValueError: boom" in fence.result.stop.detail
    reconciles(tmp_path / "raise.jsonl")

    model, _ = _scripted([[("flaky", '{"n": 2}')], RuntimeError("HTTP 500")])
    fence = FenceCapability(log=str(tmp_path / "model.jsonl"))
    with pytest.raises(RuntimeError, match="HTTP 500"):
        Agent(model, tools=[flaky], capabilities=[fence]).run_sync("go")
    assert fence.result.stop.reason is StopReason.ENDPOINT_ERROR
    reconciles(tmp_path / "model.jsonl")


@pytest.mark.parametrize(("name", "requests", "executions"), [
    ("request_limit", 3, 3),  # checked before the 4th request
    ("tool_calls_limit", 2, 2)])  # checked before the 2nd reply's two calls: neither runs
def test_pydantic_ais_own_usage_limit_is_a_named_stop_that_replays(name: str, requests: int, executions: int,
                                                                   tmp_path: Path) -> None:
    model, _ = _scripted([[("flaky", f'{{"n": {n}}}'), ("flaky", f'{{"n": {n + 10}}}')] if name != "request_limit"
                          else [("flaky", f'{{"n": {n}}}')] for n in range(4, 10)])
    fence = FenceCapability(log=str(tmp_path / "limit.jsonl"))
    with pytest.raises(UsageLimitExceeded):  # pydantic-ai's own error, raised unchanged
        Agent(model, tools=[flaky], capabilities=[fence]).run_sync("go", usage_limits=UsageLimits(**{name: 3}))
    ends_at_the_frameworks_limit(tmp_path / "limit.jsonl", fence.result, "pydantic-ai", name, 3,
                                 requests=requests, executions=executions)


def test_untrusted_content_gates_a_privileged_call_and_the_framework_gets_the_refusal(tmp_path: Path) -> None:
    wrote, tools = gated_tools()
    model, _ = _scripted([[("fetch", '{"url": "http://x"}')], [("write_file", '{"path": "evil.sh", "content": "x"}')],
                          "done"])
    fence = FenceCapability(untrusted={"fetch"}, log=str(tmp_path / "gate.jsonl"))
    result = Agent(model, tools=tools, capabilities=[fence]).run_sync("go")
    assert wrote == [] and result.output == "done"
    returned = [p.content for m in result.all_messages() for p in m.parts if getattr(p, "tool_name", "") == "write_file"
                and hasattr(p, "content")]
    assert returned and "permission_denied" in returned[0]
    gates = [e.record["decision"] for e in read_log(tmp_path / "gate.jsonl").events if e.event == "gate"]
    assert gates == ["tainted", "refused"]
    reconciles(tmp_path / "gate.jsonl")


def test_each_agent_run_is_its_own_fenced_run_with_its_own_log(tmp_path: Path) -> None:
    paths = iter([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    model, _ = _scripted([[("flaky", '{"n": 2}')], "one", [("flaky", '{"n": 2}')], "two"])
    fence = FenceCapability(log=lambda: next(paths))
    agent = Agent(model, tools=[flaky], capabilities=[fence])
    assert [agent.run_sync("go").output, agent.run_sync("go").output] == ["one", "two"]
    assert [r.final_answer for r in fence.results] == ["one", "two"]
    assert [r.ledger.tool_executions for r in fence.results] == [1, 1]  # the second run's cache starts empty
    for name in ("a.jsonl", "b.jsonl"):
        reconciles(tmp_path / name)


def test_a_nudge_reaches_the_model_as_a_message_and_the_run_goes_on(tmp_path: Path) -> None:
    script = RUNAWAY[2]  # ok_forever: the fifth identical result warns, the model then answers
    turns = [*(script.turn(i) for i in range(5)), "stopping: it always says ok"]
    seen: list[str] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.extend(str(getattr(p, "content", "")) for p in messages[-1].parts if p.part_kind == "user-prompt")
        turn = turns.pop(0)
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(parts=[ToolCallPart(n, raw, tool_call_id=f"c{len(turns)}") for n, raw in turn])

    with Workspace() as ws:
        fence = FenceCapability(kinds=script.kinds, policy=Policy(nudge=True), log=str(tmp_path / "n.jsonl"))
        out = Agent(FunctionModel(respond), tools=list(ws.tools.values()), capabilities=[fence]).run_sync("go").output
    assert out == "stopping: it always says ok" and fence.result.ledger.nudges == 1
    assert any(text.startswith("loopfence:") for text in seen)
    reconciles(tmp_path / "n.jsonl")


def test_import_loopfence_imports_no_framework() -> None:
    code = ("import sys, loopfence, loopfence.integrations\n"
            "bad = [m for m in ('pydantic_ai', 'langchain', 'agents') if m in sys.modules]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=drawn_turns(9))  # up to 9 turns: within pydantic-ai's default request_limit=50
def test_the_fenced_agent_and_the_ring_execute_reuse_and_stop_alike(turns: list[list[tuple[str, str]]],
                                                                     tmp_path: Path) -> None:
    script = drawn_script(turns)
    log = tmp_path / "drawn.jsonl"
    runs_like_the_ring(script, log, lambda ws: _fenced(script, ws, log))
