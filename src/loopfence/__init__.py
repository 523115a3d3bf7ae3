"""loopfence: a fenced LLM tool-calling loop that always ends for a named reason.

    from loopfence import Agent, Limits, ScriptedModel, tool
    agent = Agent(model=ScriptedModel([...]), tools=[...], limits="coding")  # configured once
    result = agent.run("Read app/config.py")  # any number of tasks (run() takes the same keywords)
    result.stop.reason, result.verdict, result.ledger
    result = await arun(...)  # the core, on a running event loop (same arguments and result)
    async for event in stream(...): ...  # the run's typed events as they happen, ending with the stop
    batch("episodes.jsonl", model=..., out="runs/job")  # many runs, one results table (abatch: async)
"""

from typing import Any

from ._agent import Agent, arun, run, stream
from ._batch import abatch, batch
from ._compact import Compaction
from ._contract import CheckedCall
from ._gate import UntrustedGate, approve_all, deny_all
from ._guards import Guard, RunView
from ._limits import LedgerSnapshot, Limits, Policy
from ._log import RunLog
from ._messages import Reply, Request, ToolCall, Usage
from ._stops import RunResult, Stop, StopReason, Verdict
from ._stream import RunStream, TextDelta
from .mcp import mcp_tools  # tools from MCP servers (loopfence[mcp]); the SDK loads when a group opens
from .models import Model, ScriptedModel
from .tools import Registry, Tool, ToolKind, ToolResult, refusal, tool, workspace_tools

# What users need: what the docs' examples import, the types a custom model or guard is written with,
# and what a run returns. Internals (the ring's RunState, the mutable Ledger behind a guard's
# `s.ledger`) import from their modules. `loopfence.instrument` (loopfence[otel]) is left out so that
# `from loopfence import *` works on an install without extras (tests/test_public_api.py).
__all__ = [
    "Agent", "CheckedCall", "Compaction", "Guard", "LedgerSnapshot", "Limits", "LocalModel", "Model", "OpenAIModel",
    "Policy", "Registry", "Reply", "Request", "RunLog", "RunResult", "RunStream", "RunView", "ScriptedModel", "Stop",
    "StopReason", "TextDelta", "Tool", "ToolCall", "ToolKind", "ToolResult", "UntrustedGate", "Usage", "Verdict", "abatch",
    "approve_all", "arun", "batch", "deny_all", "mcp_tools", "refusal", "run", "stream", "tool", "workspace_tools",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The HTTP client and the embedded model load on first use (no httpx/llama_cpp at import)."""
    if name in ("OpenAIModel", "LocalModel"):
        from . import models

        return getattr(models, name)
    if name == "instrument":  # OpenTelemetry (loopfence[otel]) loads only when asked for: not in __all__
        from .otel import instrument

        return instrument
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
