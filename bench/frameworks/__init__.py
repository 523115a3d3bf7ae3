"""One adapter per framework. Each module has NAME, DEFAULTS (what its default fence is), version(),
and run_script(script, ws, *, cap, unbounded=False) -> Outcome.

`unbounded=True` lifts the framework's step limits (overhead runs only); everything else is default.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["ALL", "load", "available"]

ALL = ["loopfence", "pydantic_ai", "agents_sdk", "langchain", "smolagents"]


def load(name: str) -> ModuleType:
    return importlib.import_module(f"bench.frameworks.{name}_fw")


def available(names: list[str] | None = None) -> dict[str, ModuleType | str]:
    """Adapter module by name, or the reason it cannot run here (peer not installed)."""
    out: dict[str, ModuleType | str] = {}
    for name in names or ALL:
        try:
            out[name] = load(name)
        except ImportError as exc:
            out[name] = f"not installed ({exc.name or exc})"
    return out
