"""The public surface is small and explicit; importing the package has no side effects."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import loopfence


def test_all_names_exist_and_are_sorted_unique():
    assert len(set(loopfence.__all__)) == len(loopfence.__all__)
    for name in loopfence.__all__:
        assert hasattr(loopfence, name), name


def test_private_modules_declare_all():
    missing = []
    for mod in pkgutil.walk_packages(loopfence.__path__, "loopfence."):
        leaf = mod.name.rsplit(".", 1)[-1]
        if leaf.startswith("_") and not leaf.startswith("__") and leaf not in ("_commands",):
            m = importlib.import_module(mod.name)
            if not hasattr(m, "__all__"):
                missing.append(mod.name)
    assert not missing, missing


def test_import_is_light():
    code = ("import sys, loopfence; heavy = [m for m in ('rich', 'httpx', 'llama_cpp', 'hypothesis') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
