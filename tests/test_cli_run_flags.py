"""`loopfence run` wires the newer parts in: --tools, --report, --nudge/--last-answer, --mcp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
MCP_SERVER = Path(__file__).resolve().parent / "_mcp_server.py"


def _script(path: Path, *replies: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    log = tmp_path / "r.jsonl"
    p = subprocess.run([*EXE, "run", "t", "--log", str(log), "--quiet", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return p, events


def test_custom_tools_and_the_report(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text('def shout(text: str) -> str:\n    """Upper-case."""\n'
                                         "    return text.upper() + '!'\n")
    script = _script(tmp_path / "s.jsonl", calls_reply(tool_call("shout", text="hi")), text_reply("done"))
    p, events = _run(tmp_path, "--script", str(script), "--tools", "mytools:shout", "--report")
    assert p.returncode == 0, p.stderr
    assert events[0]["custom_tools"] == ["mytools:shout"]
    assert [e["content"] for e in events if e["event"] == "result"] == ["HI!"]
    page = tmp_path / "r.html"
    assert f"report: {page.name}" in p.stderr or f"report: {page}" in p.stderr, p.stderr
    assert "final_answer" in page.read_text(encoding="utf-8")
    assert reconcile(tmp_path / "r.jsonl").ok


def test_quiet_with_report_leaves_the_answer_alone_on_stdout(tmp_path: Path) -> None:
    """`ANS=$(loopfence run ... --quiet --report)` captures the answer, not the report's path
    (issue 30, defect 3): the path goes to stderr, as the log's path does."""
    script = _script(tmp_path / "s.jsonl", calls_reply(tool_call("list_dir", path=".")), text_reply("the answer"))
    p, _ = _run(tmp_path, "--script", str(script), "--report")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "the answer\n"
    assert p.stderr.splitlines() == [f"report: {tmp_path / 'r.html'}"] and (tmp_path / "r.html").is_file()


def test_a_tools_flag_that_names_nothing_is_a_usage_error(tmp_path: Path) -> None:
    script = _script(tmp_path / "s.jsonl", text_reply("done"))
    p, _ = _run(tmp_path, "--script", str(script), "--tools", "no_such_module:x")
    assert p.returncode == 2 and "--tools" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_nudge_and_last_answer_flags_reach_the_policy(tmp_path: Path) -> None:
    same = calls_reply(tool_call("list_dir", path="."))
    script = _script(tmp_path / "s.jsonl", same, same, same, text_reply("best guess"))
    p, events = _run(tmp_path, "--script", str(script), "--nudge", "--last-answer")
    policy = events[0]["policy"]
    assert policy.get("nudge") is True and policy.get("last_answer") is True, policy
    assert p.returncode == 1  # still KILL
    assert any(e["event"] == "nudge" for e in events)
    assert events[-1]["event"] == "stop" and events[-1]["last_answer"] == "best guess", events[-1]
    asked = [e for e in events if e["event"] == "request"][-1]
    assert asked["step"] == 4 and [e["decision"] for e in events if e["event"] == "last_answer"][-1] != "failed"
    assert reconcile(tmp_path / "r.jsonl").ok


def test_an_mcp_server_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="loopfence[mcp] is not installed")
    script = _script(tmp_path / "s.jsonl", calls_reply(tool_call("add", a=2, b=3)), text_reply("5"))
    p, events = _run(tmp_path, "--script", str(script), "--mcp", f"calc={sys.executable} {MCP_SERVER}",
                     "--mcp-trust", "calc")
    assert p.returncode == 0, p.stderr
    assert events[0]["tool_info"]["add"]["mcp"]["server"] == "calc"
    assert [e["content"] for e in events if e["event"] == "result"] == ["5"]
    assert reconcile(tmp_path / "r.jsonl").ok
