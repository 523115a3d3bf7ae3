"""ATIF export: a run log as a Harbor Agent Trajectory Interchange Format (v1.4) trajectory."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from loopfence.cli import cli
from loopfence.runlog import read_log, to_atif

from _runlog_support import config_script, make_workspace, record

AGENT_ONLY = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}


def check_atif(doc: dict[str, Any]) -> None:
    """The rules Harbor's validator enforces (fields, sequential step ids, call references)."""
    assert doc["schema_version"] == "ATIF-v1.4" and isinstance(doc["session_id"], str)
    assert isinstance(doc["agent"]["name"], str) and isinstance(doc["agent"]["version"], str)
    assert doc["steps"], "at least one step"
    seen_ids: set[str] = set()
    for i, step in enumerate(doc["steps"], 1):
        assert step["step_id"] == i and step["source"] in ("system", "user", "agent")
        assert isinstance(step["message"], str)
        if "timestamp" in step:
            datetime.fromisoformat(step["timestamp"])
        if step["source"] != "agent":
            assert not AGENT_ONLY & set(step), step
        ids = set()
        for call in step.get("tool_calls", []):
            assert set(call) == {"tool_call_id", "function_name", "arguments"}
            assert isinstance(call["arguments"], dict) and call["tool_call_id"] not in seen_ids
            ids.add(call["tool_call_id"])
        seen_ids |= ids
        for result in step.get("observation", {}).get("results", []):
            assert result.get("source_call_id") is None or result["source_call_id"] in ids
            assert isinstance(result["content"], str)
    fm = doc["final_metrics"]
    steps = [s for s in doc["steps"] if "metrics" in s]
    assert fm["total_prompt_tokens"] == sum(s["metrics"]["prompt_tokens"] for s in steps)
    assert fm["total_completion_tokens"] == sum(s["metrics"]["completion_tokens"] for s in steps)
    assert fm["total_steps"] == len(doc["steps"])


@pytest.fixture
def log(tmp_path: Path) -> Path:
    ws = make_workspace(tmp_path)
    record(tmp_path / "run.jsonl", config_script(), workspace=ws, system="Be brief.")
    return tmp_path / "run.jsonl"


def test_a_run_exports_as_a_valid_trajectory(log: Path) -> None:
    doc = to_atif(log)
    check_atif(doc)
    run = read_log(log)
    assert doc["session_id"] == run.header.run_id
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent", "agent"]
    assert doc["steps"][1]["message"] == "Read app/config.py"
    first, second, last = doc["steps"][2:]
    assert first["tool_calls"] == [{"tool_call_id": "call_0", "function_name": "read_file",
                                    "arguments": {"path": "app/config.py"}}]
    assert "DEBUG = True" in first["observation"]["results"][0]["content"]
    # scripted ids repeat across steps: made unique, the original kept
    assert [c["tool_call_id"] for c in second["tool_calls"]] == ["call_0@2", "call_1"]
    assert second["extra"]["original_ids"] == {"call_0@2": "call_0"}
    assert [r["source_call_id"] for r in second["observation"]["results"]] == ["call_0@2", "call_1"]
    assert "[reused:" in second["observation"]["results"][1]["content"]
    assert last["message"] == "DEBUG is True" and "tool_calls" not in last
    assert doc["extra"]["loopfence"]["stop"]["reason"] == "final_answer"
    assert doc["final_metrics"]["extra"]["ledger"]["tool_executions"] == 2
    assert "script" not in doc["agent"]["extra"]["model"]


def test_export_cli_writes_a_file(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    assert cli(["export", str(log), "--format", "atif", "-o", str(out)]) == 0
    check_atif(json.loads(out.read_text()))
    assert "5 steps, ATIF-v1.4" in capsys.readouterr().err
    assert cli(["export", str(log)]) == 0
    check_atif(json.loads(capsys.readouterr().out))
    assert cli(["export", str(log), "--format", "csv"]) == 2


def test_unparseable_arguments_are_kept_aside(tmp_path: Path) -> None:
    from loopfence.testing import calls_reply, tool_call
    ws = make_workspace(tmp_path)
    record(tmp_path / "bad.jsonl", [calls_reply(tool_call("read_file", arguments='{"path": "a'))], workspace=ws)
    doc = to_atif(tmp_path / "bad.jsonl")
    check_atif(doc)
    agent = doc["steps"][-1]
    assert agent["tool_calls"][0]["arguments"] == {}
    assert agent["extra"]["unparsed_arguments"] == {"call_0": '{"path": "a'}
    assert agent["extra"]["decisions"][0]["decision"] == "rejected"
