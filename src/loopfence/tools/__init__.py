"""Tools: the registry, the executor and the built-ins."""

from ._builtin import workspace_tools
from ._executor import Executor, ResultCache, ToolOutput, ToolResult, error_result, refusal
from ._registry import ArgumentError, Registry, Tool, ToolKind, tool

__all__ = ["ArgumentError", "Executor", "Registry", "ResultCache", "Tool", "ToolKind", "ToolOutput", "ToolResult",
           "error_result", "refusal", "tool", "workspace_tools"]
