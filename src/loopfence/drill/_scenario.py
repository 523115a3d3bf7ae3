"""The scenario model: one drill file, as typed values. Parsing and validation live in _load.py.

The file format is public and stable (see docs/DRILL.md); every field here maps to one key there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._limits import Limits, Policy
from .._stops import StopReason, Verdict
from ..tools._registry import ToolKind

__all__ = ["Scenario", "CannedTool", "Expect", "ExpectedCall", "ScenarioError", "ScenarioMcp", "reply_form",
           "HTTP_FORMS"]

HTTP_FORMS = ("fault", "chunks", "sse", "status")  # reply forms only the HTTP path can serve


class ScenarioError(ValueError):
    """A scenario file that cannot be used. The message names the file and the field."""

    def __init__(self, file: str | Path, field_path: str, problem: str) -> None:
        self.file = str(file)
        self.field = field_path
        self.problem = problem
        super().__init__(f"{file}: {field_path}: {problem}" if field_path else f"{file}: {problem}")


def reply_form(reply: dict[str, Any]) -> str:
    """'response' (a chat.completions object) or one of HTTP_FORMS."""
    return next((k for k in HTTP_FORMS if k in reply), "response")


@dataclass(frozen=True, slots=True)
class CannedTool:
    """A tool whose results come from the scenario file, in order; the last repeats."""

    name: str
    results: tuple[Any, ...]
    kind: ToolKind = ToolKind.SIDE_EFFECT
    parameters: dict[str, Any] | None = None  # None accepts any object
    untrusted: bool = False
    description: str = ""
    result_schema: dict[str, Any] | None = None  # a result that breaks it -> schema_mismatch


@dataclass(frozen=True, slots=True)
class ExpectedCall:
    """One executed call the scenario expects; arguments are compared after binding (defaults filled)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    ok: bool | None = None  # None: either


@dataclass(frozen=True, slots=True)
class Expect:
    """What the run must show. Unset fields (None / empty) are not checked."""

    stop: StopReason | None = None
    verdict: Verdict | None = None
    model_requests: int | None = None
    tool_calls: int | None = None
    tool_executions: int | None = None
    reused: int | None = None
    refused: int | None = None
    rejected: int | None = None
    max_tool_executions: int | None = None
    max_model_requests: int | None = None
    max_elapsed_s: float | None = None
    calls: tuple[ExpectedCall, ...] | None = None
    files_exist: tuple[str, ...] = ()
    log_contains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScenarioMcp:
    """MCP servers whose tools the scenario gets too (loopfence[mcp]): `[NAME=]COMMAND ARGS` (stdio,
    started in the scenario file's folder) or `[NAME=]http(s)://URL`; `trust`: True or the names of
    the servers whose annotations are trusted; `kinds`: a tool's kind by its name."""

    servers: tuple[str, ...]
    trust: bool | tuple[str, ...] = False
    kinds: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One drill scenario file, checked: the task, the scripted replies, the tools, the workspace
    files, the limits and policy, and what the run is expected to end with (docs/DRILL.md)."""

    name: str
    task: str
    replies: tuple[dict[str, Any], ...]
    file: str = "<memory>"
    description: str = ""
    system: str | None = None
    workspace: dict[str, str] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    canned_tools: tuple[CannedTool, ...] = ()
    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    expect: Expect | None = None
    mcp: ScenarioMcp | None = None

    @property
    def needs_http(self) -> bool:
        """True when the replies can only be served by a real HTTP endpoint (streams, raw SSE, errors)."""
        return self.stream or any(reply_form(r) != "response" for r in self.replies)
