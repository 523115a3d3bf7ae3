"""`loopfence run` through the real console script: exit codes, live lines, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]


def write_script(path: Path, replies: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    return path


def lf(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "config.py").write_text("DEBUG = True\n")
    return tmp_path


def test_ship_exits_0_with_live_lines_and_summary(ws):
    script = write_script(ws / "s.jsonl", [calls_reply(tool_call("read_file", path="app/config.py")),
                                           text_reply("DEBUG is on")])
    p = lf("run", "Read app/config.py", "--script", str(script), "--workspace", str(ws),
           "--log", str(ws / "run.jsonl"), cwd=ws)
    assert p.returncode == 0, p.stderr
    assert "DEBUG is on" in p.stdout
    assert "step 1" in p.stderr and "read_file" in p.stderr and "final_answer" in p.stderr
    assert f"log: {ws / 'run.jsonl'}" in p.stderr
    last = json.loads((ws / "run.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "stop" and last["reason"] == "final_answer"


def test_kill_exits_1(ws):
    script = write_script(ws / "s.jsonl", [calls_reply(tool_call("read_file", path="nope.py"))])
    p = lf("run", "t", "--script", str(script), "--workspace", str(ws), "--log", str(ws / "r.jsonl"), cwd=ws)
    assert p.returncode == 1
    assert "no_progress" in p.stderr


def test_limit_flag_applies(ws):
    replies = [calls_reply(tool_call("read_file", path=f"f{i}.py")) for i in range(10)]
    script = write_script(ws / "s.jsonl", replies)
    p = lf("run", "t", "--script", str(script), "--workspace", str(ws), "--limit", "max_steps=2",
           "--limit", "max_identical_results=none", "--log", str(ws / "r.jsonl"), cwd=ws)
    assert p.returncode == 1 and "max_steps" in p.stderr


@pytest.mark.parametrize("content,needle", [
    (None, "not found"),
    ("", "empty"),
    ('{"choices": []}\nnot json\n', ":1: reply has no choices"),
    ('{"choices": [{"message": {"role": "assistant", "content": "x"}}]}\n{oops\n', ":2: not valid JSON"),
])
def test_bad_script_is_one_line_exit_2(ws, content, needle):
    script = ws / "s.jsonl"
    if content is not None:
        script.write_text(content)
    p = lf("run", "t", "--script", str(script), "--workspace", str(ws), cwd=ws)
    assert p.returncode == 2
    assert needle in p.stderr and "s.jsonl" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_unknown_limit_is_usage_error(ws):
    script = write_script(ws / "s.jsonl", [text_reply("x")])
    p = lf("run", "t", "--script", str(script), "--limit", "max_stepz=3", cwd=ws)
    assert p.returncode == 2 and "unknown limit 'max_stepz'" in p.stderr and "Traceback" not in p.stderr


def test_help_answers_the_obvious_question(ws):
    p = lf("run", "--help", cwd=ws)
    assert p.returncode == 0 and "--limit" in p.stdout and "SHIP" in p.stdout
