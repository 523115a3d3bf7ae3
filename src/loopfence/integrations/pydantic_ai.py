"""loopfence around a pydantic-ai agent: one capability (`loopfence[pydantic-ai]`, pydantic-ai-slim 2.68).

    from loopfence.integrations.pydantic_ai import FenceCapability

    fence = FenceCapability(limits=Limits(max_steps=8), kinds={"read_file": "read_only"}, log="run.jsonl")
    agent = Agent(model, tools=[read_file], capabilities=[fence])   # the agent's tools and prompts unchanged
    try:
        agent.run_sync("Summarize app/config.py")
    except FenceStop as stopped:                                    # or pydantic-ai's own AgentRunError
        print(stopped.reason, stopped.limit, stopped.value)
    fence.result                                                    # the RunResult: stop, ledger, log path

Each agent run gets its own `FencedRun` (pydantic-ai's `for_run`); the hooks drive it as the ring
runs: `wrap_model_request` checks the budgets before the request, bounds its `max_tokens`, logs the
request and the response (as a chat.completions reply), and runs the contract on it (an unknown tool,
cut-off arguments or a schema mismatch stop the run before pydantic-ai retries it); `wrap_tool_execute`
answers a repeated read-only call from the cache, runs the guards and the untrusted-content gate, and
runs pydantic-ai's own tool function; `wrap_run` runs the agent in pydantic-ai's `sequential` tool
execution mode, so calls run one at a time in the order the model asked for them (as the ring runs them). The run's tools are the
function tools of its first request. A stop raises `PydanticAIFenceStop` (a `FenceStop` and a
pydantic-ai `AgentRunError`) out of `agent.run()`; whatever else ends the run (a model error, a tool's
exception) is raised unchanged, with the run's stop written. pydantic-ai's own `UsageLimits`
(`request_limit`, `tool_calls_limit`, the token limits) end it `framework_limit`, naming the limit and
its value; its `UsageLimitExceeded` is raised unchanged.

An output tool call (structured output) is the reply's answer, its arguments the answer text. A run
whose answer pydantic-ai rejects (output validation) stops at that answer, as the ring would.
"""

from __future__ import annotations

import asyncio
import copy
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import AgentRunError, UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage, UsageLimits

from .._json import dumps
from .._messages import Reply, Request
from .._log._reader import read_log
from .._log._schema import ReplyLine
from .._stops import Stop
from ._config import Fence, Fenced
from ._fence import FencedRun, FenceStop, framework_limit, versions

__all__ = ["FenceCapability", "PydanticAIFenceStop", "recorded_model", "to_reply", "FRAMEWORK"]

FRAMEWORK = "pydantic-ai"
_LIMIT = re.compile(r"\b(\w+_limit)\b")  # the UsageLimits field UsageLimitExceeded's message names
_FINISH = {"tool_call": "tool_calls"}  # pydantic-ai's finish reasons, as chat.completions names them


class PydanticAIFenceStop(FenceStop, AgentRunError):
    """A loopfence stop ending a pydantic-ai run: `except FenceStop` and `except AgentRunError` both
    catch it; `.stop` holds the reason, detail, limit and value."""


def to_reply(response: ModelResponse, output_tools: frozenset[str] = frozenset()) -> Reply:
    """A pydantic-ai response as the chat.completions reply the log records (and reconcile reads):
    text parts are the content, function tool calls the calls, an output tool call the answer."""
    texts = [p.content for p in response.parts if isinstance(p, TextPart)]
    calls, outputs = [], []
    for p in response.parts:
        if isinstance(p, ToolCallPart):
            (outputs if p.tool_name in output_tools else calls).append(p)
    texts += [p.args if isinstance(p.args, str) else dumps(p.args or {}) for p in outputs]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = [{"id": p.tool_call_id, "type": "function", "function": {
            "name": p.tool_name, "arguments": p.args if isinstance(p.args, str) or p.args is None else dumps(p.args)}}
            for p in calls]
    u = response.usage
    raw: dict[str, Any] = {"object": "chat.completion", "model": response.model_name,
                           "choices": [{"index": 0, "message": message,
                                        "finish_reason": _FINISH.get(str(response.finish_reason),
                                                                     response.finish_reason)}]}
    if u.input_tokens or u.output_tokens:  # all zeros: the model reported nothing
        raw["usage"] = {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens}
    return Reply.from_response(raw)


def recorded_model(log: str | Path) -> FunctionModel:
    """A pydantic-ai FunctionModel that gives a fenced run's recorded replies again, in order: the
    agent, run again with it and the same fence, replays the run (its new log is the recorded one,
    but for timings and the run id). Past the recording it raises RuntimeError."""
    replies = [e.reply() for e in read_log(log).events if isinstance(e, ReplyLine)]
    served = iter(replies)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        reply = next(served, None)
        if reply is None:
            raise RuntimeError(f"{log}: the recording has no more replies ({len(replies)} recorded)")
        parts: list[Any] = [TextPart(reply.content)] if reply.content else []
        parts += [ToolCallPart(c.name, c.arguments, tool_call_id=c.id) for c in reply.tool_calls]
        u = reply.usage
        usage = RequestUsage(input_tokens=u.prompt_tokens or 0, output_tokens=u.completion_tokens or 0) if u else RequestUsage()
        finish = {"tool_calls": "tool_call"}.get(reply.finish_reason or "", reply.finish_reason)
        model = reply.raw.get("model") if isinstance(reply.raw, dict) else None
        return ModelResponse(parts=parts, usage=usage, model_name=model if isinstance(model, str) else None,
                             finish_reason=finish)  # type: ignore[arg-type]

    return FunctionModel(respond)


def _task(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        return ""
    return "\n".join(p if isinstance(p, str) else repr(p) for p in prompt)


@dataclass(init=False)
class FenceCapability(Fenced, AbstractCapability[Any]):
    """loopfence's fence as a pydantic-ai capability: `Agent(..., capabilities=[FenceCapability(...)])`.
    Takes a `Fence`, or `Fence`'s keyword arguments. `result`/`results`: the runs' RunResults."""

    def __init__(self, fence: Fence | None = None, /, **options: Any) -> None:
        Fenced.__init__(self, fence, **options)
        self.run: FencedRun | None = None
        self._outputs: frozenset[str] = frozenset()

    async def for_run(self, ctx: RunContext[Any]) -> FenceCapability:
        """A fresh fenced run for each agent run (the fence's configuration is shared)."""
        mine = copy.copy(self)
        mine.run = None
        return mine

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        try:
            with ToolManager.parallel_execution_mode("sequential"):  # one call at a time, in the reply's order
                result = await handler()
        except FenceStop:
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            if self.run is not None:
                self.run.finish(cancelled=True)
            raise
        except BaseException as exc:
            if self.run is not None:
                self.run.finish(error=exc)
            raise
        if self.run is not None:
            self.run.finish()
        return result

    async def wrap_model_request(self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
                                 handler: Any) -> ModelResponse:
        run = self.run or self._start(ctx, request_context)

        async def send(request: Request, note: str | None) -> ModelResponse:
            if note is not None:  # a nudge (Policy(nudge=True)): a user message after the turn's results
                ctx.enqueue(note)
            response: ModelResponse = await handler(_bounded(request_context, request.max_tokens))
            return response

        return await run.model_request(send, lambda response: to_reply(response, self._outputs))

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
                                args: Any, handler: Any) -> Any:
        if self.run is None:
            return await handler(args)
        return await self.run.call(call.tool_call_id, lambda: handler(args))

    def _start(self, ctx: RunContext[Any], rc: ModelRequestContext) -> FencedRun:
        params = rc.model_request_parameters
        self._outputs = frozenset(t.name for t in params.output_tools)
        tools = [self.fence.tool(t.name, t.parameters_json_schema, t.description or "", _function(ctx, t.name))
                 for t in params.function_tools]
        limits = ctx.usage_limits
        self.run = self.fence.start(_task(ctx.prompt), tools, framework=FRAMEWORK, version=versions("pydantic-ai-slim"),
                                    model=getattr(rc.model, "model_name", None), stop_error=PydanticAIFenceStop,
                                    limit_of=lambda error: _usage_limit(error, limits))
        return self.run


def _usage_limit(error: BaseException, limits: UsageLimits | None) -> Stop | None:
    """pydantic-ai's UsageLimitExceeded as the run's `framework_limit` stop: the limit its message
    names (`request_limit`), with the run's value for it; None for any other error."""
    if not isinstance(error, UsageLimitExceeded):
        return None
    found = _LIMIT.search(str(error))
    name = found.group(1) if found is not None else None
    return framework_limit(FRAMEWORK, error, name, getattr(limits, name, None) if name is not None else None)


def _function(ctx: RunContext[Any], name: str) -> Any:
    """The plain Python function behind a function tool (not one taking RunContext), or None."""
    held = (ctx.tool_manager.tools or {}).get(name) if ctx.tool_manager is not None else None
    tools = getattr(getattr(held, "toolset", None), "tools", None)
    made = tools.get(getattr(held, "original_name", None) or name) if isinstance(tools, dict) else None
    return None if made is None or getattr(made, "takes_ctx", True) else getattr(made, "function", None)


def _bounded(rc: ModelRequestContext, max_tokens: int | None) -> ModelRequestContext:
    """The request with the fence's bound on its `max_tokens` (the smaller of it and the agent's own)."""
    if max_tokens is None:
        return rc
    settings: dict[str, Any] = dict(rc.model_settings or {})
    asked = settings.get("max_tokens")
    settings["max_tokens"] = min(asked, max_tokens) if isinstance(asked, int) else max_tokens
    return replace(rc, model_settings=settings)  # type: ignore[arg-type]
