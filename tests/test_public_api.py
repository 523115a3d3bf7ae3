"""The public surface is small and explicit; importing the package has no side effects."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import loopfence


def test_all_names_exist_and_are_sorted_unique():
    assert len(set(loopfence.__all__)) == len(loopfence.__all__)
    assert loopfence.__all__ == sorted(loopfence.__all__)
    for name in loopfence.__all__:
        assert hasattr(loopfence, name), name


def _private(name: str) -> bool:
    """A private module, or any module inside a private package (loopfence._commands.run)."""
    return any(part.startswith("_") and not part.startswith("__") for part in name.split(".")[1:])


def test_private_modules_declare_all():
    missing, checked = [], []
    for mod in pkgutil.walk_packages(loopfence.__path__, "loopfence."):
        if _private(mod.name):
            checked.append(mod.name)
            m = importlib.import_module(mod.name)
            if not hasattr(m, "__all__"):
                missing.append(mod.name)
    assert not missing, missing
    assert {"loopfence._commands", "loopfence._commands.run", "loopfence.tools._process"} <= set(checked)


def test_private_modules_all_names_exist():
    for mod in pkgutil.walk_packages(loopfence.__path__, "loopfence."):
        if _private(mod.name):
            m = importlib.import_module(mod.name)
            for name in getattr(m, "__all__", ()):
                assert hasattr(m, name), f"{mod.name}.__all__ names {name!r}, which it lacks"


def test_import_is_light():
    code = ("import sys, loopfence; heavy = [m for m in ('rich', 'httpx', 'llama_cpp', 'hypothesis') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# The extras' packages (pyproject's optional-dependencies), blocked as on an install without them.
EXTRAS = ("opentelemetry", "llama_cpp", "mcp", "ray", "pydantic_ai", "agents", "langchain", "langchain_core", "redis")
BLOCK_EXTRAS = f"""
import importlib.abc, sys
class NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: no extras)", name=name)
        return None
sys.meta_path.insert(0, NoExtras())
"""


def test_star_import_works_without_the_extras():
    """`from loopfence import *` binds every name of `__all__` on an install without extras (issue 32):
    nothing in `__all__` needs OpenTelemetry, llama.cpp, MCP, Ray or a framework until it is used."""
    code = BLOCK_EXTRAS + ("from loopfence import *\nimport loopfence\n"
                           "missing = [n for n in loopfence.__all__ if n not in globals()]\n"
                           "blocked = [m for m in sys.modules if m.partition('.')[0] in "
                           f"{EXTRAS!r}]\nprint(missing, blocked)\n"
                           "try:\n    loopfence.instrument\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[] []"
    assert lines[1] == "loopfence.otel needs OpenTelemetry: pip install 'loopfence[otel]'"  # the blocker bites


def _imported_in_docs() -> dict[str, str]:
    """Each name the README's and the docs' examples import from `loopfence`, and where."""
    root = Path(__file__).resolve().parent.parent
    found = {}
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^\s*from loopfence import (\([^)]*\)|[^\n#]*)", text, re.M):
            for name in re.split(r"[\s,()]+", match.group(1)):
                if name and name != "as":
                    found.setdefault(name.split(" as ")[0], path.name)
    return found


def test_all_holds_what_the_docs_import_and_no_internals():
    """`__all__` is what users need: every name the docs import from `loopfence` is in it; the ring's own
    state (RunState, the mutable Ledger) is not, though it still imports from its module."""
    docs = _imported_in_docs()
    assert {"run", "ScriptedModel", "CheckedCall", "Guard"} <= set(docs)  # the scan finds the examples
    assert {name: where for name, where in docs.items() if name not in loopfence.__all__} == {}
    assert not {"RunState", "Ledger", "instrument"} & set(loopfence.__all__)
    from loopfence._limits import Ledger  # noqa: F401 - internals import from their module
    from loopfence._state import RunState  # noqa: F401
