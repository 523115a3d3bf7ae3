"""OpenAI Agents SDK: Agent + Runner with default settings, the script served through its Model interface."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version as _dist_version
from typing import Any

from agents import Agent, Runner, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from loopfence.integrations import FenceStop

from ..common import Outcome, Script, Source, Workspace, calls_of, describe_exception, final_text

NAME = "openai-agents"
DEFAULTS = "Runner.run_sync defaults: max_turns=10; tool errors go back to the model"


# Tracing stays on (the default); with no API key its exporter only warns once per run. Keep that
# warning out of the bench's output: it is a log line, not a setting.
logging.getLogger("openai.agents").setLevel(logging.ERROR)


def version() -> str:
    return _dist_version("openai-agents")


class SourceModel(Model):
    def __init__(self, source: Source) -> None:
        self.source = source

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        turn = self.source.next()
        n = self.source.calls
        text = final_text(turn)
        if text is not None:
            output: list[Any] = [ResponseOutputMessage(
                id=f"msg_{n}", role="assistant", status="completed", type="message",
                content=[ResponseOutputText(text=text, type="output_text", annotations=[])])]
        else:
            output = [ResponseFunctionToolCall(arguments=raw, call_id=f"call_{n}_{j}", name=name,
                                               type="function_call", id=f"fc_{n}_{j}", status="completed")
                      for j, (name, raw) in enumerate(calls_of(turn))]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the benchmark does not stream")


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False,
            fence: Any = None) -> Callable[[], Outcome]:
    """Build the agent now; the returned call runs it (this is what the overhead section times).
    `fence`: an AgentsFence (agents_sdk_fenced_fw's) whose `fence.agent(agent)` is run instead; a
    FenceStop it raises ends the run named by its stop."""
    source = Source(script, cap)
    agent = Agent(name="bench", instructions="Do the task.", model=SourceModel(source),
                  tools=[function_tool(fn) for fn in ws.tools.values()])
    if fence is not None:
        agent = fence.agent(agent)
    kwargs: dict[str, Any] = {"max_turns": cap + 1} if unbounded else {}

    def go() -> Outcome:
        try:
            result = Runner.run_sync(agent, "Do the task.", **kwargs)
        except FenceStop as stop:  # only with a fence
            return Outcome(source.calls, ws.executions, f"{stop.reason} (FenceStop)")
        except Exception as exc:  # noqa: BLE001 - how it ended is the measurement
            return Outcome(source.calls, ws.executions, "cap" if source.capped else describe_exception(exc))
        return Outcome(source.calls, ws.executions, "final answer", str(result.final_output or ""))

    return go


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
