"""Imports flow one way (docs/ARCHITECTURE.md, "Layers"): nothing below imports what is above it.

Every module under src/loopfence is parsed with `ast`; every import it names counts, at module level
or inside a function (a lazy import that goes the wrong way is still a wrong-way import), and so does
`import_module("loopfence....")` with a literal name. Each module maps to a layer by its longest
matching name in LAYERS; a module importing from a higher layer fails, naming module, line and import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "loopfence"

# Lowest first. A module belongs to the layer of the longest entry that is its name or a package above it.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["_aio", "_json", "_keywords", "_stops", "_limits", "_messages", "_printable", "_tokens", "_repeats",
              "_prices", "_conversation"]),
    ("contract/tools/models/log", ["_contract", "_answer", "_compact", "tools", "models", "_log", "mcp", "_hooks"]),
    ("state/guards", ["_state", "_guards", "_gate"]),
    ("loop", ["_loop", "_setup", "_steps", "_stream"]),
    ("drivers", ["_drivers", "_batch", "_agent", "integrations", "proxy"]),
    ("observers", ["otel", "_report"]),
    ("entry", ["", "__main__", "cli", "_commands", "drill", "testing", "runlog"]),
]


def layer_of(module: str) -> int:
    rel = module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else ""
    best, best_len = None, -1
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if (rel == name or rel.startswith(name + ".") or name == "") and len(name) > best_len:
                best, best_len = index, len(name)
    if best is None or (best_len == 0 and rel):
        raise LookupError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py "
                          "and docs/ARCHITECTURE.md")
    return best


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    imported: str
    statement: str

    def __str__(self) -> str:
        return (f"{self.module}:{self.line}: `{self.statement}` imports {self.imported} "
                f"({LAYERS[layer_of(self.imported)][0]}) from below it "
                f"({LAYERS[layer_of(self.module)][0]})")


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[tuple[int, str, str]]:
    """(line, imported module, statement text) for every loopfence import in `source`."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            # `from .x import y`: y may itself be a module (`from . import _drivers`).
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module"):
            targets = [node.args[0].value]
        else:
            continue
        text = ast.get_source_segment(source, node) or ""
        for target in dict.fromkeys(targets):
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                found.append((node.lineno, target, " ".join(text.split())))
    return found


def check_source(module: str, source: str, is_package: bool = False,
                 known: set[str] | None = None) -> list[Violation]:
    """The wrong-way imports in one module's source."""
    mine = layer_of(module)
    bad = []
    for line, imported, text in imports_of(module, source, is_package, known or set()):
        if layer_of(imported) > mine:
            bad.append(Violation(module, line, imported, text))
    return bad


def tree_modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def test_every_module_has_a_layer() -> None:
    for module in tree_modules():
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    modules = tree_modules()
    bad = [v for m, (path, pkg) in modules.items()
           for v in check_source(m, path.read_text(encoding="utf-8"), pkg, set(modules))]
    assert not bad, "wrong-way imports:\n" + "\n".join(map(str, bad))


@pytest.mark.parametrize("module, source, line", [
    ("loopfence._log._writer", "import os\nfrom .._loop import drive\n", 2),
    ("loopfence._guards", "def f():\n    from ._loop import drive\n    return drive\n", 2),
    ("loopfence._stops", "import loopfence._drivers._replay\n", 1),
    # the lazy facade the log package once had: an import inside __getattr__ is still an import
    ("loopfence._log", "def __getattr__(name):\n    from loopfence._drivers import replay\n", 2),
    ("loopfence.tools._executor", "from importlib import import_module\n"
                                  "x = import_module('loopfence._state')\n", 2),
])
def test_checker_flags_a_wrong_way_import(module: str, source: str, line: int) -> None:
    [violation] = check_source(module, source)
    assert (violation.module, violation.line) == (module, line)
    assert layer_of(violation.imported) > layer_of(module)
    assert "drive" in str(violation) or "loopfence." in str(violation)


def test_checker_allows_downward_imports() -> None:
    assert check_source("loopfence._drivers._replay", "from .._loop import drive\n") == []
    assert check_source("loopfence._loop", "from ._log._writer import RunLog\n") == []


def test_layers_are_written_down() -> None:
    doc = (SRC.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for name, _ in LAYERS:
        assert name in doc, f"layer {name!r} is not written down in docs/ARCHITECTURE.md"
