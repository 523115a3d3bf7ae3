"""The first page (issue 61, items 2 and 5): the README's Python quick start runs from the repo's
root as printed and its answer is true of the file it read; the docs read well as raw Markdown (no
include a reader of the file cannot see, every generated block announced in words); and user docs
hold no issue numbers, bench dates or instruction counts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "ARCHITECTURE.md")]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_the_readme_quick_start_runs_from_the_root_and_its_answer_is_true() -> None:
    quick = _python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))[0]
    assert "Agent(" in quick and "workspace_tools(" in quick, quick  # the quick start is the first block
    done = subprocess.run([sys.executable, "-c", quick], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, read = done.stdout.split("\n", 1)
    assert first.startswith("final_answer SHIP "), first
    answer = first.removeprefix("final_answer SHIP ")
    config = (ROOT / "docs" / "examples" / "app" / "config.py").read_text(encoding="utf-8")
    assert config in read  # the model was given the file itself (not missing_file)
    # each claim of the answer is true of that file
    assert "DEBUG = False" in answer and re.search(r"^DEBUG = False$", config, re.MULTILINE)
    assert "PORT from $PORT (default 8000)" in answer and 'os.environ.get("PORT", "8000")' in config


def test_no_page_includes_what_a_reader_of_the_file_cannot_see() -> None:
    for page in USER_DOCS:
        text = page.read_text(encoding="utf-8")
        assert "--8<--" not in text, f"{page.name}: an include shows as its marker on GitHub: copy the file in"


def test_inlined_files_are_the_files() -> None:
    copies = 0
    for page in USER_DOCS:
        text = page.read_text(encoding="utf-8")
        for name, body in re.findall(r"<!-- the file (docs/\S+): a test keeps this copy the same -->\n```\w*\n(.*?)```",
                                     text, re.DOTALL):
            copies += 1
            assert body == (ROOT / name).read_text(encoding="utf-8").rstrip("\n") + "\n", f"{page.name}: {name}"
    assert copies >= 3


def test_every_generated_help_block_is_announced_in_words() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    markers = re.findall(r"^(.*)\n\n<!-- loopfence-help(?:: ([a-z-]+))? -->$", text, re.MULTILINE)
    assert len(markers) >= 12
    for before, name in markers:
        assert before == f"`loopfence {name + ' ' if name else ''}--help` says:", (name, before)


def test_the_mcp_server_the_readme_runs_is_the_one_the_api_page_shows() -> None:
    page = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    shown = re.search(r"<!-- file: notes_server.py -->\n```python\n(.*?)```", page, re.DOTALL)
    assert shown is not None and shown.group(1) == (ROOT / "docs" / "examples" / "notes_server.py").read_text()
    assert "docs/examples/notes_server.py" in (ROOT / "README.md").read_text(encoding="utf-8")


STALE = [(re.compile(r"\b[Ii]ssues? #?\d+"), "an issue number"),
         (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date"),
         (re.compile(r"--instructions\b|\binstructions \(`"), "an instruction count")]


def test_user_docs_hold_no_issue_numbers_dates_or_instruction_counts() -> None:
    found = [f"{page.relative_to(ROOT)}:{n}: {what}: {line.strip()[:80]}"
             for page in USER_DOCS for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for pattern, what in STALE if pattern.search(line)]
    assert not found, "\n".join(found)
