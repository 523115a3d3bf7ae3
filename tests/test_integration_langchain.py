"""loopfence around a LangChain v1 agent (loopfence.integrations.langchain, issue 22).

The bench's own scripts (bench/scripts.py) are served by the bench's scripted chat model to
`create_agent` with the bench's tools and the fence as a middleware, under `invoke` and `ainvoke`: each
runaway stops at loopfence's own execution figure with a FenceStop that is also LangGraph's
GraphRecursionError; each legitimate script reaches its answer; every log reconciles (all invariants)
and replays. A property: on any script, the fenced LangChain run and loopfence's own ring execute,
reuse and stop alike.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware, ToolCallLimitMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool, ToolException
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.errors import GraphRecursionError

from loopfence import Limits, Policy, StopReason
from loopfence.integrations import FenceStop
from loopfence.integrations.langchain import FenceMiddleware, LangChainFenceStop, recorded_model, scripted_model
from loopfence.integrations.langchain import _parameters
from loopfence.runlog import read_log
from loopfence._log._schema import ResultLine, StopLine

from _integration_support import (CAP, DRAWN_TURNS, drawn_script, ends_at_the_frameworks_limit, gated_tools,
                                  reaches_its_answer, reconciles, replays_reports_and_exports, runs_like_the_ring,
                                  stops_like_the_ring)
from bench.common import Script, Source, Workspace, calls_of  # _integration_support put the root on sys.path
from bench.frameworks.langchain_fw import ScriptChatModel  # the bench's chat model over a script
from bench.scripts import HONEST, RUNAWAY

TASK = {"messages": [{"role": "user", "content": "Do the task."}]}


def _invoke(agent: Any, mode: str, task: dict[str, Any] = TASK) -> Any:
    return agent.invoke(task) if mode == "sync" else asyncio.run(agent.ainvoke(task))


class WireChatModel(ScriptChatModel):
    """The bench's chat model, keeping the wire's calls in `additional_kwargs["tool_calls"]` as
    langchain-openai does (their order, valid and invalid ones alike, and their raw argument text)."""

    def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
        result = super()._generate(messages, *args, **kwargs)
        n = self.source.calls
        wire = [{"id": f"call_{n}_{j}", "type": "function", "function": {"name": name, "arguments": raw}}
                for j, (name, raw) in enumerate(calls_of(self.source.script.turn(n - 1)))]
        if wire:
            result.generations[0].message.additional_kwargs["tool_calls"] = wire
        return result


def _fenced(script: Script, ws: Workspace, log: Path, mode: str = "sync", model: type[ScriptChatModel] = ScriptChatModel,
            **options: Any) -> tuple[Source, FenceMiddleware, Any]:
    """The script through create_agent with the fence: (source, fence, the answer or the exception)."""
    source = Source(script, CAP)
    fence = FenceMiddleware(kinds=script.kinds, log=str(log), **options)
    agent = create_agent(model(source=source), tools=list(ws.tools.values()), middleware=[fence])
    try:
        ended: Any = _invoke(agent, mode)["messages"][-1].content
    except Exception as exc:  # noqa: BLE001 - how it ended is what is checked
        ended = exc
    return source, fence, ended


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("script", RUNAWAY, ids=lambda s: s.name)
def test_runaway_stops_at_loopfences_own_figure_with_a_named_stop(script: Script, mode: str, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    stops_like_the_ring(script, log, lambda ws: _fenced(script, ws, log, mode),
                        raised=(LangChainFenceStop, GraphRecursionError), framework="langchain")  # LangGraph's error


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("script", HONEST, ids=lambda s: s.name)
def test_legitimate_script_reaches_its_answer(script: Script, mode: str, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    reaches_its_answer(script, log, lambda ws: _fenced(script, ws, log, mode))


def test_the_log_replays_reports_and_exports(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    with Workspace() as ws:
        _fenced(RUNAWAY[1], ws, log)  # duplicate_args: reused calls, no_progress

    def again(ws: Workspace, rerun: Path) -> None:  # the agent again, fed the recording by GenericFakeChatModel
        fence = FenceMiddleware(kinds=RUNAWAY[1].kinds, log=str(rerun))
        agent = create_agent(recorded_model(log), tools=list(ws.tools.values()), middleware=[fence])
        with pytest.raises(FenceStop):
            agent.invoke(TASK)

    replays_reports_and_exports(log, tmp_path, "no_progress", again=again)  # again: one execution, the same events


_IDS = itertools.count()


def _calls(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"call_{next(_IDS)}"} for n, a in calls])


def flaky(n: int) -> str:
    """Answer for n: 3 raises."""
    if n == 3:
        raise ValueError("boom")
    return f"ok {n}"


def test_a_budget_is_checked_before_the_request_and_every_request_carries_max_tokens(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    class Watching(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            seen.append(kwargs)
            return self

    model = Watching(messages=iter([_calls(("flaky", {"n": 2})), _calls(("flaky", {"n": 4})),
                                    _calls(("flaky", {"n": 5})), "done"]))
    fence = FenceMiddleware(limits=Limits(max_steps=2, max_tokens_per_request=300), log=str(tmp_path / "r.jsonl"))
    with pytest.raises(FenceStop) as stopped:
        create_agent(model, tools=[flaky], middleware=[fence]).invoke(TASK)
    assert (stopped.value.reason, stopped.value.limit, stopped.value.value) == (StopReason.MAX_STEPS, 2, 3)
    assert "max_steps=2" in stopped.value.detail
    assert [k.get("max_tokens") for k in seen] == [300, 300]  # the third request was never sent
    assert fence.result.ledger.model_requests == 2 and fence.result.ledger.tool_executions == 2
    reconciles(tmp_path / "r.jsonl")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("limiter", "name", "requests", "executions"), [
    (ModelCallLimitMiddleware(run_limit=3), "ModelCallLimitMiddleware.run_limit", 3, 3),  # before the 4th request
    (ToolCallLimitMiddleware(run_limit=3, exit_behavior="end"), "ToolCallLimitMiddleware.run_limit", 4, 3)],
    ids=["model_calls", "tool_calls"])  # the 4th reply's call is not run
def test_langchains_own_call_limit_is_a_named_stop_that_replays(limiter: Any, name: str, requests: int,
                                                                executions: int, mode: str, tmp_path: Path) -> None:
    """A call-limit middleware ends the run with its own message (exit_behavior "end"): the run's
    stop is framework_limit naming the middleware's limit and value (not empty_answer), and the log
    reconciles and replays to that stop."""
    model = scripted_model(_calls(("flaky", {"n": n})) for n in range(4, 10))
    fence = FenceMiddleware(log=str(tmp_path / "limit.jsonl"))
    out = _invoke(create_agent(model, tools=[flaky], middleware=[fence, limiter]), mode)
    assert "limit" in out["messages"][-1].text  # LangChain's own ending, unchanged
    ends_at_the_frameworks_limit(tmp_path / "limit.jsonl", fence.result, "langchain", name, 3,
                                 requests=requests, executions=executions)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_handled_tool_error_is_an_error_result_and_a_tool_exception_is_raised_on_with_the_stop_written(
        mode: str, tmp_path: Path) -> None:
    def answer(n: int) -> str:
        """Answer for n: 1 asks for another n."""
        if n == 1:
            raise ToolException("try n=2")
        return f"ok {n}"

    picky = StructuredTool.from_function(answer, name="picky", handle_tool_error=True)

    model = scripted_model([_calls(("picky", {"n": 1})), _calls(("picky", {"n": 2})), "done"])
    fence = FenceMiddleware(log=str(tmp_path / "bad.jsonl"))
    out = _invoke(create_agent(model, tools=[picky], middleware=[fence]), mode)
    assert out["messages"][-1].content == "done"
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["error", "success"]  # LangChain's own messages, unchanged
    results = [e.record for e in read_log(tmp_path / "bad.jsonl").events if e.event == "result"]
    assert [(r["decision"], r["ok"]) for r in results] == [("executed", False), ("executed", True)]
    assert "try n=2" in results[0]["content"]
    reconciles(tmp_path / "bad.jsonl")

    model = scripted_model([_calls(("flaky", {"n": 3})), "done"])
    fence = FenceMiddleware(log=str(tmp_path / "raise.jsonl"))
    with pytest.raises(ValueError, match="boom"):  # LangChain's own behaviour, unchanged
        _invoke(create_agent(model, tools=[flaky], middleware=[fence]), mode)
    assert fence.result.stop.reason is StopReason.INTERNAL_ERROR and "ValueError: boom" in fence.result.stop.detail
    reconciles(tmp_path / "raise.jsonl")

    def failing() -> Any:
        yield _calls(("flaky", {"n": 2}))
        raise RuntimeError("HTTP 500")

    fence = FenceMiddleware(log=str(tmp_path / "model.jsonl"))
    with pytest.raises(RuntimeError, match="HTTP 500"):
        _invoke(create_agent(scripted_model(failing()), tools=[flaky], middleware=[fence]), mode)
    assert fence.result.stop.reason is StopReason.ENDPOINT_ERROR
    reconciles(tmp_path / "model.jsonl")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_untrusted_content_gates_a_privileged_call_and_the_agent_gets_the_refusal(mode: str, tmp_path: Path) -> None:
    wrote, tools = gated_tools()
    model = scripted_model([_calls(("fetch", {"url": "http://x"})),
                            _calls(("write_file", {"path": "evil.sh", "content": "x"})), "done"])
    fence = FenceMiddleware(untrusted={"fetch"}, log=str(tmp_path / "gate.jsonl"))
    out = _invoke(create_agent(model, tools=tools, middleware=[fence]), mode)
    assert wrote == [] and out["messages"][-1].content == "done"
    refused = [m.content for m in out["messages"] if isinstance(m, ToolMessage) and m.name == "write_file"]
    assert refused and "permission_denied" in refused[0]
    gates = [e.record["decision"] for e in read_log(tmp_path / "gate.jsonl").events if e.event == "gate"]
    assert gates == ["tainted", "refused"]
    reconciles(tmp_path / "gate.jsonl")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_approval_hook_lets_a_gated_call_run(mode: str, tmp_path: Path) -> None:
    wrote, tools = gated_tools()
    asked: list[tuple[str, int]] = []

    def approve(call: Any, reason: str) -> bool:  # a blocking hook (a person): under invoke, on an event loop
        asked.append((call.tool.name, threading.get_ident()))
        return True

    model = scripted_model([_calls(("fetch", {"url": "http://x"})),
                            _calls(("write_file", {"path": "notes.md", "content": "x"})), "done"])
    fence = FenceMiddleware(untrusted={"fetch"}, approve=approve, log=str(tmp_path / "approve.jsonl"))
    out = _invoke(create_agent(model, tools=tools, middleware=[fence]), mode)
    assert wrote == ["notes.md"] and out["messages"][-1].content == "done"
    assert [name for name, _ in asked] == ["write_file"]
    gates = [e.record["decision"] for e in read_log(tmp_path / "approve.jsonl").events if e.event == "gate"]
    assert gates == ["tainted", "approved"]
    reconciles(tmp_path / "approve.jsonl")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hung_model_request_is_cut_at_max_wall_seconds_with_a_named_stop(mode: str, tmp_path: Path) -> None:
    release = threading.Event()

    def replies() -> Any:
        yield _calls(("flaky", {"n": 1}))
        release.wait(120)  # the second request hangs until the stop is written
        yield "late"

    def on_event(event: Any) -> None:
        if isinstance(event, StopLine):
            release.set()

    log = tmp_path / "wall.jsonl"
    fence = FenceMiddleware(limits=Limits(max_wall_seconds=1.0), on_event=on_event, log=str(log))
    with pytest.raises(LangChainFenceStop) as stopped:
        _invoke(create_agent(scripted_model(replies()), tools=[flaky], middleware=[fence]), mode)
    assert stopped.value.reason is StopReason.MAX_WALL_SECONDS and stopped.value.limit == 1.0
    assert fence.result.ledger.tool_executions == 1 and fence.result.ledger.model_requests == 2
    reconciles(log)


def test_a_tools_schema_is_the_one_langchain_sends_made_once_per_kind_of_tool() -> None:
    def made(ws: Workspace) -> list[Any]:
        return [StructuredTool.from_function(fn) for fn in ws.tools.values()]

    with Workspace() as first, Workspace() as second:  # the same functions made afresh: new argument models
        for a, b in zip(made(first), made(second), strict=True):
            assert a.args_schema is not b.args_schema
            assert _parameters(a) == _parameters(b) == convert_to_openai_tool(b)["function"]["parameters"]
    mine = _parameters(a)
    mine["properties"].clear()  # a caller's copy: the next run's schema is whole
    assert _parameters(b) == convert_to_openai_tool(b)["function"]["parameters"]

    def noop(i: int, why: str = "none") -> str:  # the bench's tool's name and text, another signature
        """Do nothing with a number.

        Args:
            i: Any number.
        """
        return why

    other = StructuredTool.from_function(noop)
    assert _parameters(other) == convert_to_openai_tool(other)["function"]["parameters"]
    assert "why" in _parameters(other)["properties"] and "why" not in _parameters(b)["properties"]


def test_a_cached_result_is_the_tools_message_and_parallel_calls_run_one_at_a_time(tmp_path: Path) -> None:
    running, overlap, reads = [0], [False], []
    lock = threading.Lock()

    def read_file(path: str, encoding: str = "utf-8") -> str:
        """Read a file."""
        with lock:
            running[0] += 1
            overlap[0] |= running[0] > 1
        reads.append(path)
        with lock:
            running[0] -= 1
        return f"contents of {path}"

    model = scripted_model([_calls(("read_file", {"path": "a"}), ("read_file", {"path": "b"}),
                                   ("read_file", {"path": "c"})),
                            _calls(("read_file", {"encoding": "utf-8", "path": "a"}), ("read_file", {"path": "d"})),
                            "done"])
    fence = FenceMiddleware(kinds={"read_file": "read_only"}, log=str(tmp_path / "cache.jsonl"))
    out = create_agent(model, tools=[read_file], middleware=[fence]).invoke(TASK)
    assert sorted(reads) == ["a", "b", "c", "d"] and not overlap[0]  # the repeated read of a was not run
    answers = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answers[:3] + answers[4:] == ["contents of a", "contents of b", "contents of c", "contents of d"]
    assert answers[3].startswith("contents of a\n[reused: same call")  # the cached result, as the ring gives it
    assert fence.result.ledger.tool_executions == 4 and fence.result.stop.reason is StopReason.FINAL_ANSWER
    decisions = [e.record["decision"] for e in read_log(tmp_path / "cache.jsonl").events if e.event == "result"]
    assert sorted(decisions) == ["executed"] * 4 + ["reused"]
    reconciles(tmp_path / "cache.jsonl")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hung_tool_is_cut_at_tool_timeout_s_and_the_run_goes_on(mode: str, tmp_path: Path) -> None:
    release = threading.Event()

    def hang(x: int) -> str:
        """Wait for a release."""
        release.wait(120)
        return "late"

    def on_event(event: Any) -> None:
        if isinstance(event, ResultLine):  # the timeout is written: the hung thread may end now
            release.set()

    model = scripted_model([_calls(("hang", {"x": 1})), "done"])
    fence = FenceMiddleware(limits=Limits(tool_timeout_s=0.2), on_event=on_event, log=str(tmp_path / "t.jsonl"))
    out = _invoke(create_agent(model, tools=[hang], middleware=[fence]), mode)
    assert out["messages"][-1].content == "done"
    answer = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert "timeout" in answer.content and "late" not in answer.content
    results = [e.record for e in read_log(tmp_path / "t.jsonl").events if e.event == "result"]
    assert len(results) == 1 and results[0]["ok"] is False and "did not finish within 0.2s" in results[0]["content"]
    reconciles(tmp_path / "t.jsonl")


def test_each_invocation_is_its_own_fenced_run_with_its_own_log(tmp_path: Path) -> None:
    paths = iter([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    model = scripted_model([_calls(("flaky", {"n": 2})), "one", _calls(("flaky", {"n": 2})), "two"])
    fence = FenceMiddleware(log=lambda: next(paths))
    agent = create_agent(model, tools=[flaky], middleware=[fence])
    assert [agent.invoke(TASK)["messages"][-1].content, agent.invoke(TASK)["messages"][-1].content] == ["one", "two"]
    assert [r.final_answer for r in fence.results] == ["one", "two"]
    assert [r.ledger.tool_executions for r in fence.results] == [1, 1]  # the second run's cache starts empty
    for name in ("a.jsonl", "b.jsonl"):
        reconciles(tmp_path / name)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_nudge_reaches_the_model_as_a_message_and_the_run_goes_on(mode: str, tmp_path: Path) -> None:
    script = RUNAWAY[2]  # ok_forever: the fifth identical result warns, the model then answers
    turns = [*(script.turn(i) for i in range(5)), "stopping: it always says ok"]
    seen: list[list[Any]] = []

    class Watching(ScriptChatModel):
        def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            seen.append(list(messages))
            return super()._generate(messages, *args, **kwargs)

    class Turns:
        calls = 0
        capped = False

        def next(self) -> Any:
            self.calls += 1
            return turns[self.calls - 1]

    with Workspace() as ws:
        fence = FenceMiddleware(kinds=script.kinds, policy=Policy(nudge=True), log=str(tmp_path / "n.jsonl"))
        agent = create_agent(Watching(source=Turns()), tools=list(ws.tools.values()), middleware=[fence])
        out = _invoke(agent, mode)
    assert out["messages"][-1].content == "stopping: it always says ok" and fence.result.ledger.nudges == 1
    last = seen[-1]
    nudges = [i for i, m in enumerate(last) if isinstance(m, HumanMessage) and str(m.content).startswith("loopfence:")]
    assert nudges == [len(last) - 1]  # after the turn's results
    reconciles(tmp_path / "n.jsonl")


def test_a_stop_caught_on_the_way_still_ends_the_run() -> None:
    """A middleware outside the fence that turns tool errors into messages cannot carry the run on:
    the next request raises the stop the call raised."""
    from langchain.agents.middleware import AgentMiddleware

    class Forgiving(AgentMiddleware):
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            try:
                return handler(request)
            except Exception as exc:  # noqa: BLE001
                return ToolMessage(content=str(exc), tool_call_id=request.tool_call["id"], status="error")

    def record(note: str) -> str:
        """Record a note."""
        return "ok"

    model = scripted_model([_calls(("record", {"note": "a"}), ("record", {"note": "b"})), "done"])
    fence = FenceMiddleware(limits=Limits(max_tool_calls=1))
    with pytest.raises(LangChainFenceStop) as stopped:
        create_agent(model, tools=[record], middleware=[Forgiving(), fence]).invoke(TASK)
    assert stopped.value.reason is StopReason.MAX_TOOL_CALLS and stopped.value.limit == 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=DRAWN_TURNS)
def test_the_fenced_agent_and_the_ring_execute_reuse_and_stop_alike(turns: list[list[tuple[str, str]]],
                                                                     tmp_path: Path) -> None:
    script = drawn_script(turns)
    log = tmp_path / "drawn.jsonl"
    runs_like_the_ring(script, log, lambda ws: _fenced(script, ws, log, model=WireChatModel))
