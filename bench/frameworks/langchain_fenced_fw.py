"""LangChain v1 with loopfence's fence as a middleware (loopfence.integrations.langchain): the same
create_agent, script model and tools as langchain_fw, plus `middleware=[FenceMiddleware(...)]`."""

from __future__ import annotations

from collections.abc import Callable

from loopfence.integrations.langchain import FenceMiddleware

from ..common import Outcome, Script, Workspace
from . import langchain_fw
from .langchain_fw import version as version  # noqa: PLC0414 - the framework's version
from .loopfence_fw import fence_options

NAME = "langchain + loopfence"
DEFAULTS = "create_agent defaults plus FenceMiddleware(kinds=...) with loopfence's default Limits; the run " \
    "log written to a real file"


def prepare(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Callable[[], Outcome]:
    """langchain_fw's create_agent with the fence added as a middleware."""
    fence = FenceMiddleware(**fence_options(script, ws, unbounded))
    return langchain_fw.prepare(script, ws, cap=cap, unbounded=unbounded, fence=fence)


def run_script(script: Script, ws: Workspace, *, cap: int, unbounded: bool = False) -> Outcome:
    return prepare(script, ws, cap=cap, unbounded=unbounded)()
