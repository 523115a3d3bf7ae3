"""Every public name has a docstring of its own (issue 20): each class and function in `loopfence.__all__`
and in the `__all__` of every public subpackage (the API reference is generated from them)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import pytest

import loopfence


def _public_modules() -> list[str]:
    return ["loopfence", *(f"loopfence.{m.name}" for m in pkgutil.iter_modules(loopfence.__path__)
                           if not m.name.startswith("_"))]


def _own_doc(obj: Any) -> str:
    """The docstring written for `obj`: not one inherited from a base class, and not the signature a
    dataclass writes when there is none."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        return "" if doc.startswith(f"{obj.__name__}(") else doc
    return obj.__doc__ or ""


def _documentable() -> list[tuple[str, Any]]:
    out = []
    for name in _public_modules():
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
                out.append((f"{name}.{attr}", obj))  # constants and type aliases cannot carry one
    return out


def test_the_walk_finds_the_public_names() -> None:
    found = dict(_documentable())
    assert {"loopfence.run", "loopfence.CheckedCall", "loopfence.StopReason", "loopfence.testing.FakeServer",
            "loopfence.runlog.reconcile", "loopfence.cli.cli"} <= set(found)
    assert _own_doc(type("Bare", (), {})) == ""  # a class without one is caught


@pytest.mark.parametrize("module", _public_modules())
def test_every_public_name_has_a_docstring(module: str) -> None:
    missing = [name for name, obj in _documentable() if name.rpartition(".")[0] == module and
               len(_own_doc(obj).strip()) < 10]
    assert not missing, f"public names without a docstring: {', '.join(missing)}"
