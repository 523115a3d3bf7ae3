"""pydantic-ai with loopfence's fence as a capability (loopfence.integrations.pydantic_ai): the same
Agent, FunctionModel and tools as pydantic_ai_fw, plus `capabilities=[FenceCapability(...)]`."""

from __future__ import annotations

from collections.abc import Callable

from loopfence.integrations.pydantic_ai import FenceCapability

from ..common import Outcome, Script, Workspace
from . import pydantic_ai_fw
from .loopfence_fw import fence_options
from .pydantic_ai_fw import version as version  # noqa: PLC0414 - the framework's version

NAME = "pydantic-ai + loopfence"
DEFAULTS = "Agent() defaults plus FenceCapability(kinds=...) with loopfence's default Limits; the run log " \
    "written to a real file"


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Callable[[], Outcome]:
    """pydantic_ai_fw's agent with the fence added as a capability."""
    fence = FenceCapability(**fence_options(script, ws, unbounded))
    return pydantic_ai_fw.prepare(script, ws, cap=cap, unbounded=unbounded, fence=fence)


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
