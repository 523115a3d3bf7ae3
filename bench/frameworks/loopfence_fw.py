"""loopfence with its default Limits, guards and a run log, driven by a Model that serves the script."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import loopfence
from loopfence import Limits, Reply, Request, tool
from loopfence import run as lf_run
from loopfence.testing import calls_reply, text_reply, tool_call

from ..common import Outcome, Script, Source, Workspace, calls_of, final_text

NAME = "loopfence"
DEFAULTS = "Limits() defaults: max_steps=12, max_tool_calls=24, max_repeats=3 (counted since the last " \
    "side effect), max_identical_results=5, max_cycle_repeats=3, no_progress on; fail closed on bad calls"
UNBOUNDED = Limits(max_steps=None, max_tool_calls=None, max_prompt_tokens=None,
                   max_completion_tokens=None)


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

    def describe(self) -> dict[str, Any]:
        return {"kind": "bench-script", "script": self.source.script.name}


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False,
            inline_tools: bool = False) -> Callable[[], Outcome]:
    """Build the tools now; the returned call runs the loop (this is what the overhead section times).

    inline_tools (a diagnostic): no tool timeout and no wall clock, so no deadline is armed per call.
    """
    source = Source(script, cap)
    tools = [tool(fn, kind=script.kinds.get(name, "side_effect")) for name, fn in ws.tools.items()]
    limits = UNBOUNDED if unbounded else Limits()
    if inline_tools:
        limits = limits.replace(tool_timeout_s=None, max_wall_seconds=None)

    def go() -> Outcome:
        result = lf_run("Do the task.", model=SourceModel(source), tools=tools, limits=limits,
                        log=ws.root / "loopfence-run.jsonl")  # a real file, flushed per event
        ended = "cap" if source.capped else f"{result.stop.reason} ({result.verdict})"
        return Outcome(source.calls, ws.executions, ended, result.final_answer)

    return go


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
