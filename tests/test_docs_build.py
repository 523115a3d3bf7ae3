"""The documentation site builds in strict mode: a broken link, anchor or API reference fails here.

`make test` installs the `docs` extra, so this never skips there; it skips only where MkDocs is not
installed. The build runs the hook in docs/hooks/ (the commands' --help, the log schema, an example
log, and the checks that every command, fault and event kind is on its page).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
needs_mkdocs = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "mkdocstrings", "material")),
    reason="the docs extra is not installed (pip install -e '.[docs]'; make test installs it)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPFENCE_", "OPENAI_"))}
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    return out


def text_of(page: Path) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


@needs_mkdocs
def test_the_site_builds_strict(site: Path) -> None:
    for page in ("index", "getting-started", "python-api", "testing", "cli", "log-format", "DRILL",
                 "fake-server", "reference", "ARCHITECTURE"):
        assert (site / f"{page}.html").is_file(), page
    assert not (site / "hooks").exists()  # the build's own code is not published


@needs_mkdocs
def test_the_cli_page_holds_every_commands_current_help(site: Path) -> None:
    from loopfence._commands import COMMANDS

    text = text_of(site / "cli.html")
    for name in COMMANDS:
        assert f"usage: loopfence {name.replace('_', '-')} [-h]" in text, name


@needs_mkdocs
def test_generated_parts_are_on_their_pages(site: Path) -> None:
    log_page = text_of(site / "log-format.html")
    assert '"format":"loopfence.runlog"' in log_page and "Rain in Oslo" in log_page  # the example log
    assert "draft/2020-12/schema" in log_page  # loopfence schema events
    for page in ("log-format", "cli"):  # every marker was replaced
        assert not re.search(r"<!--\s*loopfence-(help|schema|example-log)", (site / f"{page}.html").read_text()), page
    assert "chatcmpl-1" in text_of(site / "fake-server.html")  # replies.jsonl, included at build time
    reference = text_of(site / "reference.html")
    for name in ("OpenAIModel", "LocalModel", "Limits", "Policy", "FakeServer", "mcp_tools", "instrument",
                 "abatch", "scripted_model", "replay_log"):
        assert name in reference, name


@needs_mkdocs
def test_a_page_missing_a_command_fails_the_build(tmp_path: Path) -> None:
    """The coverage check is real: drop one command's help marker and the strict build fails."""
    docs = tmp_path / "docs"
    (docs / "hooks").mkdir(parents=True)
    (docs / "hooks" / "loopfence_docs.py").write_text((ROOT / "docs/hooks/loopfence_docs.py").read_text())
    cli_md = (ROOT / "docs/cli.md").read_text(encoding="utf-8").replace("<!-- loopfence-help: resume -->", "")
    (docs / "cli.md").write_text(cli_md, encoding="utf-8")
    (docs / "index.md").write_text("# x\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nstrict: true\nhooks: [docs/hooks/loopfence_docs.py]\n"
                                         "exclude_docs: |\n  hooks/\n"
                                         "validation:\n  links:\n    not_found: info\n    anchors: info\n",
                                         encoding="utf-8")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "docs/cli.md lacks" in proc.stdout + proc.stderr and "resume" in proc.stdout + proc.stderr


@needs_mkdocs
def test_the_coverage_checks_see_a_missing_fault_event_or_field() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("loopfence_docs_hook", ROOT / "docs/hooks/loopfence_docs.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    faults_md = (ROOT / "docs/fake-server.md").read_text(encoding="utf-8")
    log_md = (ROOT / "docs/log-format.md").read_text(encoding="utf-8")
    check_faults, check_events = hook.COVERAGE["fake-server.md"][1], hook.COVERAGE["log-format.md"][1]
    assert check_faults(faults_md) == [] and check_events(log_md) == []
    assert check_faults(faults_md.replace("| `close` |", "| close |")) == ["close"]
    assert check_events(log_md.replace("### `retry`", "### retry")) == ["retry"]
    assert check_events(log_md.replace("| `violation` |", "| violation |")) == ["result.violation"]
