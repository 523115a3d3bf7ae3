"""Tools: the registry, the executor and the built-ins."""

from ._builtin import workspace_tools
from ._executor import Executor, ResultCache, ToolResult, error_result
from ._registry import ArgumentError, Registry, Tool, ToolKind, tool

__all__ = ["ArgumentError", "Executor", "Registry", "ResultCache", "Tool", "ToolKind", "ToolResult",
           "error_result", "tool", "workspace_tools"]
