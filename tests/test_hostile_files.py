"""Issue 12: hostile workspace files. HTML to text stays linear and bounded, the HTML sniff sees
pages saved under other names, hard links made before the run do not read through the jail,
written files never keep setuid/setgid bits, and a 3,000-deep folder does not break the
missing-file suggestions. Each run's log reconciles."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from loopfence import RunLog, ScriptedModel, StopReason, run
from loopfence.runlog import read_log, reconcile
from loopfence._drivers._rebuild import workspace_tools_of
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import Executor, Tool, ToolResult, workspace_tools
from loopfence.tools._html import MAX_HTML_CHARS, html_to_text, looks_like_html


def tools_for(ws: Path, **options: object) -> dict[str, Tool]:
    return {t.name: t for t in workspace_tools(ws, sandbox=False, **options)}  # type: ignore[arg-type]


def call(tools: dict[str, Tool], name: str, **args: object) -> ToolResult:
    t = tools[name]
    return Executor().execute(t, t.validate(args), 30)


def body(result: ToolResult) -> dict[str, object]:
    return json.loads(result.content)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


# ------------------------------------------------------------------ HTML to text
def _finishes(work: Any, limit_s: float = 60.0) -> bool:
    """Does `work()` end at all? A bound orders of magnitude past linear time, far under quadratic
    (the speed itself is a bench matter, not a test's)."""
    done = threading.Event()
    threading.Thread(target=lambda: (work(), done.set()), daemon=True).start()
    return done.wait(limit_s)



def test_a_200_kb_page_of_unclosed_tags_converts_in_linear_time(ws: Path) -> None:
    (ws / "page.html").write_text("<a" * 100_000)
    result = call(tools_for(ws), "read_file", path="page.html")  # the stdlib parser took 14.7 s for 80k
    assert result.ok and result.untrusted
    assert "200,000 characters of HTML" in result.content
    assert _finishes(lambda: html_to_text("<a" * 800_000))  # quadratic: hours; linear: milliseconds


@pytest.mark.parametrize("page", ["<div>" * 100_000, "<a href='x'>" * 50_000, "<" * 400_000,
                                  "<a " + "x=1 " * 100_000 + ">", "<!--" * 100_000, "<table><tr><td>" * 30_000])
def test_hostile_pages_convert_quickly(page: str) -> None:
    assert _finishes(lambda: html_to_text(page * 4).render())  # 4x the size: quadratic would not finish


def test_many_links_stay_linear_and_numbered() -> None:
    page = "".join(f"<a href='https://x.example/{i}'>l{i}</a> " for i in range(20_000))
    text = html_to_text(page)
    assert len(text.links) == 20_000 and "l19999 [20000]" in text.text


def test_a_page_over_the_cap_is_converted_in_part_and_says_so() -> None:
    page = "<p>" + "word " * (MAX_HTML_CHARS // 5 + 10) + "</p>"
    rendered = html_to_text(page).render()
    assert f"{len(page):,} characters of HTML (only the first {MAX_HTML_CHARS:,} were converted)" in rendered


def test_the_page_shape_is_kept_from_the_standard_library_version() -> None:
    page = html_to_text("<html><head><title> T &amp; U </title><style>x{}</style></head><body>"
                        "<h2>Head</h2><ul><li>one</li><li>two <a href='/r'>ref</a></li></ul><pre>a\n  b</pre>"
                        "<table><tr><td>c1</td><td>c2</td></tr></table><img alt='pic'>"
                        "<svg><title>not the title</title></svg><script>bad()</script></body></html>")
    assert page.title == "T & U" and page.links == ("/r",)
    assert page.text == "## Head\n\n- one\n- two ref [1]\n\na\nb\n\n| c1\n\n| c2\n\n[image: pic]"  # as before


# ------------------------------------------------------------------ the HTML sniff

HTML = {
    "bom": "\ufeff<!DOCTYPE html><html><body><p>hi</p></body></html>",
    "body fragment": "<body><p>hi</p><script>x()</script></body>",
    "head fragment": "<head><meta charset='utf-8'><title>t</title></head><p>hi</p>",
    "long comment": "<!--" + "c" * 3_000 + "-->\n<!doctype html><html><body><p>hi</p>",
    "whitespace": "\n\n  \t <HTML lang='en'><body><p>hi</p>",
    "xhtml": '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" '
             '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd">\n<html xmlns="http://www.w3.org/1999/xhtml">'
             "<body><p>hi</p></body></html>",
    "xhtml no doctype": '<?xml version="1.0"?>\n<!-- saved --><html xmlns="http://www.w3.org/1999/xhtml"><p>hi</p>',
    "prefixed xhtml": '<?xml version="1.0"?><h:html xmlns:h="x" xmlns="http://www.w3.org/1999/xhtml"><p>hi</p>',
}
NOT_HTML = {
    "markdown": "# Notes\n\nUse the <body> and <html> tags; <!DOCTYPE html> starts a page.\n",
    "readme with a centered header": '<p align="center"><img src="logo.png"></p>\n\n# Project\n',
    "inline tags": "<b>bold</b> is how you write bold\n",
    "python": "import os\nprint('<html>')\n",
    "xml": '<?xml version="1.0"?>\n<project><body>not html</body></project>',
    "svg": '<svg xmlns="http://www.w3.org/2000/svg"><title>t</title></svg>',
    "unterminated comment": "<!-- <html><body>",
    "a longer tag name": "<bodyguard>x</bodyguard>",
}


@pytest.mark.parametrize("name", list(HTML))
def test_pages_saved_under_other_names_are_html(ws: Path, name: str) -> None:
    assert looks_like_html("saved.txt", HTML[name])
    (ws / "saved.txt").write_text(HTML[name], encoding="utf-8")
    result = call(tools_for(ws), "read_file", path="saved.txt")
    assert result.untrusted and "hi" in result.content and "x()" not in result.content
    assert "characters of HTML" in result.content


@pytest.mark.parametrize("name", list(NOT_HTML))
def test_text_that_mentions_tags_is_not_html(ws: Path, name: str) -> None:
    assert not looks_like_html("notes.md", NOT_HTML[name])
    (ws / "notes.md").write_text(NOT_HTML[name], encoding="utf-8")
    result = call(tools_for(ws), "read_file", path="notes.md")
    assert not result.untrusted and result.content.startswith(NOT_HTML[name][:20])


# ------------------------------------------------------------------ hard links


@pytest.fixture
def linked(tmp_path: Path, ws: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    os.link(secret, ws / "notes.txt")  # made before the run: the jail sees a regular file
    return ws / "notes.txt"


def test_a_hard_link_to_a_file_outside_is_not_read(ws: Path, linked: Path) -> None:
    tools = tools_for(ws)
    got = body(call(tools, "read_file", path="notes.txt"))
    assert got["error"] == "hardlinked_file" and "SECRET" not in json.dumps(got)
    assert "notes.txt has 2 hard links" in str(got["message"])
    assert "allow_hardlinks=True" in str(got["message"]) and "--allow-hardlinks" in str(got["message"])
    patch = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-nope\n+x\n"
    got = body(call(tools, "apply_patch", patch=patch))
    assert got["error"] == "hardlinked_file" and "SECRET" not in json.dumps(got)


def test_allow_hardlinks_reads_them(ws: Path, linked: Path) -> None:
    result = call(tools_for(ws, allow_hardlinks=True), "read_file", path="notes.txt")
    assert result.ok and "TOP SECRET" in result.content


def test_a_run_refusing_a_hard_link_reconciles(tmp_path: Path, ws: Path, linked: Path) -> None:
    log = tmp_path / "run.jsonl"
    r = run("t", model=ScriptedModel([calls_reply(tool_call("read_file", path="notes.txt")), text_reply("ok")]),
            tools=workspace_tools(ws, sandbox=False), log=RunLog(log))
    assert r.stop.reason is StopReason.FINAL_ANSWER and reconcile(log).ok
    assert read_log(log).of("result")[0].record["error"] == "hardlinked_file"


def test_the_cli_flag_allows_them_and_resume_keeps_the_choice(tmp_path: Path, ws: Path, linked: Path) -> None:
    s = tmp_path / "s.jsonl"
    s.write_text(json.dumps(calls_reply(tool_call("read_file", path="notes.txt"))) + "\n"
                 + json.dumps(text_reply("ok")) + "\n")
    log = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "loopfence", "run", "t", "--script", str(s), "--log", str(log),
                        "--workspace", str(ws), "--allow-hardlinks", "--quiet"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    h = read_log(log).header
    assert h.record["allow_hardlinks"] is True and "TOP SECRET" in read_log(log).of("result")[0].record["content"]
    rebuilt = {t.name: t for t in workspace_tools_of(h, str(log))}
    assert call(rebuilt, "read_file", path="notes.txt").ok


# ------------------------------------------------------------------ setuid and setgid


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6755, 0o1755])
def test_written_files_never_keep_setuid_or_setgid(ws: Path, mode: int) -> None:
    target = ws / "tool"
    target.write_text("old\n")
    os.chmod(target, mode)
    assert body(call(tools_for(ws), "write_file", path="tool", content="#!/bin/sh\nid\n"))["ok"] is True
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    os.chmod(target, mode)
    patch = "--- a/tool\n+++ b/tool\n@@ -1,2 +1,2 @@\n #!/bin/sh\n-id\n+whoami\n"
    assert body(call(tools_for(ws), "apply_patch", patch=patch))["ok"] is True
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and target.read_text() == "#!/bin/sh\nwhoami\n"


# ------------------------------------------------------------------ a 3,000-deep folder


def _deep_chain(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("note.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def _remove_chain(root: Path) -> None:
    """Bottom up without long paths: hoist the chain one level at a time (rmtree would recurse)."""
    top = root / "d"
    while top.exists():
        inner = top / "d"
        if not inner.exists():
            for p in top.iterdir():
                p.unlink()
            top.rmdir()
            break
        os.rename(inner, root / "up")
        for p in top.iterdir():
            p.unlink()
        top.rmdir()
        os.rename(root / "up", top)


def test_a_3000_deep_folder_does_not_break_missing_file_suggestions(tmp_path: Path, ws: Path) -> None:
    (ws / "notes.txt").write_text("x")
    _deep_chain(ws, 3_000)
    try:
        got = body(call(tools_for(ws), "read_file", path="note.txt"))
        assert got["error"] == "missing_file" and got["similar"][0] == "notes.txt"
        log = tmp_path / "run.jsonl"
        r = run("t", model=ScriptedModel([calls_reply(tool_call("read_file", path="nope.txt"),
                                                      tool_call("read_file", path="d/" * 2_999 + "d/note.txt")),
                                          text_reply("ok")]),
                tools=workspace_tools(ws, sandbox=False), log=RunLog(log))
        assert r.stop.reason is StopReason.FINAL_ANSWER and reconcile(log).ok
        errors = [e.record["error"] for e in read_log(log).of("result")]
        assert errors[0] == "missing_file" and errors[1] == "invalid_path"  # too long a path to name
    finally:
        _remove_chain(ws)
