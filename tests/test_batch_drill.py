"""The two drill defects of issue 16: a response object with empty `choices` is served (the run ends
endpoint_error, as it does against a real server that sends one), and one malformed scenario file in
a folder is an error row naming the file and the field while the other scenarios run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfence.cli import cli
from loopfence.drill import ScenarioError, load_each, load_scenario, run_scenario
from loopfence.testing import calls_reply, text_reply, tool_call


def scenario(name: str, **over: Any) -> dict[str, Any]:
    return {"name": name, "task": "Read a.py.", "workspace": {"a.py": "A = 1\n"}, "tools": ["read_file"],
            "replies": [calls_reply(tool_call("read_file", path="a.py")), text_reply("A is 1.")],
            "expect": {"stop": "final_answer"}, **over}


def write(folder: Path, name: str, data: Any) -> Path:
    p = folder / name
    p.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return p


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_with_empty_choices_is_served_and_ends_endpoint_error(tmp_path: Path, stream: bool) -> None:
    p = write(tmp_path, "s.json", scenario("empty", stream=stream,
                                           replies=[calls_reply(tool_call("read_file", path="a.py")),
                                                    {"id": "x", "object": "chat.completion", "choices": []}],
                                           expect={"stop": "endpoint_error", "model_requests": 2,
                                                   "tool_executions": 1}))
    s = load_scenario(p)
    assert s.replies[1]["choices"] == []
    row = run_scenario(s, tmp_path / "out")
    assert (row.stop, row.passed, row.error) == ("endpoint_error", True, None), row.mismatches
    assert "choices" in row.detail


def test_a_folder_with_one_malformed_scenario_runs_the_others(tmp_path: Path, capsys: Any) -> None:
    drills = tmp_path / "drills"
    drills.mkdir()
    write(drills, "a.json", scenario("first"))
    bad = write(drills, "b.json", scenario("second", limits={"max_stepz": 3}))
    write(drills, "c.json", scenario("third"))
    items = load_each([drills])
    assert [type(i).__name__ for i in items] == ["Scenario", "ScenarioError", "Scenario"]
    assert isinstance(items[1], ScenarioError) and (items[1].file, items[1].field) == (str(bad), "limits.max_stepz")

    rc = cli(["drill", str(drills), "--json", "--out", str(tmp_path / "out")])
    cap = capsys.readouterr()
    rows = [json.loads(x) for x in cap.out.splitlines() if x.startswith("{")]
    assert rc == 2  # something failed: a scenario file was bad
    assert [(r["name"], r["pass"]) for r in rows] == [("first", True), ("b", False), ("third", True)]
    assert rows[1]["file"] == str(bad) and f"{bad}: limits.max_stepz: unknown limit" in rows[1]["error"]
    assert f"{bad}: limits.max_stepz:" in cap.err.replace("\n", " ")
    assert (tmp_path / "out" / "first.jsonl").exists() and (tmp_path / "out" / "third.jsonl").exists()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["passed"] is False and [s["name"] for s in results["scenarios"]] == ["first", "b", "third"]


def test_a_duplicate_name_is_an_error_row_too(tmp_path: Path, capsys: Any) -> None:
    write(tmp_path, "a.json", scenario("same"))
    write(tmp_path, "b.json", scenario("same"))
    rc = cli(["drill", str(tmp_path), "--json", "--out", str(tmp_path / "out")])
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert rc == 2 and [r["pass"] for r in rows] == [True, False] and "already used" in rows[1]["error"]


def test_all_good_still_exits_0(tmp_path: Path) -> None:
    write(tmp_path, "a.json", scenario("fine"))
    assert cli(["drill", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
