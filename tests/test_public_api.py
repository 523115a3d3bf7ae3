"""The public surface is small and explicit; importing the package has no side effects."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

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
