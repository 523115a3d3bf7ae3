"""`loopfence drill`: a wrong expect fails (exit 1), bad files are clear errors (exit 2), outputs are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfence.cli import cli
from loopfence.testing import calls_reply, text_reply, tool_call


def scenario(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "read-then-answer", "task": "Read a.py.", "workspace": {"a.py": "A = 1\n"},
        "tools": ["read_file"],
        "replies": [calls_reply(tool_call("read_file", path="a.py")), text_reply("A is 1.")],
        "expect": {"stop": "final_answer", "tool_executions": 1, "model_requests": 2},
    }
    base.update(over)
    return base


def write(folder: Path, data: Any, name: str = "s.json") -> Path:
    p = folder / name
    p.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return p


def drill(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    rc = cli(["drill", *argv])
    cap = capsys.readouterr()
    rows = [json.loads(x) for x in cap.out.splitlines() if x.startswith("{")]
    return rc, rows, cap.err


def test_a_passing_scenario_exits_0_and_writes_log_and_results(tmp_path: Path, capsys: Any) -> None:
    p = write(tmp_path, scenario())
    rc, rows, _ = drill(capsys, str(p), "--json", "--out", str(tmp_path / "out"))
    assert rc == 0
    (row,) = rows
    assert row["pass"] is True and row["stop"] == "final_answer" and row["verdict"] == "SHIP"
    assert row["calls"] == [{"name": "read_file", "decision": "executed", "ok": True,
                             "arguments": {"path": "a.py", "page": 1, "encoding": "utf-8"}}]
    log = (tmp_path / "out" / "read-then-answer.jsonl").read_text().splitlines()
    assert json.loads(log[0])["event"] == "header" and json.loads(log[-1])["reason"] == "final_answer"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["format"] == "loopfence.drill" and results["passed"] is True
    assert results["scenarios"][0]["name"] == "read-then-answer"


@pytest.mark.parametrize("expect, complaint", [
    ({"stop": "no_progress"}, "stop: expected no_progress, got final_answer"),
    ({"verdict": "KILL"}, "verdict: expected KILL, got SHIP"),
    ({"tool_executions": 2}, "tool_executions: expected 2, got 1"),
    ({"model_requests": 1}, "model_requests: expected 1, got 2"),
    ({"reused": 1}, "reused: expected 1, got 0"),
    ({"max_model_requests": 1}, "model_requests: expected at most 1, got 2"),
    ({"calls": [{"name": "read_file", "arguments": {"path": "b.py"}}]}, "calls[0]: expected read_file"),
    ({"calls": []}, "calls: expected 0 executed calls, got 1"),
    ({"calls": [{"name": "read_file", "arguments": {"path": "a.py"}, "ok": False}]}, "expected ok=false"),
    ({"files_exist": ["out.txt"]}, "files_exist: out.txt"),
    ({"log_contains": ["no such text"]}, "log_contains: 'no such text'"),
])
def test_a_wrong_expect_fails_the_command(tmp_path: Path, capsys: Any, expect: dict, complaint: str) -> None:
    p = write(tmp_path, scenario(expect=expect))
    rc, rows, err = drill(capsys, str(p), "--json", "--out", str(tmp_path / "out"))
    assert rc == 1
    assert rows[0]["pass"] is False
    assert any(complaint in m for m in rows[0]["mismatches"]), rows[0]["mismatches"]
    assert complaint.split(":")[0] in err  # the table's notes name the mismatch too


def test_defaults_are_bound_before_comparing_calls(tmp_path: Path, capsys: Any) -> None:
    want = [{"name": "read_file", "arguments": {"encoding": "utf-8", "path": "a.py", "page": 1}, "ok": True}]
    p = write(tmp_path, scenario(expect={"calls": want}))
    assert drill(capsys, str(p), "--out", str(tmp_path / "out"))[0] == 0


def test_one_failing_scenario_among_passing_ones_fails_the_run(tmp_path: Path, capsys: Any) -> None:
    write(tmp_path, scenario(), "a.json")
    write(tmp_path, scenario(name="wrong", expect={"stop": "max_steps"}), "b.json")
    rc, rows, _ = drill(capsys, str(tmp_path), "--json", "--out", str(tmp_path / "out"))
    assert rc == 1 and [r["pass"] for r in rows] == [True, False]


def test_a_scenario_without_expect_does_not_fail(tmp_path: Path, capsys: Any) -> None:
    data = scenario()
    del data["expect"]
    rc, rows, _ = drill(capsys, str(write(tmp_path, data)), "--json", "--out", str(tmp_path / "out"))
    assert rc == 0 and "pass" not in rows[0] and rows[0]["stop"] == "final_answer"


def test_the_table_is_printed(tmp_path: Path, capsys: Any) -> None:
    rc, _, _ = drill(capsys, str(write(tmp_path, scenario())), "--out", str(tmp_path / "out"))
    assert rc == 0
    # without --json the table goes to stdout
    rc = cli(["drill", str(tmp_path / "s.json"), "--out", str(tmp_path / "out2")])
    out = capsys.readouterr().out
    assert "read-then-answer" in out and "final_answer" in out and "pass" in out


@pytest.mark.parametrize("content, field", [
    ("", "empty file"),
    ("   \n", "empty file"),
    ("{\"name\": ", "not valid JSON"),
    ("[]", "must be an object"),
    ("null", "must be an object"),
])
def test_empty_or_malformed_file_is_exit_2(tmp_path: Path, capsys: Any, content: str, field: str) -> None:
    p = write(tmp_path, content)
    rc, rows, err = drill(capsys, str(p), "--json", "--out", str(tmp_path / "out"))
    assert rc == 2 and [(r["file"], r["pass"]) for r in rows] == [(str(p), False)] and field in rows[0]["error"]
    assert str(p) in err and field in err and "Traceback" not in err


@pytest.mark.parametrize("change, field, words", [
    ({"task": None}, "task", "missing required key"),
    ({"name": None}, "name", "missing required key"),
    ({"replies": None}, "replies", "missing required key"),
    ({"replies": []}, "replies", "must not be empty"),
    ({"tools": "read_file"}, "tools", "must be an array"),
    ({"tools": ["read_file", "cat"]}, "tools[1]", "unknown tool 'cat'"),
    ({"tools": [3]}, "tools[0]", "must be a string"),
    ({"limits": {"max_stepz": 3}}, "limits.max_stepz", "unknown limit"),
    ({"limits": {"max_steps": "many"}}, "limits.max_steps", "must be a number"),
    ({"limits": {"no_progress": "off"}}, "limits.no_progress", "true or false"),
    ({"policy": {"on_bad_call": "retry"}}, "policy", "on_bad_call"),
    ({"replies": [{"choices": [{"index": 0}]}]}, "replies[0]", "not a chat.completions response"),
    ({"replies": [{"status": 99}]}, "replies[0].status", "HTTP status"),
    ({"replies": [{"chunks": [1]}]}, "replies[0].chunks", "[0] must be a chunk object"),
    ({"replies": [{"sse": "data: x", "extra": 1}]}, "replies[0].extra", "unknown key"),
    ({"expect": {"stop": "done"}}, "expect.stop", "unknown stop reason"),
    ({"expect": {"tool_executions": -1}}, "expect.tool_executions", ">= 0"),
    ({"expect": {"tool_executions": "1"}}, "expect.tool_executions", "whole number"),
    ({"expect": {"calls": [{"name": "write_file"}]}}, "expect.calls[0].name", "not a tool this scenario"),
    ({"expect": {"stops": "x"}}, "expect.stops", "unknown key"),
    ({"workspace": {"../x": "y"}}, "workspace.../x", "relative path"),
    ({"workspace": {"a.py": 1}}, "workspace.a.py", "must be a string"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"params": []}, "params", "must be an object"),
    ({"canned_tools": {"t": {"results": []}}}, "canned_tools.t.results", "must not be empty"),
    ({"canned_tools": {"t": {"results": [1], "kind": "pure"}}}, "canned_tools.t.kind", "must be one of"),
    ({"canned_tools": {"t": {}}}, "canned_tools.t.results", "missing required key"),
    ({"canned_tools": {"read_file": {"results": [1]}}}, "canned_tools.read_file", "also enabled"),
    ({"name": "has space"}, "name", "letters, digits"),
    ({"limit": {}}, "limit", "unknown key"),
])
def test_bad_fields_are_named(tmp_path: Path, capsys: Any, change: dict, field: str, words: str) -> None:
    data = scenario()
    for k, v in change.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    p = write(tmp_path, data)
    rc, rows, err = drill(capsys, str(p), "--json", "--out", str(tmp_path / "out"))
    assert rc == 2 and [r["stop"] for r in rows] == [None] and f"{p}: {field}: " in rows[0]["error"], err
    line = err.strip().replace("\n", " ")
    assert f"{p}: {field}: " in line and words in line and "Traceback" not in err


def test_unknown_fault_form_is_named(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("loopfence.testing._replyforms")
    p = write(tmp_path, scenario(replies=[{"fault": "meltdown"}]))
    rc, _, err = drill(capsys, str(p), "--out", str(tmp_path / "out"))
    assert rc == 2 and f"{p}: replies[0]: " in err and "unknown fault" in err


def test_a_bad_file_is_an_error_row_and_the_others_run(tmp_path: Path, capsys: Any) -> None:
    write(tmp_path, scenario(), "a.json")
    write(tmp_path, "", "b.json")
    rc, rows, err = drill(capsys, str(tmp_path), "--json", "--out", str(tmp_path / "out"))
    assert rc == 2 and "b.json" in err
    assert [(r["name"], r["pass"]) for r in rows] == [("read-then-answer", True), ("b", False)]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["passed"] is False


@pytest.mark.parametrize("make", ["missing", "empty-folder"])
def test_missing_paths_and_empty_folders_are_exit_2(tmp_path: Path, capsys: Any, make: str) -> None:
    target = tmp_path / "nothing"
    if make == "empty-folder":
        target.mkdir()
    rc, _, err = drill(capsys, str(target), "--out", str(tmp_path / "out"))
    assert rc == 2 and str(target) in err


def test_duplicate_scenario_names_are_exit_2(tmp_path: Path, capsys: Any) -> None:
    write(tmp_path, scenario(), "a.json")
    write(tmp_path, scenario(), "b.json")
    rc, _, err = drill(capsys, str(tmp_path), "--out", str(tmp_path / "out"))
    assert rc == 2 and "already used" in err


def test_model_needs_base_url(tmp_path: Path, capsys: Any) -> None:
    rc, _, err = drill(capsys, str(write(tmp_path, scenario())), "--model", "m")
    assert rc == 2 and "--model needs --base-url" in err


def test_base_url_lets_an_endpoint_answer(tmp_path: Path, capsys: Any) -> None:
    fake = pytest.importorskip("loopfence.testing._fakeserver")
    # the scenario's own replies would ship; the endpoint reads b.py and then answers
    p = write(tmp_path, scenario(workspace={"a.py": "A = 1\n", "b.py": "B = 2\n"},
                                 expect={"stop": "final_answer", "calls": [{"name": "read_file", "arguments": {"path": "b.py"}}]}))
    with fake.FakeServer([calls_reply(tool_call("read_file", path="b.py")), text_reply("B is 2.")]) as srv:
        rc, rows, err = drill(capsys, str(p), "--json", "--out", str(tmp_path / "out"),
                              "--base-url", srv.base_url, "--model", "fake")
        assert srv.served == 2 and srv.requests[0]["model"] == "fake"
    assert rc == 0, err
    assert rows[0]["calls"][0]["arguments"]["path"] == "b.py"


def test_base_url_must_be_a_url(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("loopfence.models._openai")
    rc, _, err = drill(capsys, str(write(tmp_path, scenario())), "--base-url", "ftp://nowhere")
    assert rc == 2 and "--base-url" in err
