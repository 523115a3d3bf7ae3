"""`loopfence replay --tools/--mcp`: a run with custom or MCP tools replays from the command line,
those tools run for real and their results are compared with the recorded ones (issue 20)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
MCP_SERVER = Path(__file__).resolve().parent / "_mcp_server.py"
TOOL = 'def shout(text: str) -> str:\n    """Upper-case."""\n    return text.upper() + {tail!r}\n'


def _lf(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], cwd=tmp_path, capture_output=True, text=True, timeout=180)


def _script(path: Path, *replies: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


def test_custom_tools_run_again_and_a_changed_one_diverges(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOL.format(tail="!"))
    script = _script(tmp_path / "s.jsonl", calls_reply(tool_call("shout", text="hi")), text_reply("done"))
    p = _lf(tmp_path, "run", "t", "--script", str(script), "--tools", "mytools:shout", "--log", "r.jsonl", "--quiet")
    assert p.returncode == 0, p.stderr
    p = _lf(tmp_path, "replay", "r.jsonl", "--tools", "mytools:shout", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] and out["executed"] == ["shout"] and "ran for real: shout" in p.stderr
    (tmp_path / "mytools.py").write_text(TOOL.format(tail="?"))  # the tool now answers otherwise
    p = _lf(tmp_path, "replay", "r.jsonl", "--tools", "mytools:shout", "--json")
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert not out["ok"] and out["divergence"] is not None and "HI?" in p.stderr
    p = _lf(tmp_path, "replay", "r.jsonl", "--tools", "nope:x")
    assert p.returncode == 2 and "--tools nope:x" in p.stderr and "Traceback" not in p.stderr


def test_custom_tools_run_next_to_the_built_ins_with_execute_tools(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOL.format(tail="!"))
    (tmp_path / "a.txt").write_text("hello\n")
    script = _script(tmp_path / "s.jsonl", calls_reply(tool_call("shout", text="hi"), tool_call("read_file", path="a.txt")),
                     text_reply("done"))
    p = _lf(tmp_path, "run", "t", "--script", str(script), "--tools", "mytools:shout", "--log", "r.jsonl",
            "--quiet", "--unsandboxed")
    assert p.returncode == 0, p.stderr
    p = _lf(tmp_path, "replay", "r.jsonl", "--tools", "mytools:shout", "--execute-tools", "--json")
    assert p.returncode == 0, p.stderr
    assert sorted(json.loads(p.stdout)["executed"]) == ["read_file", "shout"]


@pytest.mark.slow  # two MCP server start-ups in subprocesses (~15 s on 2 shared cores)
def test_mcp_tools_replay_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="loopfence[mcp] is not installed")
    script = _script(tmp_path / "s.jsonl", calls_reply(tool_call("add", a=2, b=3)), text_reply("5"))
    server = ["--mcp", f"calc={sys.executable} {MCP_SERVER}", "--mcp-trust", "calc"]
    p = _lf(tmp_path, "run", "t", "--script", str(script), *server, "--log", "r.jsonl", "--quiet")
    assert p.returncode == 0, p.stderr
    p = _lf(tmp_path, "replay", "r.jsonl", *server, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["executed"] == ["add"]
