"""`--tools module:attr`: custom Python tools for a command.

`attr` (dotted names allowed) is a Tool, a plain function (made a tool with `tool(fn)`: its
docstring and type hints are its schema, kind side_effect), or a list/tuple of those. The current
folder is importable, as with `python -m`.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ..tools._registry import Tool, tool
from ._common import UsageError

__all__ = ["load_tools"]


def load_tools(specs: list[str] | None) -> list[Tool]:
    out: list[Tool] = []
    seen: dict[str, str] = {}
    for spec in specs or []:
        for t in _resolve(spec):
            if t.name in seen:
                raise UsageError(f"--tools {spec}: a tool named {t.name!r} also comes from {seen[t.name]}")
            seen[t.name] = spec
            out.append(t)
    return out


def _resolve(spec: str) -> list[Tool]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--tools expects module:attr (e.g. mytools:TOOLS), got {spec!r}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised, one line
        raise UsageError(f"--tools {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"--tools {spec}: {module_name} has no attribute {attr!r}") from None
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    tools = []
    for item in items:
        if isinstance(item, Tool):
            tools.append(item)
        elif callable(item):
            try:
                tools.append(tool(item))
            except Exception as exc:  # noqa: BLE001
                raise UsageError(f"--tools {spec}: {getattr(item, '__name__', item)!r} is not a usable tool: "
                                 f"{exc}") from None
        else:
            raise UsageError(f"--tools {spec}: expected a Tool, a function or a list of them, got "
                             f"{type(item).__name__}")
    if not tools:
        raise UsageError(f"--tools {spec}: no tools in it")
    return tools
