"""A scenario's tools: built-ins and stubs by name, canned tools from the file, over one workspace."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, RootModel, model_validator

from ..tools import Registry, Tool, workspace_tools
from ..tools._jsonschema import validate_schema
from ._scenario import CannedTool, Scenario
from ._stubs import STUB_NAMES, stub_tools

__all__ = ["scenario_tools", "canned_tool", "schema_result_model", "make_workspace"]


def make_workspace(root: Path, scenario: Scenario) -> None:
    """Write the scenario's files and links into an empty folder."""
    for rel, text in scenario.workspace.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for rel, dest in scenario.symlinks.items():
        link = root / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dest)


def scenario_tools(scenario: Scenario, root: Path) -> Registry:
    """The scenario's tools over the workspace at `root`: the built-ins it names and the stub tools."""
    builtin = [n for n in scenario.tools if n not in STUB_NAMES]
    stubs = [n for n in scenario.tools if n in STUB_NAMES]
    made = (workspace_tools(root, names=builtin) if builtin else []) + \
        (stub_tools(root, stubs) if stubs else [])
    by_name = {t.name: t for t in made}
    ordered = [by_name[n] for n in scenario.tools if n in by_name]
    return Registry([*ordered, *(canned_tool(c) for c in scenario.canned_tools)])


def canned_tool(spec: CannedTool) -> Tool:
    """A tool that answers with the file's results in order; the last one repeats."""
    return Tool.from_schema(
        spec.name, _serve(spec.results), spec.parameters,
        description=spec.description or f"canned tool {spec.name} (results come from the drill file)",
        kind=spec.kind, untrusted=spec.untrusted,
        result_model=schema_result_model(spec.name, spec.result_schema) if spec.result_schema else None)


def _serve(results: tuple[Any, ...]) -> Callable[..., Any]:
    lock = threading.Lock()
    served = [0]

    def fn(**_arguments: Any) -> Any:
        with lock:
            i = min(served[0], len(results) - 1)
            served[0] += 1
        return copy.deepcopy(results[i])

    return fn


def schema_result_model(tool_name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A result model that checks a value against a JSON schema (the tools' schema subset)."""

    class SchemaResult(RootModel[Any]):
        @model_validator(mode="after")
        def _fits(self) -> SchemaResult:
            problem = validate_schema(self.root, schema, "result")
            if problem:
                raise ValueError(problem)
            return self

    SchemaResult.__name__ = SchemaResult.__qualname__ = f"{tool_name}_result_schema"
    return SchemaResult
