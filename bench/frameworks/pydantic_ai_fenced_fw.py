"""pydantic-ai with loopfence's fence as a capability (loopfence.integrations.pydantic_ai): the same
Agent, FunctionModel and tools as pydantic_ai_fw, plus `capabilities=[FenceCapability(...)]`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.usage import UsageLimits

from loopfence import Limits
from loopfence.integrations import FenceStop
from loopfence.integrations.pydantic_ai import FenceCapability

from ..common import Outcome, Script, Source, Workspace, describe_exception
from .loopfence_fw import UNBOUNDED
from .pydantic_ai_fw import _model
from .pydantic_ai_fw import version as version  # noqa: PLC0414 - the framework's version

NAME = "pydantic-ai + loopfence"
DEFAULTS = "Agent() defaults plus FenceCapability(kinds=...) with loopfence's default Limits; the run log " \
    "written to a real file"


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Callable[[], Outcome]:
    """Build the agent now; the returned call runs it (this is what the overhead section times)."""
    source = Source(script, cap)
    fence = FenceCapability(kinds=script.kinds, limits=UNBOUNDED if unbounded else Limits(),
                            log=str(ws.root / "loopfence-run.jsonl"))
    agent: Agent[None, str] = Agent(_model(source), tools=list(ws.tools.values()), capabilities=[fence])
    kwargs: dict[str, Any] = {"usage_limits": UsageLimits(request_limit=None)} if unbounded else {}

    def go() -> Outcome:
        try:
            result = agent.run_sync("Do the task.", **kwargs)
        except FenceStop as stop:
            return Outcome(source.calls, ws.executions, f"{stop.reason} (FenceStop)")
        except Exception as exc:  # noqa: BLE001 - how it ended is the measurement
            return Outcome(source.calls, ws.executions, "cap" if source.capped else describe_exception(exc))
        return Outcome(source.calls, ws.executions, "final answer", result.output)

    return go


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
