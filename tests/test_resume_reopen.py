"""`loopfence resume` past an `endpoint_error` or `cancelled` stop: a new segment of the same log,
with another endpoint (--base-url/--model), raised limits (--limit), custom tools (--tools, by default
the header's) and MCP servers (--mcp). Every CLI run is a real subprocess against loopback
FakeServers; each finished log reconciles and replays."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, ScriptedModel, arun, tool
from loopfence.runlog import read_log, reconcile, replay, resume
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
MCP_SERVER = Path(__file__).resolve().parent / "_mcp_server.py"
REFUSED = {"status": 400, "body": {"error": {"message": "the endpoint is down"}}}  # not retried: endpoint_error
COUNTER_TOOLS = '''
from pathlib import Path
from loopfence import tool

def bump(key: str) -> str:
    """Record one side effect.

    Args:
        key: What to record.
    """
    with open(Path(__file__).with_name("effects.txt"), "a") as f:
        f.write(key + "\\n")
    return "bumped " + key

TOOLS = [tool(bump, kind="side_effect")]
'''


def _cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *argv], cwd=cwd, capture_output=True, text=True, timeout=180)


def _lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()]


def _effects(tmp_path: Path) -> Counter[str]:
    f = tmp_path / "effects.txt"
    return Counter(f.read_text().split()) if f.exists() else Counter()


def _whole(log: Path) -> None:
    check = reconcile(log)
    assert check.ok, [(c.name, c.detail) for c in check.failed]
    assert replay(log).ok, replay(log).lines()


def test_an_outage_then_resume_on_another_endpoint_with_custom_tools_and_a_raised_limit(tmp_path: Path) -> None:
    (tmp_path / "counter_tools.py").write_text(COUNTER_TOOLS, encoding="utf-8")
    log = tmp_path / "run.jsonl"
    bump = lambda k: calls_reply(tool_call("bump", key=k))  # noqa: E731
    with FakeServer([bump("a"), bump("b"), REFUSED]) as down:
        first = _cli(tmp_path, "run", "task", "--base-url", down.base_url, "--model", "m1", "--log", str(log),
                     "--quiet", "--tools", "counter_tools:TOOLS", "--limit", "max_steps=3")
    assert first.returncode == 1, first.stderr
    stop1 = _lines(log)[-1]
    assert (stop1["event"], stop1["reason"]) == ("stop", "endpoint_error")
    assert _effects(tmp_path) == Counter(["a", "b"])

    with FakeServer([bump("c"), bump("d"), text_reply("all four")]) as up:
        p = _cli(tmp_path, "resume", str(log), "--base-url", up.base_url, "--model", "m2",
                 "--limit", "max_steps=6")  # --tools: the header's custom_tools
        sent = [r["model"] for r in up.requests]
    assert p.returncode == 0, p.stderr
    assert "past its endpoint_error stop" in p.stderr
    assert sent == ["m2"] * 3
    assert _effects(tmp_path) == Counter(["a", "b", "c", "d"])  # nothing ran twice
    events = _lines(log)
    [marker] = [e for e in events if e["event"] == "resume"]
    assert marker["reopened"] == {"line": events.index(stop1) + 1, "reason": "endpoint_error"}
    assert marker["overrides"]["limits"] == {"max_steps": 6}
    assert marker["overrides"]["model"]["model"] == "m2" and marker["overrides"]["model"]["base_url"] == up.base_url
    assert [e["reason"] for e in events if e["event"] == "stop"] == ["endpoint_error", "final_answer"]
    assert [e["step"] for e in events if e["event"] == "request"] == [1, 2, 3, 4, 5]  # step 3: sent to both

    read = read_log(log)  # the joined run: one stop, the last line, under the overridden header
    assert read.stop is not None and read.stop.final_answer == "all four"
    assert [e.line for e in read.reopened] == [stop1["seq"] + 1]
    assert read.header.limits["max_steps"] == 6 and read.header.model["model"] == "m2"
    assert read.stop.ledger["model_requests"] == 5 and read.stop.ledger["tool_executions"] == 4
    _whole(log)
    assert _cli(tmp_path, "reconcile", str(log)).returncode == 0
    again = _cli(tmp_path, "resume", str(log))
    assert again.returncode == 0 and "nothing to resume" in again.stderr  # final_answer is over


def test_a_limit_the_recorded_part_broke_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    with FakeServer([calls_reply(tool_call("list_dir", path=".")), REFUSED]) as down:
        assert _cli(tmp_path, "run", "t", "--base-url", down.base_url, "--log", str(log), "--quiet").returncode == 1
    before = log.read_bytes()
    with FakeServer([text_reply("x")]) as up:
        p = _cli(tmp_path, "resume", str(log), "--base-url", up.base_url, "--limit", "max_steps=1")
        assert up.served == 0
    assert p.returncode == 2 and "does not play back" in p.stderr, p.stderr
    assert log.read_bytes() == before  # nothing written
    assert _cli(tmp_path, "resume", str(log), "--limit", "max_stepz=3").returncode == 2


def test_a_cancelled_run_goes_on_and_the_interrupted_side_effect_is_not_run_again(tmp_path: Path) -> None:
    ran: Counter[str] = Counter()
    started = asyncio.Event()

    async def bump(key: str) -> str:
        """Record one side effect.

        Args:
            key: What to record.
        """
        ran[key] += 1
        if key == "slow":
            started.set()
            await asyncio.Event().wait()  # until the run is cancelled
        return "ok"

    tools = [tool(bump, kind="side_effect")]
    log = tmp_path / "run.jsonl"
    script = [calls_reply(tool_call("bump", key="a")), calls_reply(tool_call("bump", key="slow")),
              calls_reply(tool_call("bump", key="b")), text_reply("done")]

    async def first() -> None:
        task = asyncio.create_task(arun("t", model=ScriptedModel(script), tools=tools, log=log))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # the stop line is written on the way out
            await task

    asyncio.run(first())
    assert _lines(log)[-1]["reason"] == "cancelled"
    outcome = resume(log, tools=tools, limits={"max_tool_calls": 10})
    assert outcome.reopened is not None and outcome.reopened.reason == "cancelled"
    assert outcome.result is not None and outcome.result.final_answer == "done"
    assert ran == Counter({"a": 1, "slow": 1, "b": 1})  # the interrupted one: outcome_unknown, not again
    assert len(outcome.outcome_unknown) == 1
    events = _lines(log)
    unknown = [e for e in events if e["event"] == "result" and e.get("error") == "outcome_unknown"]
    assert len(unknown) == 2  # the cancel's own bookkeeping (set aside on reading) and the resume's answer
    assert read_log(log).stop.ledger["tool_executions"] == 3  # type: ignore[union-attr]
    assert reconcile(log).ok, [(c.name, c.detail) for c in reconcile(log).failed]
    assert Limits.from_json(read_log(log).header.limits).max_tool_calls == 10


def test_resume_without_reopen_or_for_another_stop_says_the_run_is_over(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    with FakeServer([REFUSED]) as down:
        _cli(tmp_path, "run", "t", "--base-url", down.base_url, "--log", str(log), "--quiet")
    outcome = resume(log, reopen=False)
    assert outcome.result is None and outcome.ended is not None and outcome.ended.reason == "endpoint_error"
    with FakeServer([calls_reply(tool_call("list_dir", path="."))] * 3) as same:
        p = _cli(tmp_path, "resume", str(log), "--base-url", same.base_url, "--quiet")
    assert p.returncode == 1 and _lines(log)[-1]["reason"] == "no_progress", p.stderr
    p = _cli(tmp_path, "resume", str(log), "--base-url", "http://127.0.0.1:9/v1")
    assert p.returncode == 0 and "nothing to resume" in p.stderr  # no_progress is not reopened
    _whole(log)


def test_mcp_tools_on_resume(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="loopfence[mcp] is not installed")
    log = tmp_path / "run.jsonl"
    mcp = ["--mcp", f"notes={sys.executable} {MCP_SERVER}", "--mcp-trust", "notes"]
    with FakeServer([calls_reply(tool_call("read_note", path="a.md")), REFUSED]) as down:
        first = _cli(tmp_path, "run", "t", "--base-url", down.base_url, "--log", str(log), "--quiet", *mcp)
    assert first.returncode == 1, first.stderr
    with FakeServer([calls_reply(tool_call("read_note", path="b.md")), text_reply("read both")]) as up:
        without = _cli(tmp_path, "resume", str(log), "--base-url", up.base_url)
        assert without.returncode == 2 and "read_note" in without.stderr, without.stderr  # not here
        p = _cli(tmp_path, "resume", str(log), "--base-url", up.base_url, "--quiet", *mcp)
    assert p.returncode == 0, p.stderr
    results = [e["content"] for e in _lines(log) if e["event"] == "result"]
    assert results == ["notes: alpha notes (page 1)", "notes: beta notes (page 1)"], results
    _whole(log)
