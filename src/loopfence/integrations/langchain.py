"""loopfence around a LangChain v1 agent: one middleware (`loopfence[langchain]`, langchain 1.5 / langchain-core 1.8).

    from loopfence.integrations.langchain import FenceMiddleware

    fence = FenceMiddleware(limits=Limits(max_steps=8), kinds={"read_file": "read_only"}, log="run.jsonl")
    agent = create_agent(model, tools=[read_file], middleware=[fence])  # first in the list: the outermost
    try:
        agent.invoke({"messages": [{"role": "user", "content": "Summarize app/config.py"}]})
    except FenceStop as stopped:                       # or LangGraph's own GraphRecursionError
        print(stopped.reason, stopped.limit, stopped.value)
    fence.result                                       # the RunResult: stop, ledger, log path

Each agent invocation gets its own `FencedRun` (`before_agent` names it in the graph state; `after_agent`
writes its stop); the hooks drive it as the ring runs, in both forms (`invoke` and `ainvoke`):
`wrap_model_call` ends the turn before (no_progress, the repetition rules' after-turn checks), checks
the budgets before the request, bounds its `max_tokens`, adds a due nudge, logs the request and the
model's AIMessage (as a chat.completions reply) and runs the contract on it (an unknown tool or cut-off
arguments stop the run before LangChain runs anything); `wrap_tool_call` answers a repeated read-only
call from the cache (a ToolMessage holding the earlier result), runs the guards and the
untrusted-content gate, and runs LangChain's own tool call under tool_timeout_s. Under `invoke` the
model request and the tool call run on loopfence's worker threads while a clock is set (so
max_wall_seconds and tool_timeout_s can cut them); under `ainvoke` they are awaited.

A stop raises `LangChainFenceStop`: a `FenceStop` and LangGraph's `GraphRecursionError`, the error an
unfenced runaway ends with, so `except GraphRecursionError` handlers keep working and `.stop` is the
named reason. Whatever else ends the run (a model error, a tool's exception) is raised unchanged, with
the stop written. LangChain's own call limits (`ModelCallLimitMiddleware`, `ToolCallLimitMiddleware`,
`exit_behavior="end"`) end the run with a message of their own: the stop is `framework_limit`, naming
the middleware's limit and its value. A nudge (Policy(nudge=True)) is a user message in every later
request, after the turn it followed; the agent's state does not keep it (the log does).
"""

from __future__ import annotations

import asyncio
import copy
import re
import threading
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware.types import (AgentMiddleware, AgentState, ExtendedModelResponse, ModelRequest,
                                               ModelResponse, PrivateStateAttr)
from langchain.agents.structured_output import AutoStrategy, ToolStrategy
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.errors import GraphBubbleUp, GraphRecursionError
from pydantic import BaseModel

from .._json import dumps
from .._messages import Reply, Request
from .._stops import Stop
from ..tools._registry import Tool
from .._log._reader import read_log
from .._log._schema import ReplyLine
from ._config import Fence, Fenced
from ._fence import FencedRun, FenceStop, framework_limit, versions

__all__ = ["FenceMiddleware", "LangChainFenceStop", "LangChainToolError", "to_reply", "scripted_model",
           "recorded_model", "FRAMEWORK"]

FRAMEWORK = "langchain"
_KEY = "loopfence_run"  # the graph state's name for this invocation's fenced run
# the message LangChain's call-limit middleware ends a run with (exit_behavior="end"): which one, the
# limit (thread or run) and its value: "Model call limits exceeded: run limit (3/3)", "Tool call limit
# reached: run limit exceeded (4/3 calls)."
_ENDED_AT = re.compile(r"^(?:(Model) call limits exceeded|(?:'[^']*' tool|Tool) call limit reached): "
                       r"(thread|run) limit(?: exceeded)? \(\d+/(\d+)")


class LangChainFenceStop(FenceStop, GraphRecursionError):
    """A loopfence stop ending a LangChain run: `except FenceStop` and LangGraph's own
    `except GraphRecursionError` both catch it; `.stop` holds the reason, detail, limit and value."""


class LangChainToolError(Exception):
    """A tool call LangChain answered with an error ToolMessage (bad arguments, a handled tool
    error): the log records it as the call's error result; LangChain keeps its own message."""


class FenceState(AgentState[Any]):
    """The agent state with the name of the invocation's fenced run (private: not in input or output)."""

    loopfence_run: NotRequired[Annotated[str, PrivateStateAttr]]


# -- LangChain's messages as the log's replies, and back ----------------------------------------------
def to_reply(message: AIMessage, output_tools: frozenset[str] = frozenset()) -> Reply:
    """An AIMessage as the chat.completions reply the log records (and reconcile reads): its text is
    the content; its tool calls (the invalid ones too, with their raw arguments) the calls, the raw
    argument text where the message kept the wire's (`additional_kwargs["tool_calls"]`); a call of
    a structured-output tool is the answer."""
    texts = [str(message.text)] if message.text else []
    calls = []
    for call_id, name, arguments in _wire_calls(message):
        if name in output_tools:
            texts.append(arguments or "")
        else:
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    body: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        body["tool_calls"] = calls
    meta = message.response_metadata or {}
    raw: dict[str, Any] = {"object": "chat.completion", "model": meta.get("model_name"),
                           "choices": [{"index": 0, "message": body, "finish_reason": meta.get("finish_reason")}]}
    usage = message.usage_metadata
    if usage and (usage["input_tokens"] or usage["output_tokens"]):
        raw["usage"] = {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"]}
    return Reply.from_response(raw)


def _wire_calls(message: AIMessage) -> list[tuple[str | None, str, str | None]]:
    """(id, name, raw arguments) of each requested call, in the order the model sent them."""
    parsed = [(c["id"], c["name"], dumps(c["args"])) for c in message.tool_calls]
    parsed += [(c["id"], c["name"] or "", c["args"]) for c in message.invalid_tool_calls]
    wire = message.additional_kwargs.get("tool_calls")
    if isinstance(wire, list) and all(isinstance(w, dict) and isinstance(w.get("function"), dict) for w in wire):
        sent = [(w.get("id"), w["function"].get("name") or "", w["function"].get("arguments")) for w in wire]
        if sorted(str(s[0]) for s in sent) == sorted(str(p[0]) for p in parsed):  # the same calls: keep the raw text
            return sent
    return parsed


def _ai_message(reply: Reply) -> AIMessage:
    """A logged reply as the AIMessage a chat model would give (tool calls parsed as langchain-openai
    parses them, the raw argument text kept)."""
    wire = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls]
    valid, invalid = [], []
    for w in wire:
        try:
            valid.append(parse_tool_call(w, return_id=True))
        except Exception as exc:  # noqa: BLE001 - OutputParserException and kin: as langchain-openai does
            invalid.append(make_invalid_tool_call(w, str(exc)))
    model = reply.raw.get("model") if isinstance(reply.raw, dict) else None
    u = reply.usage
    usage = None if u is None else {"input_tokens": u.prompt_tokens or 0, "output_tokens": u.completion_tokens or 0,
                                    "total_tokens": (u.prompt_tokens or 0) + (u.completion_tokens or 0)}
    return AIMessage(content=reply.content or "", tool_calls=valid, invalid_tool_calls=invalid,
                     additional_kwargs={"tool_calls": wire} if wire else {}, usage_metadata=usage,
                     response_metadata={"finish_reason": reply.finish_reason, "model_name": model})


class _ScriptedChatModel(GenericFakeChatModel):
    """LangChain's GenericFakeChatModel, taking tools (`bind_tools` gives the model itself)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> _ScriptedChatModel:  # type: ignore[override]
        return self


def scripted_model(replies: Iterable[AIMessage | str]) -> GenericFakeChatModel:
    """A chat model `create_agent` can run that gives `replies` in order (a str: an answer):
    LangChain's GenericFakeChatModel, taking tools."""
    return _ScriptedChatModel(messages=iter(replies))


def recorded_model(log: str | Path) -> GenericFakeChatModel:
    """A chat model giving a fenced run's recorded replies again, in order: the agent, run again
    with it and the same fence, replays the run (its new log is the recorded one, but for timings and
    the run id). Past the recording it raises RuntimeError."""
    replies = [e.reply() for e in read_log(log).events if isinstance(e, ReplyLine)]

    def served() -> Iterator[AIMessage]:
        yield from (_ai_message(r) for r in replies)
        raise RuntimeError(f"{log}: the recording has no more replies ({len(replies)} recorded)")

    return scripted_model(served())


# -- the middleware --------------------------------------------------------------------------------
class _Run:
    """One invocation's fenced run, the structured-output tools whose call is the answer, and the
    nudges given so far (each after the message it followed: every later request has them there)."""

    __slots__ = ("fenced", "outputs", "notes")

    def __init__(self, fenced: FencedRun, outputs: frozenset[str]) -> None:
        self.fenced, self.outputs = fenced, outputs
        self.notes: dict[str | None, list[HumanMessage]] = {}

    def bounded(self, request: ModelRequest[Any], r: Request, note: str | None) -> ModelRequest[Any]:
        """The request with the fence's bound on `max_tokens` (the smaller of it and the agent's own)
        and the nudges (Policy(nudge=True)): a new one after the turn's results."""
        changes: dict[str, Any] = {}
        if r.max_tokens is not None:
            settings = dict(request.model_settings)
            asked = settings.get("max_tokens", getattr(request.model, "max_tokens", None))
            settings["max_tokens"] = min(asked, r.max_tokens) if isinstance(asked, int) else r.max_tokens
            changes["model_settings"] = settings
        if note is not None:
            self.notes.setdefault(request.messages[-1].id if request.messages else None, []).append(HumanMessage(note))
        if self.notes:
            messages = list(self.notes.get(None, ()))
            for m in request.messages:
                messages.append(m)
                messages.extend(self.notes.get(m.id, ()))
            changes["messages"] = messages
        return request.override(**changes) if changes else request


class FenceMiddleware(Fenced, AgentMiddleware[FenceState, Any, Any]):
    """loopfence's fence as a LangChain agent middleware: `create_agent(..., middleware=[FenceMiddleware(...)])`,
    first in the list (the outermost: a retry middleware inside it retries within one fenced request).
    Takes a `Fence`, or `Fence`'s keyword arguments. `result`/`results`: the runs' RunResults."""

    state_schema = FenceState

    def __init__(self, fence: Fence | None = None, /, **options: Any) -> None:
        AgentMiddleware.__init__(self)
        Fenced.__init__(self, fence, **options)
        self._runs: dict[str, _Run] = {}  # by the invocation's name in its graph state
        self._tools: dict[int, tuple[BaseTool, Tool]] = {}
        self._lock = threading.Lock()


    # -- an invocation begins and ends ---------------------------------------------------------------
    def before_agent(self, state: FenceState, runtime: Any) -> dict[str, Any]:
        with self._lock:  # runs that ended by an exception (after_agent never came) are let go here
            for key in [k for k, r in self._runs.items() if r.fenced.finished]:
                del self._runs[key]
        return {_KEY: uuid.uuid4().hex}

    async def abefore_agent(self, state: FenceState, runtime: Any) -> dict[str, Any]:
        return self.before_agent(state, runtime)

    def after_agent(self, state: FenceState, runtime: Any) -> None:
        run = self._runs.pop(state.get(_KEY, ""), None)
        if run is None:
            return
        fenced = run.fenced
        if fenced.result is not None:  # it stopped before the end: a stop something caught on the way
            raise fenced.stop_error(fenced.result.stop, fenced.result)
        fenced.finish(_call_limit(fenced, state))  # the answer (or, with none, empty_answer)

    async def aafter_agent(self, state: FenceState, runtime: Any) -> None:
        self.after_agent(state, runtime)

    # -- a model request -----------------------------------------------------------------------------
    def wrap_model_call(self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Any]) -> Any:
        run = self._run(request)
        try:
            return run.fenced.model_request_sync(lambda r, note: handler(run.bounded(request, r, note)),
                                                 lambda response: to_reply(_answer_of(response), run.outputs))
        except KeyboardInterrupt:  # Ctrl-C while the request was out: the run is cancelled
            run.fenced.finish(cancelled=True)
            raise

    async def awrap_model_call(self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Any]) -> Any:
        run = self._run(request)

        async def send(r: Request, note: str | None) -> Any:
            return await handler(run.bounded(request, r, note))

        return await run.fenced.model_request(send, lambda response: to_reply(_answer_of(response), run.outputs))

    def _run(self, request: ModelRequest[Any]) -> _Run:
        key = request.state.get(_KEY, "")
        run = self._runs.get(key)
        if run is None:
            tools = [self._tool(t) for t in request.tools if isinstance(t, BaseTool)]
            fenced = self.fence.start(_task(request.messages), tools, framework=FRAMEWORK,
                                      version=versions("langchain", "langchain-core"), model=_model_name(request.model),
                                      system=request.system_prompt, stop_error=LangChainFenceStop)
            run = self._runs[key] = _Run(fenced, _output_tools(request.response_format))
        return run

    def _tool(self, tool: BaseTool) -> Tool:
        """The loopfence Tool for a LangChain tool (made once: its schema is read once per tool)."""
        held = self._tools.get(id(tool))
        if held is None or held[0] is not tool:
            held = self._tools[id(tool)] = (tool, self.fence.tool(tool.name, _parameters(tool), tool.description or "",
                                                                  _function(tool)))
        return held[1]

    # -- one tool call ---------------------------------------------------------------------------------
    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._runs.get(request.state.get(_KEY, "") if isinstance(request.state, dict) else "")
        if run is None:
            return handler(request)
        held = _Held(request)
        try:
            value = run.fenced.call_sync(held.call_id, lambda: held.keep(handler(request)))
        except BaseException as exc:  # noqa: BLE001 - sorted by _Held.raised
            return held.raised(run.fenced, exc)
        return held.answer(value)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._runs.get(request.state.get(_KEY, "") if isinstance(request.state, dict) else "")
        if run is None:
            return await handler(request)
        held = _Held(request)

        async def execute() -> Any:
            return held.keep(await handler(request))

        try:
            value = await run.fenced.call(held.call_id, execute)
        except BaseException as exc:  # noqa: BLE001 - sorted by _Held.raised
            return held.raised(run.fenced, exc)
        return held.answer(value)


class _Held:
    """One tool call: what LangChain's own call gave back (kept for LangChain) and its text (what
    loopfence logs, fingerprints and caches)."""

    __slots__ = ("call_id", "name", "message", "text")

    def __init__(self, request: Any) -> None:
        self.call_id: str = request.tool_call["id"]
        self.name: str = request.tool_call["name"]
        self.message: Any = None
        self.text: Any = None

    def keep(self, out: Any) -> Any:
        """In loopfence's executor: LangChain's answer; its text is the call's result (an error
        ToolMessage: the call's error result)."""
        self.message = out
        self.text = out.content if isinstance(out, ToolMessage) else out
        if isinstance(out, ToolMessage) and out.status == "error":
            raise LangChainToolError(out.text)
        return self.text

    def answer(self, value: Any) -> Any:
        """LangChain's own ToolMessage when its call ran; else the ToolMessage loopfence answers with
        (the cached result, a refusal)."""
        if self.message is not None and value is self.text:
            return self.message
        content = value if isinstance(value, str | list) else dumps(value)
        return ToolMessage(content=content, tool_call_id=self.call_id, name=self.name)

    def raised(self, fenced: FencedRun, exc: BaseException) -> Any:
        if isinstance(exc, LangChainToolError) and self.message is not None:
            return self.message  # the error result is logged; LangChain's own message goes on
        if isinstance(exc, FenceStop | GraphBubbleUp):  # a stop (written); an interrupt: the run goes on later
            raise exc
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            fenced.finish(cancelled=True)
        else:  # the tool's exception ends LangChain's run (its default ToolNode raises it)
            fenced.finish(error=exc)
        raise exc


# -- helpers ---------------------------------------------------------------------------------------
def _call_limit(fenced: FencedRun, state: FenceState) -> Stop | None:
    """A call-limit middleware ended the run (its own AIMessage last, where the model gave no
    answer): its `framework_limit` stop; else None (the run ends with the answer, or empty_answer)."""
    messages = state.get("messages") or []
    last = messages[-1] if messages else None
    found = _ENDED_AT.match(last.text) if fenced.answer is None and isinstance(last, AIMessage) else None
    if found is None:
        return None
    middleware = "ModelCallLimitMiddleware" if found.group(1) else "ToolCallLimitMiddleware"
    return framework_limit(FRAMEWORK, str(last.text), f"{middleware}.{found.group(2)}_limit", int(found.group(3)))


def _answer_of(response: Any) -> AIMessage:
    """The model's AIMessage in what the handler gave back (ModelResponse, AIMessage, or extended)."""
    if isinstance(response, ExtendedModelResponse):
        response = response.model_response
    if isinstance(response, AIMessage):
        return response
    if isinstance(response, ModelResponse):
        for message in response.result:
            if isinstance(message, AIMessage):
                return message
    raise TypeError(f"the model call gave no AIMessage: {type(response).__name__}")


_SCHEMAS: dict[Hashable, dict[str, Any]] = {}
_MAX_CACHED = 1024


def _parameters(tool: BaseTool) -> dict[str, Any]:
    """The JSON schema of the tool's arguments, as LangChain sends it to the model: made once per
    kind of argument model (a tool made afresh for every run, from the same function, has a pydantic
    class of its own, the same every time: its schema costs ~1 ms to make)."""
    key = _schema_key(tool)
    params = _SCHEMAS.get(key) if key is not None else None
    if params is None:
        made = convert_to_openai_tool(tool)["function"].get("parameters")
        params = made if isinstance(made, dict) else {"type": "object", "properties": {}}
        if key is not None:
            if len(_SCHEMAS) >= _MAX_CACHED:
                _SCHEMAS.clear()
            _SCHEMAS[key] = params
    return copy.deepcopy(params)


def _schema_key(tool: BaseTool) -> Hashable | None:
    """What LangChain makes the schema of: the tool's type, name and description, and its pydantic
    argument model's names, doc, config and fields (their annotations, defaults, descriptions);
    None where the arguments are not a pydantic model, or not hashable."""
    model = tool.args_schema
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    key = (type(tool), tool.name, tool.description, model.__module__, model.__qualname__, model.__doc__,
           tuple(b.__qualname__ for b in model.__mro__[1:]), repr(model.model_config),
           tuple((name, f.annotation, repr(f)) for name, f in model.model_fields.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _function(tool: BaseTool) -> Callable[..., Any] | None:
    """The plain Python function behind a tool (`@tool`, a function given to create_agent), or None."""
    fn = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    return fn if callable(fn) else None


def _output_tools(response_format: Any) -> frozenset[str]:
    """The structured-output tools (ToolStrategy) whose call is the run's answer."""
    if isinstance(response_format, AutoStrategy):
        response_format = ToolStrategy(response_format.schema)
    if isinstance(response_format, ToolStrategy):
        return frozenset(spec.name for spec in response_format.schema_specs)
    return frozenset()


def _task(messages: list[AnyMessage]) -> str:
    """The run's task: the text of the last human message before the first request."""
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            return str(m.text)
    return next((str(m.text) for m in reversed(messages) if isinstance(m, BaseMessage)), "")


def _model_name(model: Any) -> str | None:
    name = getattr(model, "model_name", None) or getattr(model, "model", None)
    return name if isinstance(name, str) else None
