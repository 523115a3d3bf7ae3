"""OpenAI Agents SDK with loopfence's fence (loopfence.integrations.agents_sdk): the same Agent,
scripted Model and tools as agents_sdk_fw, run as `Runner.run_sync(fence.agent(agent), ...)`."""

from __future__ import annotations

from collections.abc import Callable

from loopfence.integrations.agents_sdk import AgentsFence

from ..common import Outcome, Script, Workspace
from . import agents_sdk_fw
from .agents_sdk_fw import version as version  # noqa: PLC0414 - the framework's version
from .loopfence_fw import fence_options

NAME = "openai-agents + loopfence"
DEFAULTS = "Runner.run_sync defaults (max_turns=10) plus AgentsFence(kinds=...).agent(agent) with loopfence's " \
    "default Limits; the run log written to a real file"


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Callable[[], Outcome]:
    """agents_sdk_fw's agent, run as fence.agent(agent)."""
    fence = AgentsFence(**fence_options(script, ws, unbounded))
    return agents_sdk_fw.prepare(script, ws, cap=cap, unbounded=unbounded, fence=fence)


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
