"""Every ```python block of docs/*.md and README.md runs, so the examples cannot rot.

Each block runs on its own, as a reader would paste it: a fresh Python process (a block that calls
`loopfence.instrument()` leaves nothing behind in this session), in a fresh folder holding what the
docs say the examples start from: `app/config.py` and the files of docs/examples/ (`replies.jsonl`,
...), and docs/examples/ itself, as in the repo's root (the README runs from there). The script is padded so a traceback's line numbers are the Markdown file's.

An HTML comment on the line before a block's fence (blank lines allowed between) changes that:

  <!-- no-test: WHY -->             the block is not run (only where it truly cannot: say why)
  <!-- requires: MOD1 MOD2 -->      skipped unless these modules are installed (`llama_cpp`: the
                                    embedded model, marked local_model like the other tests of it)
  <!-- file: NAME -->               not run on its own (only compiled): written as NAME into the
                                    folder of every later block of the same page (a server script
                                    the next example starts)
  <!-- pytest -->                   a test module: run by pytest (the plugin's fixtures), not python
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
CONFIG_PY = 'import os\n\nDEBUG = False\nPORT = int(os.environ.get("PORT", "8000"))\n'
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*(no-test|requires|file|pytest)\s*(?::\s*(.*?))?\s*-->\s*$")
TIMEOUT_S = 240


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the first code line
    code: str
    directives: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # earlier `file:` blocks of the same page

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def sources() -> list[Path]:
    pages = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
    return [*pages, ROOT / "README.md"]


def python_blocks(path: Path) -> list[Block]:
    """The page's ```python blocks, with the directives on the lines before each fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    files: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        end = i + 1
        while end < len(lines) and not re.match(rf"^{re.escape(indent)}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        lang = info.split()[0].lower() if info else ""
        if lang in ("python", "py"):
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:end]]
            directives = _directives(lines, i)
            block = Block(path, i + 2, "\n".join(body) + "\n", directives, dict(files))
            if "file" in directives:
                files[directives["file"]] = block.code
            blocks.append(block)
        i = end + 1
    return blocks


def _directives(lines: list[str], fence_index: int) -> dict[str, str]:
    out: dict[str, str] = {}
    j = fence_index - 1
    while j >= 0 and (not lines[j].strip() or DIRECTIVE.match(lines[j])):
        m = DIRECTIVE.match(lines[j])
        if m:
            out[m.group(1)] = (m.group(2) or "").strip()
        j -= 1
    return out


ALL_BLOCKS = [b for page in sources() for b in python_blocks(page)]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


def _param(block: Block) -> object:
    marks = []
    needs = block.directives.get("requires", "").split()
    if "llama_cpp" in needs:
        marks.append(pytest.mark.local_model)
    return pytest.param(block, id=block.name, marks=marks)


def test_the_pages_have_examples() -> None:
    """The extractor finds what is there (a broken pattern would pass every page vacuously)."""
    by_page = {b.path.name for b in ALL_BLOCKS}
    assert {"README.md", "getting-started.md", "python-api.md", "testing.md", "fake-server.md"} <= by_page
    assert len(ALL_BLOCKS) >= 25


def test_skipped_blocks_say_why() -> None:
    for block in ALL_BLOCKS:
        if "no-test" in block.directives:
            assert block.directives["no-test"], f"{block.name}: <!-- no-test: WHY --> needs a reason"


@pytest.mark.parametrize("block", [_param(b) for b in ALL_BLOCKS])
def test_code_block_runs(block: Block, tmp_path: Path) -> None:
    if "no-test" in block.directives:
        pytest.skip(f"<!-- no-test: {block.directives['no-test']} -->")
    if "file" in block.directives:  # it runs as the later blocks' server or module; here: it compiles
        compile(block.code, block.name, "exec")
        return
    for module in block.directives.get("requires", "").split():
        if not installed(module):
            pytest.skip(f"needs {module} (<!-- requires: -->)")
    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    (work / "app" / "config.py").write_text(CONFIG_PY, encoding="utf-8")
    for example in EXAMPLES.iterdir():
        if example.is_file():
            shutil.copy(example, work / example.name)
    shutil.copytree(EXAMPLES, work / "docs" / "examples")  # laid out as the repo's root too (the README's paths)
    for name, text in block.files.items():
        (work / name).write_text(text, encoding="utf-8")
    if "pytest" in block.directives:
        script = work / f"test_{re.sub(r'[^a-z0-9]+', '_', block.path.stem.lower())}_{block.line}.py"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)]
    else:
        script = tmp_path / f"{block.path.name}.py"
        argv = [sys.executable, str(script)]
    script.write_text("\n" * (block.line - 1) + block.code, encoding="utf-8")  # tracebacks: the page's lines
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOOPFENCE_", "OPENAI_", "OTEL_")) and k != "PYTHONPATH"}
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, (f"{block.name}: the example failed (exit {proc.returncode})\n"
                                  f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
