"""`--tools module:attr` and `--guard module:attr`: custom Python tools and guards for a command.

For `--tools`, `attr` (dotted names allowed) is a Tool, a plain function (made a tool with `tool(fn)`:
its docstring and type hints are its schema, kind side_effect), or a list/tuple of those. For
`--guard`, it is a `Guard` subclass (made fresh, with no arguments, for each use) or a function
returning a fresh guard. The current folder is importable, as with `python -m`.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from collections.abc import Callable

from .._guards import Guard
from ..tools._registry import Tool, tool
from ._common import UsageError

__all__ = ["load_tools", "load_guards", "add_guard_flag"]


def add_guard_flag(p: Any) -> None:
    """`--guard MODULE:NAME` (reconcile, replay, resume): a custom guard the run had."""
    p.add_argument("--guard", metavar="MODULE:NAME", action="append", default=[],
                   help="a custom guard the run had (a Guard subclass, made fresh for each use), e.g. "
                        "myguards:DeleteTwice; repeatable")


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


def load_guards(specs: list[str] | None) -> list[Callable[[], Guard]]:
    """`--guard module:Name` flags: a maker of fresh guards for each (a replay or a check needs its own)."""
    out: list[Callable[[], Guard]] = []
    for spec in specs or []:
        obj = _attribute("--guard", spec, "myguards:DeleteTwice")
        try:
            made = obj() if callable(obj) else None
        except Exception as exc:  # noqa: BLE001 - whatever the constructor raised, one line
            raise UsageError(f"--guard {spec}: making one raised {type(exc).__name__}: {exc}") from None
        if not isinstance(made, Guard):
            raise UsageError(f"--guard {spec}: expected a Guard subclass (or a function returning a guard), got "
                             f"{type(obj).__name__ if not callable(obj) else type(made).__name__}")
        out.append(obj)
    return out


def _attribute(flag: str, spec: str, example: str) -> Any:
    """What `module:attr` names, the module imported from the current folder too."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{flag} expects module:attr (e.g. {example}), got {spec!r}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised, one line
        raise UsageError(f"{flag} {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{flag} {spec}: {module_name} has no attribute {attr!r}") from None
    return obj


def _resolve(spec: str) -> list[Tool]:
    obj = _attribute("--tools", spec, "mytools:TOOLS")
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
