"""LangChain v1 `create_agent` with default settings; the script served by a small fake chat model.

The fake model supports `bind_tools` and builds its AIMessage the way langchain-openai does from a
wire reply: `parse_tool_call`, and `make_invalid_tool_call` for arguments that do not parse.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version as _dist_version
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

from loopfence.integrations import FenceStop

from ..common import Outcome, Script, Source, Workspace, calls_of, describe_exception, final_text

NAME = "langchain"
DEFAULTS = "create_agent defaults: langgraph recursion_limit=10007 (about 5,000 model calls); " \
    "tool errors go back to the model"


def version() -> str:
    return f"langchain {_dist_version('langchain')} / core {_dist_version('langchain-core')} / " \
        f"langgraph {_dist_version('langgraph')}"


class ScriptChatModel(BaseChatModel):
    """A chat model that serves a script; bind_tools accepts the tools and returns the model itself."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    source: Any

    @property
    def _llm_type(self) -> str:
        return "bench-script"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptChatModel:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        turn = self.source.next()
        text = final_text(turn)
        if text is not None:
            message = AIMessage(content=text)
        else:
            valid, invalid = [], []
            for j, (name, raw) in enumerate(calls_of(turn)):
                wire = {"id": f"call_{self.source.calls}_{j}", "type": "function",
                        "function": {"name": name, "arguments": raw}}
                try:
                    valid.append(parse_tool_call(wire, return_id=True))
                except Exception as exc:  # noqa: BLE001 - OutputParserException, as langchain-openai does
                    invalid.append(make_invalid_tool_call(wire, str(exc)))
            message = AIMessage(content="", tool_calls=valid, invalid_tool_calls=invalid)
        return ChatResult(generations=[ChatGeneration(message=message)])


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False,
            fence: Any = None) -> Callable[[], Outcome]:
    """Build the agent now; the returned call runs it (this is what the overhead section times).
    `fence`: a middleware to add (langchain_fenced_fw's FenceMiddleware); a FenceStop it raises ends
    the run named by its stop."""
    source = Source(script, cap)
    agent = create_agent(ScriptChatModel(source=source), tools=list(ws.tools.values()),
                         middleware=() if fence is None else [fence])
    config: dict[str, Any] = {"recursion_limit": 4 * cap + 10} if unbounded else {}

    def go() -> Outcome:
        try:
            state = agent.invoke({"messages": [{"role": "user", "content": "Do the task."}]}, config=config)
        except FenceStop as stop:  # only with a fence
            return Outcome(source.calls, ws.executions, f"{stop.reason} (FenceStop)")
        except Exception as exc:  # noqa: BLE001 - how it ended is the measurement
            return Outcome(source.calls, ws.executions, "cap" if source.capped else describe_exception(exc))
        last = state["messages"][-1]
        answer = last.content if isinstance(last.content, str) else str(last.content)
        if fence is not None:  # the fenced adapter's own words
            return Outcome(source.calls, ws.executions, "final answer" if answer else "empty answer", answer or None)
        ended = "final answer" if answer else "ended with an empty answer (no tool calls)"
        if getattr(last, "invalid_tool_calls", None):
            ended = "ended as an answer: the malformed call was dropped (invalid_tool_calls)"
        return Outcome(source.calls, ws.executions, ended, answer or None)

    return go


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
