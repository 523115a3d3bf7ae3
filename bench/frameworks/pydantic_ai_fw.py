"""pydantic-ai: Agent with default settings, the script served by its FunctionModel test facility."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version as _dist_version
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from loopfence.integrations import FenceStop

from ..common import Outcome, Script, Source, Workspace, calls_of, final_text, describe_exception

NAME = "pydantic-ai"
DEFAULTS = "Agent() defaults: UsageLimits(request_limit=50), retries=1 (tools and output)"


def version() -> str:
    return _dist_version("pydantic-ai-slim")


def _model(source: Source) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = source.next()
        text = final_text(turn)
        if text is not None:
            return ModelResponse(parts=[TextPart(text)])
        return ModelResponse(parts=[ToolCallPart(name, raw, tool_call_id=f"call_{source.calls}_{j}")
                                    for j, (name, raw) in enumerate(calls_of(turn))])

    return FunctionModel(respond)


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False,
            fence: Any = None) -> Callable[[], Outcome]:
    """Build the agent now; the returned call runs it (this is what the overhead section times).
    `fence`: a capability to add (pydantic_ai_fenced_fw's FenceCapability); a FenceStop it raises ends
    the run named by its stop."""
    source = Source(script, cap)
    agent: Agent[None, str] = Agent(_model(source), tools=list(ws.tools.values()),
                                    capabilities=None if fence is None else [fence])
    kwargs: dict[str, Any] = {"usage_limits": UsageLimits(request_limit=None)} if unbounded else {}

    def go() -> Outcome:
        try:
            result = agent.run_sync("Do the task.", **kwargs)
        except FenceStop as stop:  # only with a fence
            return Outcome(source.calls, ws.executions, f"{stop.reason} (FenceStop)")
        except Exception as exc:  # noqa: BLE001 - how it ended is the measurement
            return Outcome(source.calls, ws.executions, "cap" if source.capped else describe_exception(exc))
        return Outcome(source.calls, ws.executions, "final answer", result.output)

    return go


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
