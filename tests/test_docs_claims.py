"""What the docs claim matches the code: the log format version, and what loopfence cannot detect."""

from __future__ import annotations

import re
from pathlib import Path

from loopfence.runlog import VERSION

ROOT = Path(__file__).resolve().parents[1]
# "The header's `version` (now 3; ...", "its `version` says which format a log is in (now 3, ...",
# and the header table's row '| `format`, `version` | `"loopfence.runlog"`, 3 |'.
STATED = (re.compile(r"`version`[^()]{0,80}\(now (\d+)"), re.compile(r'`"loopfence\.runlog"`, (\d+)'))


def stated_versions(text: str) -> list[int]:
    return [int(m.group(1)) for pattern in STATED for m in pattern.finditer(text)]


def test_the_patterns_find_a_stale_number() -> None:
    assert stated_versions("The header's `version` (now 2; older logs read)") == [2]
    assert stated_versions('| `format`, `version` | `"loopfence.runlog"`, 7 |') == [7]


def test_readme_and_log_format_state_the_written_version() -> None:
    for name in ("README.md", "docs/log-format.md"):
        found = stated_versions((ROOT / name).read_text(encoding="utf-8"))
        assert found, f"{name} no longer states the log version: update STATED"
        assert set(found) == {VERSION}, f"{name} states log version {sorted(set(found))}, the code writes {VERSION}"


def test_no_other_page_states_another_version() -> None:
    for page in sorted((ROOT / "docs").rglob("*.md")):
        stale = set(stated_versions(page.read_text(encoding="utf-8"))) - {VERSION}
        assert not stale, f"{page.relative_to(ROOT)} states log version {sorted(stale)}, the code writes {VERSION}"


def test_llama_cpp_python_quirks_are_documented() -> None:
    """loopfence cannot detect these on the wire, so the docs must say them (issue 30, defect 10)."""
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    heading = "### llama-cpp-python's server: quirks loopfence cannot detect"
    assert heading in text
    section = text.split(heading, 1)[1].split("\n### ", 1)[0]
    for quirk in ("drops the tools", "chatml-function-calling", "result empty", "HTML-escapes", "stream with tools",
                  "overshoot `max_tokens`", "/props", "2.2x"):
        assert quirk in section, f"the llama-cpp-python section no longer names {quirk!r}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "#llama-cpp-pythons-server-quirks-loopfence-cannot-detect" in readme
