"""loopfence: a fenced LLM tool-calling loop that always ends for a named reason.

    from loopfence import run, Limits, ScriptedModel, tool
    result = run("Read app/config.py", model=ScriptedModel([...]), tools=[...])
    result.stop.reason, result.verdict, result.ledger
"""

from ._guards import Guard
from ._limits import Ledger, LedgerSnapshot, Limits, Policy
from ._loop import run
from ._messages import Reply, Request, ToolCall, Usage
from ._stops import RunResult, Stop, StopReason, Verdict
from .models import Model, ScriptedModel
from .runlog import RunLog
from .tools import Registry, Tool, ToolKind, ToolResult, tool, workspace_tools

__all__ = [
    "Guard", "Ledger", "LedgerSnapshot", "Limits", "Model", "Policy", "Registry", "Reply", "Request",
    "RunLog", "RunResult", "ScriptedModel", "Stop", "StopReason", "Tool", "ToolCall", "ToolKind",
    "ToolResult", "Usage", "Verdict", "run", "tool", "workspace_tools",
]
__version__ = "0.1.0"
