"""smolagents ToolCallingAgent with default settings (max_steps=20, INFO logging to the console);
the script served through its Model interface. Its protocol ends a run with a `final_answer` call,
so a script's final text becomes that call."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.metadata import version as _dist_version
from typing import Any

from smolagents import ToolCallingAgent, tool
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, Model

from ..common import Outcome, Script, Source, Workspace, calls_of, describe_exception, final_text

NAME = "smolagents"
DEFAULTS = "ToolCallingAgent defaults: max_steps=20 (then one more call for a final answer); " \
    "tool errors go back to the model; INFO logging to the console"


def version() -> str:
    return _dist_version("smolagents")


class SourceModel(Model):
    def __init__(self, source: Source) -> None:
        super().__init__(model_id="bench-script")
        self.source = source

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: Any = None, tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        turn = self.source.next()
        text = final_text(turn)
        calls = [("final_answer", json.dumps({"answer": text}))] if text is not None else calls_of(turn)
        return ChatMessage(role="assistant", content=None, tool_calls=[
            ChatMessageToolCall(ChatMessageToolCallFunction(name=name, arguments=raw),
                                id=f"call_{self.source.calls}_{j}", type="function")
            for j, (name, raw) in enumerate(calls)])


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Callable[[], Outcome]:
    """Build the agent now; the returned call runs it (this is what the overhead section times)."""
    source = Source(script, cap)
    agent = ToolCallingAgent(tools=[tool(fn) for fn in ws.tools.values()], model=SourceModel(source))
    kwargs: dict[str, Any] = {"max_steps": cap + 1} if unbounded else {}

    def go() -> Outcome:
        try:
            answer = agent.run("Do the task.", **kwargs)
        except Exception as exc:  # noqa: BLE001 - how it ended is the measurement
            return Outcome(source.calls, ws.executions, "cap" if source.capped else describe_exception(exc))
        steps = agent.memory.steps
        reached = any(getattr(s, "is_final_answer", False) for s in steps)
        errors = [s.error for s in steps if getattr(s, "error", None) is not None]
        if reached and not errors[-1:]:
            ended = "final answer"
        elif errors and "max steps" in str(errors[-1]).lower():
            ended = "max_steps reached; then asked the model for a final answer"
        else:
            ended = f"returned after errors: {describe_exception(errors[-1])}" if errors else "returned"
        return Outcome(source.calls, ws.executions, ended, None if answer is None else str(answer))

    return go


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
