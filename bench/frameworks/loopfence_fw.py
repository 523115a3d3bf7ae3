"""loopfence with its default Limits, guards and a run log, driven by a Model that serves the script."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncio
import functools

import loopfence
from loopfence import Limits, Policy, Reply, Request, tool
from loopfence import arun as lf_arun
from loopfence import run as lf_run
from loopfence.testing import calls_reply, text_reply, tool_call

from ..common import Outcome, Script, Source, Workspace, calls_of, final_text

NAME = "loopfence"
DEFAULTS = "Limits() defaults: max_steps=12, max_tool_calls=24, max_repeats=3 (counted since the last " \
    "side effect), max_identical_results=5, max_cycle_repeats=3, no_progress on; fail closed on bad calls"
UNBOUNDED = Limits(max_steps=None, max_tool_calls=None, max_prompt_tokens=None,
                   max_completion_tokens=None)


def fence_options(script: Script, ws: Workspace, unbounded: bool) -> dict[str, Any]:
    """What the fenced adapters (*_fenced_fw) give their framework's fence: the script's tool kinds,
    default Limits (UNBOUNDED for overhead runs) and a run log in a real file."""
    return {"kinds": script.kinds, "limits": UNBOUNDED if unbounded else Limits(),
            "log": str(ws.root / "loopfence-run.jsonl")}


def version() -> str:
    return loopfence.__version__


class SourceModel:
    """The loopfence Model protocol over a script: chat.completions objects parsed like a real reply."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def complete(self, request: Request) -> Reply:
        turn = self.source.next()
        text = final_text(turn)
        if text is not None:
            return Reply.from_response(text_reply(text))
        calls = [tool_call(name, raw, id=f"call_{self.source.calls}_{j}")
                 for j, (name, raw) in enumerate(calls_of(turn))]
        return Reply.from_response(calls_reply(*calls))

    async def acomplete(self, request: Request) -> Reply:  # as ScriptedModel: no worker thread
        return self.complete(request)

    def describe(self) -> dict[str, Any]:
        return {"kind": "bench-script", "script": self.source.script.name}


class SyncSourceModel(SourceModel):
    """The same with only a sync `complete` (a diagnostic): it runs on a worker thread each step."""

    acomplete = None  # type: ignore[assignment]


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False,
            inline_tools: bool = False, sync_model: bool = False, async_tools: bool = False,
            entry: str = "run", nudge: bool = False) -> Callable[[], Outcome]:
    """Build the tools now; the returned call runs the loop (this is what the overhead section times).

    Options: entry "arun": `asyncio.run(arun(...))` instead of `run(...)`; async_tools: each tool
    is an `async def` (what an asyncio program hands to arun()). Diagnostics: inline_tools: the
    tools run with isolation="inline" (no timeout); sync_model: the model offers only a sync
    `complete`. nudge: Policy(nudge=True), one message before the first repetition stop (waste's
    extra row).
    """
    source = Source(script, cap)
    isolation = "inline" if inline_tools else None
    tools = [tool(_as_async(fn) if async_tools else fn, kind=script.kinds.get(name, "side_effect"),
                  isolation=isolation) for name, fn in ws.tools.items()]
    limits = UNBOUNDED if unbounded else Limits()
    model = (SyncSourceModel if sync_model else SourceModel)(source)

    def go() -> Outcome:
        args = dict(model=model, tools=tools, limits=limits, policy=Policy(nudge=nudge),
                    log=ws.root / "loopfence-run.jsonl")  # a real file, flushed per event
        result = asyncio.run(lf_arun("Do the task.", **args)) if entry == "arun" else lf_run("Do the task.", **args)
        ended = "cap" if source.capped else f"{result.stop.reason} ({result.verdict})"
        return Outcome(source.calls, ws.executions, ended, result.final_answer)

    return go


def _as_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same tool as an `async def` (same name, signature and schema)."""

    @functools.wraps(fn)
    async def afn(**kwargs: Any) -> Any:
        return fn(**kwargs)

    return afn


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False,
               nudge: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded, nudge=nudge)()
