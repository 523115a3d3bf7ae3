"""Issue 12: model-controlled text is never interpreted by the console. Rich markup in a tool name
(`[/]` crashed the summary, `[link=...]` rendered a link), terminal escapes from a file's contents,
emoji codes: shown as text, on a real terminal too (FORCE_COLOR), in run, replay, reconcile, drill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopfence._printable import markup, printable
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
TERMINAL = {**os.environ, "FORCE_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "200"}
LINK = "[link=https://evil.example]click[/link]"
ANSI = "\x1b[2J\x1b]0;pwned\x07\x1b[31mred"


def lf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=TERMINAL)


def interpreted(out: str) -> list[str]:
    """Terminal controls a model could have sent: a clear screen, a title, a hyperlink, a bell."""
    return [x for x in ("\x1b[2J", "\x1b]0;", "\x1b]8;", "\x07") if x in out]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "evil.txt").write_text(f"before {ANSI} after\n")
    return root


def _run(tmp_path: Path, ws: Path, replies: list[dict[str, Any]], *flags: str) -> subprocess.CompletedProcess[str]:
    s = tmp_path / "s.jsonl"
    s.write_text("".join(json.dumps(r) + "\n" for r in replies))
    return lf("run", "t", "--script", str(s), "--log", str(tmp_path / "r.jsonl"), "--workspace", str(ws),
              "--unsandboxed", *flags, cwd=tmp_path)


@pytest.mark.parametrize("name", ["[/]", LINK, "[bold red]x", ":warning: \x1b[2J"])
def test_markup_in_a_tool_name_is_text_in_the_live_lines_and_the_summary(tmp_path: Path, ws: Path,
                                                                        name: str) -> None:
    p = _run(tmp_path, ws, [calls_reply(tool_call(name, "{}"))])
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "unknown_tool" in p.stderr and not interpreted(p.stderr)
    assert printable(name).split("]")[0] in p.stderr  # shown as written (controls escaped)
    assert reconcile(tmp_path / "r.jsonl").ok


def test_escapes_from_a_file_reach_the_terminal_escaped(tmp_path: Path, ws: Path) -> None:
    p = _run(tmp_path, ws, [calls_reply(tool_call("read_file", path="evil.txt")),
                            text_reply(f"the file says {ANSI} [/] :smile:")])
    assert p.returncode == 0, p.stderr
    assert not interpreted(p.stderr) and not interpreted(p.stdout)
    assert "before \\x1b[2J" in p.stderr  # the live line shows the content, escaped
    assert p.stdout == "the file says \\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mred [/] :smile:\n"


def test_replay_and_reconcile_show_model_text_escaped(tmp_path: Path, ws: Path) -> None:
    p = _run(tmp_path, ws, [calls_reply(tool_call(LINK + ANSI, "{}", id=LINK + ANSI))], "--quiet")
    assert p.returncode == 1, p.stderr
    log = tmp_path / "r.jsonl"
    events = [json.loads(x) for x in log.read_text().splitlines()]
    # drop the result: replay diverges on an event holding the name, reconcile names the call id
    log.write_text("".join(json.dumps(e) + "\n" for e in events if e["event"] != "result"))
    for command in ("replay", "reconcile"):
        p = lf(command, str(log), cwd=tmp_path)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert not interpreted(p.stderr) and "\\x1b[2J" in p.stderr, (command, p.stderr)


def test_the_drill_table_shows_names_as_text(tmp_path: Path) -> None:
    scenario = {"name": "x", "task": "t", "replies": [calls_reply(tool_call("[/]" + ANSI, "{}"))],
                "expect": {"stop": "unknown_tool"}}
    (tmp_path / "x.json").write_text(json.dumps(scenario))
    p = lf("drill", str(tmp_path / "x.json"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert not interpreted(p.stderr)


def test_printable_escapes_controls_bidi_and_surrogates() -> None:
    assert printable("a\x1b[2Jb\tc\nd\r\x7f\x9b\u202e\ud800") == "a\\x1b[2Jb\tc\nd\\x0d\\x7f\\x9b\\u202e\\ud800"
    assert printable("a\nb\tc", one_line=True) == "a b c" and printable("a\r\nb\rc") == "a\nb\\x0dc"
    assert printable("x" * 10, 4) == "xxxx… [6 more characters]"
    assert markup("[/] [link=x]") == "\\[/] \\[link=x]"
    printable("\ud800\udfff").encode("utf-8")
