"""loopfence around an OpenAI Agents SDK agent (`loopfence[agents]`, openai-agents 0.24).

    from loopfence.integrations.agents_sdk import AgentsFence

    fence = AgentsFence(limits=Limits(max_steps=8), kinds={"read_file": "read_only"}, log="run.jsonl")
    try:
        result = await Runner.run(fence.agent(agent), "Summarize app/config.py")   # or Runner.run_sync
    except FenceStop as stopped:                                  # or the SDK's own AgentsException
        print(stopped.reason, stopped.limit, stopped.value)
    fence.result                                                  # the RunResult: stop, ledger, log path

`fence.agent(agent)` is the SDK's own `agent.clone(...)` with two parts fenced, the agent's tools and
prompts otherwise unchanged:

- its `Model`, wrapped: before each request the budgets are checked (a stop is raised before anything
  is sent), `max_tokens` is bounded, a due nudge is added to the request's input as a user message,
  and the response is logged (as a chat.completions reply) and run through loopfence's contract (an
  unknown tool, cut-off arguments or a schema mismatch stop the run before the SDK acts on it);
- its `FunctionTool`s, copied with a wrapped `on_invoke_tool`: a repeated read-only call is answered
  from the cache, the guards and the untrusted-content gate run, and only then the tool's own invoker
  (the SDK's argument parsing, the function, its failure handling) under `tool_timeout_s`. A reused or
  refused call's text is what the SDK gets as the tool's output.

A fenced agent runs one run at a time (concurrent runs: one `fence.agent(agent)` each); each run is its
own `FencedRun`, begun at its first model request and ended when the SDK ends the run (the `Model`
hook the runner calls in the `finally` of every run). A stop raises `AgentsFenceStop` (a `FenceStop`
and the SDK's `AgentsException`) out of `Runner.run`; whatever else ends the run (a model error, the
SDK's `MaxTurnsExceeded`, a tool's exception the SDK raises on) is raised unchanged, with the run's
stop written: the SDK's own `max_turns` ends it `framework_limit`, naming `max_turns` and its value.

Not fenced: tools that are not `FunctionTool`s of the agent itself (MCP servers' tools, tools a
hook adds later) and handoffs: a call to one is an unknown tool to the fence, which stops the run there
(fail closed) rather than let calls run uncounted. `Runner.run_streamed` is refused (`UserError`).
"""

from __future__ import annotations

import asyncio
import copy
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from agents import Agent, AgentsException, FunctionTool, MaxTurnsExceeded, MultiProvider, UserError
from agents.items import ModelResponse, TResponseInputItem
from agents.model_settings import ModelSettings
from agents.models.interface import Model
from agents.retry import ModelRetryAdvice, ModelRetryAdviceRequest, ModelRetryNormalizedError
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from agents.usage import Usage

from .._messages import Reply, Request
from .._log._reader import read_log
from .._log._schema import ReplyLine
from .._stops import Stop
from ._config import Fence, Fenced
from ._fence import FencedRun, FenceStop, framework_limit, versions

try:  # which run is asking: the runner's per-run owner of its models (None where it is not given)
    from agents.models._run_context import get_model_run_owner
except ImportError:  # pragma: no cover - another SDK version
    def get_model_run_owner() -> object | None:
        return None

__all__ = ["AgentsFence", "AgentsFenceStop", "recorded_model", "to_reply", "FRAMEWORK"]

FRAMEWORK = "openai-agents"
_TURNS = re.compile(r"\((\d+)\)")  # MaxTurnsExceeded's message: "Max turns (3) exceeded"


class AgentsFenceStop(FenceStop, AgentsException):
    """A loopfence stop ending an Agents SDK run: `except FenceStop` and `except AgentsException`
    both catch it; `.stop` holds the reason, detail, limit and value."""


def to_reply(response: ModelResponse, model: str | None = None) -> Reply:
    """An Agents SDK response (Responses API output items) as the chat.completions reply the log
    records and reconcile reads: message text (and refusals) are the content, function calls the
    calls (their `call_id` the call's id); other items (reasoning, hosted tools) are not calls."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.output:
        kind = getattr(item, "type", None)
        if kind == "message":
            for part in getattr(item, "content", None) or []:
                text = getattr(part, "text", None) if part.type == "output_text" else getattr(part, "refusal", None)
                if isinstance(text, str):
                    texts.append(text)
        elif kind == "function_call":
            calls.append({"id": getattr(item, "call_id", None), "type": "function", "function": {
                "name": getattr(item, "name", None), "arguments": getattr(item, "arguments", None)}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    raw: dict[str, Any] = {"object": "chat.completion", "model": model,
                           "choices": [{"index": 0, "message": message,
                                        "finish_reason": "tool_calls" if calls else "stop"}]}
    u = response.usage
    if u.input_tokens or u.output_tokens:  # all zeros: the model reported nothing
        raw["usage"] = {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens}
    return Reply.from_response(raw)


def recorded_model(log: str | Path) -> ScriptedModel:
    """The SDK's own `ScriptedModel` (agents.testing), serving a fenced run's recorded replies again
    in order: the agent, fenced the same way and run with it, replays the run (its new log is the
    recorded one but for timings and the run id). Past the recording it raises, as ScriptedModel does."""
    steps: list[Any] = []
    for event in read_log(log).events:
        if not isinstance(event, ReplyLine):
            continue
        reply = event.reply()
        output: list[Any] = [assistant_message(reply.content)] if reply.content else []
        output += [function_call(c.name, c.arguments if isinstance(c.arguments, str) else "", call_id=c.id)
                   for c in reply.tool_calls]
        u = reply.usage
        usage = Usage(requests=1, input_tokens=u.prompt_tokens or 0, output_tokens=u.completion_tokens or 0,
                      total_tokens=(u.prompt_tokens or 0) + (u.completion_tokens or 0)) if u else Usage(requests=1)
        steps.append(ModelStep(output=output, usage=usage))
    return ScriptedModel(steps)


class AgentsFence(Fenced):
    """loopfence's fence for Agents SDK agents: `Runner.run(fence.agent(agent), ...)`. Takes a
    `Fence`, or `Fence`'s keyword arguments. `result`/`results`: the runs' RunResults."""

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The agent with its model and function tools fenced (`agent.clone(...)`; `agent` itself is
        not changed). Run it as the agent was run: `Runner.run`, `Runner.run_sync`."""
        slot = _Slot(self.fence)
        tools = [_fenced_tool(t, slot) if isinstance(t, FunctionTool) else t for t in agent.tools]
        return agent.clone(model=_FencedModel(agent.model, slot), model_settings=agent.model_settings, tools=tools)


class _Slot:
    """A fenced agent's run: begun at its first model request, ended when the SDK ends the run.
    `functions`: each fenced tool's Python function (its signature binds the arguments), or None."""

    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        self.functions: dict[str, Callable[..., Any] | None] = {}
        self.run: FencedRun | None = None
        self.owner: object | None = None

    def begin(self, system: str | None, input: str | list[TResponseInputItem], tools: list[Any],
              model: str | None) -> FencedRun:
        owner = get_model_run_owner()
        run = self.run
        if run is not None and not run.finished:
            if owner is None or self.owner is None or owner is self.owner:
                return run
            raise UserError("a fenced agent runs one run at a time: give each concurrent run its own "
                            "fence.agent(agent)")
        if run is not None and run.result is not None and owner is not None and owner is self.owner:
            raise AgentsFenceStop(run.result.stop, run.result)  # the run that stopped asks again: refused
        fenced = [self.fence.tool(t.name, _defaults_optional(t.params_json_schema), t.description or "",
                                  self.functions[t.name])
                  for t in tools if isinstance(t, FunctionTool) and t.name in self.functions]
        self.owner = owner
        self.run = self.fence.start(_task(input), fenced, framework=FRAMEWORK, version=versions("openai-agents"),
                                    model=model, system=system, stop_error=AgentsFenceStop, limit_of=_max_turns)
        return self.run

    def running(self, tool: str) -> FencedRun:
        if self.run is None:
            raise UserError(f"tool {tool} ran without the fenced agent's model asking for it: a "
                            "RunConfig(model=...) replaces the model fence.agent() fenced")
        return self.run

    def end(self, owner: object, error: BaseException | None) -> None:
        """The SDK has ended the run (`error`: what it is raising, or None)."""
        run = self.run
        if run is None or run.finished or (self.owner is not None and owner is not self.owner):
            return
        if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
            run.finish(cancelled=True)
        else:
            run.finish(error=error if isinstance(error, Exception) and not isinstance(error, FenceStop) else None)


def _max_turns(error: BaseException) -> Stop | None:
    """The SDK's MaxTurnsExceeded as the run's `framework_limit` stop (max_turns and the value its
    message names); None for any other error."""
    if not isinstance(error, MaxTurnsExceeded):
        return None
    found = _TURNS.search(error.message)
    return framework_limit(FRAMEWORK, error, "max_turns", int(found.group(1)) if found is not None else None)


def _defaults_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """The tool's schema as the SDK validates arguments: a strict schema lists every property as
    required, but the SDK's argument model fills in a missing one that has a default."""
    props, required = schema.get("properties"), schema.get("required")
    if not isinstance(props, dict) or not isinstance(required, list):
        return schema
    needed = [name for name in required if not (isinstance(props.get(name), dict) and "default" in props[name])]
    return schema if needed == required else {**schema, "required": needed}


def _task(input: str | list[TResponseInputItem]) -> str:
    """The run's task: its first user message."""
    if isinstance(input, str):
        return input
    for item in input:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


class _FencedModel(Model):
    """The agent's model, each request driven through the run's `FencedRun.model_request`."""

    def __init__(self, inner: Model | str | None, slot: _Slot) -> None:
        self._inner = inner
        self._resolved: Model | None = inner if isinstance(inner, Model) else None
        self.slot = slot
        name = getattr(inner, "model", None) if isinstance(inner, Model) else inner
        self.name = name if isinstance(name, str) else None

    def _model(self) -> Model:
        """The model itself (a name is resolved once, by the SDK's default provider)."""
        if self._resolved is None:
            self._resolved = MultiProvider().get_model(self._inner if isinstance(self._inner, str) else None)
        return self._resolved

    async def get_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                           model_settings: ModelSettings, tools: list[Any], output_schema: Any,
                           handoffs: list[Any], tracing: Any, *, previous_response_id: str | None,
                           conversation_id: str | None, prompt: Any) -> ModelResponse:
        run = self.slot.begin(system_instructions, input, tools, self.name)

        async def send(request: Request, note: str | None) -> ModelResponse:
            sent = input if note is None else [*_items(input), {"role": "user", "content": note}]
            return await self._model().get_response(
                system_instructions, sent, _bounded(model_settings, request.max_tokens), tools, output_schema,
                handoffs, tracing, previous_response_id=previous_response_id, conversation_id=conversation_id,
                prompt=prompt)

        return await run.model_request(send, lambda response: to_reply(response, self.name))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return _refuse_streaming()

    def get_retry_advice(self, request: ModelRetryAdviceRequest) -> ModelRetryAdvice | None:
        """No retry once the run has stopped (a stop, or the request's own error ended it)."""
        run = self.slot.run
        if isinstance(request.error, FenceStop) or (run is not None and run.finished):
            return ModelRetryAdvice(suggested=False, reason="loopfence: the run has stopped",
                                    normalized=ModelRetryNormalizedError(is_abort=True))
        return self._model().get_retry_advice(request)

    async def _cleanup_on_run_end(self, owner: object) -> None:
        # the runner calls this in the `finally` of every run: what it is raising is the exception
        # being handled there (None when the run returned)
        self.slot.end(owner, sys.exc_info()[1])
        if self._resolved is not None:
            await self._resolved._cleanup_on_run_end(owner)

    async def close(self) -> None:
        if self._resolved is not None:
            await self._resolved.close()


async def _refuse_streaming() -> AsyncIterator[Any]:
    raise UserError("loopfence's Agents SDK fence does not stream: run the fenced agent with Runner.run "
                    "or Runner.run_sync")
    yield  # pragma: no cover - an async generator


def _items(input: str | list[TResponseInputItem]) -> list[Any]:
    return [{"role": "user", "content": input}] if isinstance(input, str) else list(input)


def _bounded(settings: ModelSettings, max_tokens: int | None) -> ModelSettings:
    """The settings with the fence's bound on `max_tokens` (the smaller of it and the agent's own)."""
    if max_tokens is None:
        return settings
    asked = settings.max_tokens
    return settings.resolve(ModelSettings(max_tokens=min(asked, max_tokens) if asked is not None else max_tokens))


def _fenced_tool(tool: FunctionTool, slot: _Slot) -> FunctionTool:
    """A copy of the tool whose invocation goes through the run's `FencedRun.call`."""
    try:
        slot.functions[tool.name] = tool.__wrapped__  # the Python function given to function_tool
    except AttributeError:  # a FunctionTool built by hand: its JSON schema binds the arguments
        slot.functions[tool.name] = None
    mine = copy.copy(tool)  # the SDK's own copy (its failure handling bound to the copy)
    invoke = mine.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        run = slot.running(tool.name)
        return await run.call(ctx.tool_call_id, lambda: invoke(ctx, arguments))

    mine.on_invoke_tool = on_invoke_tool
    return mine
