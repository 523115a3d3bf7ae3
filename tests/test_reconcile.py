"""Reconcile: every invariant holds on real logs, and each hand edit fails the invariant it breaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, StopReason, workspace_tools
from loopfence.cli import cli
from loopfence.runlog import LogError, reconcile
from loopfence._drivers._reconcile import INVARIANTS

from _runlog_support import (config_script, counter_script, counter_tools, edit_events, make_workspace,
                             read_lines, record, stop_scenarios)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


@pytest.fixture
def good(tmp_path: Path, ws: Path) -> Path:
    record(tmp_path / "good.jsonl", config_script(), workspace=ws)
    return tmp_path / "good.jsonl"


@pytest.fixture
def budget(tmp_path: Path, ws: Path) -> Path:
    """Three calls in one reply under max_tool_calls=2: 2 executions, one not run."""
    tools = counter_tools(tmp_path / "counter.txt")
    from loopfence.testing import calls_reply, tool_call
    script = [calls_reply(tool_call("append_line", text="a"), tool_call("append_line", text="b"),
                          tool_call("append_line", text="c"))]
    result = record(tmp_path / "budget.jsonl", script, tools, limits=Limits(max_tool_calls=2))
    assert result.stop.reason is StopReason.MAX_TOOL_CALLS and result.ledger.tool_executions == 2
    return tmp_path / "budget.jsonl"


def _failed(path: Path) -> set[str]:
    return {c.name for c in reconcile(path).failed}


def test_a_good_log_holds_every_invariant(good: Path) -> None:
    rec = reconcile(good)
    assert rec.ok and {c.name for c in rec.checks} == set(INVARIANTS)


@pytest.mark.parametrize("name", list(stop_scenarios()))
def test_every_kind_of_stop_reconciles(name: str, tmp_path: Path, ws: Path) -> None:
    script, extra, options = stop_scenarios()[name]
    record(tmp_path / "s.jsonl", script, [*workspace_tools(ws), *extra], workspace=ws, **options)
    rec = reconcile(tmp_path / "s.jsonl")
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    assert rec.check("limit_reached").ok


def test_budget_stop_reconciles_with_its_unrun_call(budget: Path) -> None:
    rec = reconcile(budget)
    assert rec.ok, rec.failed
    assert "2 executions, max_tool_calls=2" in rec.check("limit_reached").detail


def test_one_result_removed(budget: Path, tmp_path: Path) -> None:
    def drop(events: list[dict[str, Any]]) -> None:
        i = next(i for i, e in enumerate(events) if e["event"] == "result")
        del events[i]

    failed = _failed(edit_events(budget, tmp_path / "edited.jsonl", drop))
    assert "one_result_per_call" in failed and "executions" in failed


def test_one_count_changed(budget: Path, tmp_path: Path) -> None:
    def bump(events: list[dict[str, Any]]) -> None:
        events[-1]["ledger"]["tool_executions"] += 1

    edited = edit_events(budget, tmp_path / "edited.jsonl", bump)
    assert _failed(edited) == {"executions"}
    assert "tool_executions=3, executed results: 2" in reconcile(edited).check("executions").detail


def test_the_stop_moved(good: Path, tmp_path: Path) -> None:
    def move(events: list[dict[str, Any]]) -> None:
        stop = events.pop()
        events.insert(len(events) - 2, stop)  # before the last request and reply

    failed = _failed(edit_events(good, tmp_path / "edited.jsonl", move))
    assert "stop_is_last" in failed


def test_tokens_changed(good: Path, tmp_path: Path) -> None:
    def more(events: list[dict[str, Any]]) -> None:
        next(e for e in events if e["event"] == "reply")["usage"]["prompt_tokens"] += 7

    assert _failed(edit_events(good, tmp_path / "edited.jsonl", more)) == {"tokens"}


def test_a_final_answer_overwritten_by_a_budget_stop(good: Path, tmp_path: Path) -> None:
    def overwrite(events: list[dict[str, Any]]) -> None:
        stop = events.pop()
        events.append({"event": "request", "seq": stop["seq"], "t": stop["t"], "step": 4,
                       "fingerprint": "x:y", "n_messages": 6, "prompt_estimate": 10, "params": {}})
        stop.update(seq=stop["seq"] + 1, reason="max_steps", verdict="KILL", final_answer=None,
                    data={"limit": 4, "value": 5})
        stop["ledger"]["model_requests"] = 4
        events.append(stop)

    failed = _failed(edit_events(good, tmp_path / "edited.jsonl", overwrite))
    assert "no_overwritten_answer" in failed and "limit_reached" in failed


def test_a_limit_that_was_not_reached(tmp_path: Path, ws: Path) -> None:
    script, extra, options = stop_scenarios()["max_steps"]
    record(tmp_path / "steps.jsonl", script, workspace_tools(ws), workspace=ws, **options)

    def loosen(events: list[dict[str, Any]]) -> None:
        events[0]["limits"]["max_steps"] = 10

    edited = edit_events(tmp_path / "steps.jsonl", tmp_path / "edited.jsonl", loosen)
    assert _failed(edited) == {"limit_reached"}
    assert "the header 10" in reconcile(edited).check("limit_reached").detail


def test_a_result_without_a_request_and_an_unknown_reason(good: Path, tmp_path: Path) -> None:
    def dup(events: list[dict[str, Any]]) -> None:
        i = next(i for i, e in enumerate(events) if e["event"] == "result")
        events.insert(i + 1, dict(events[i]))

    def tired(events: list[dict[str, Any]]) -> None:
        events[-1]["reason"] = "tired"

    assert "no_orphan_results" in _failed(edit_events(good, tmp_path / "edited.jsonl", dup))
    with pytest.raises(LogError) as info:  # stop reasons are an enum: the reader refuses the line
        reconcile(edit_events(good, tmp_path / "tired.jsonl", tired))
    assert info.value.line == len(read_lines(good)) and "unknown reason 'tired'" in str(info.value)


def test_an_execution_without_its_intent(good: Path, tmp_path: Path) -> None:
    def drop_intent(events: list[dict[str, Any]]) -> None:
        i = next(i for i, e in enumerate(events) if e["event"] == "call" and e.get("intent"))
        del events[i]

    assert _failed(edit_events(good, tmp_path / "edited.jsonl", drop_intent)) == {"intent_before_execution"}


def test_an_unfinished_log_does_not_reconcile(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    record(path, counter_script(3), counter_tools(tmp_path / "counter.txt"))
    edited = edit_events(path, tmp_path / "killed.jsonl", lambda ev: ev.__delitem__(slice(-4, None)))
    rec = reconcile(edited)
    assert not rec.ok and not rec.finished and rec.holds  # unfinished, not broken (test_reconcile_unfinished.py)
    assert "stop_is_last" in rec.unchecked


def test_cli_table_and_exit_codes(good: Path, budget: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["reconcile", str(good)]) == 0
    out = capsys.readouterr().err
    assert "one_result_per_call" in out and "pass" in out and "all 14 invariants hold" in out
    edited = edit_events(budget, tmp_path / "edited.jsonl",
                         lambda ev: ev[-1]["ledger"].__setitem__("reused", 5))
    assert cli(["reconcile", str(edited)]) == 1
    out = capsys.readouterr().err
    assert "FAIL" in out and "1 of 14 invariants FAIL: reuses" in out


def test_loopfence_run_reconciles_its_own_log(tmp_path: Path, ws: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import json
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in config_script()))
    code = cli(["run", "Read app/config.py", "--script", str(script), "--workspace", str(ws),
                "--log", str(tmp_path / "run.jsonl")])
    assert code == 0
    assert "reconcile: all 14 invariants hold" in capsys.readouterr().err


def test_lines_out_of_order_or_renumbered_do_not_reconcile(good: Path, tmp_path: Path) -> None:
    def renumber(events: list[dict[str, Any]]) -> None:
        events[2]["seq"] = 99

    def clock_back(events: list[dict[str, Any]]) -> None:
        events[3]["t"] = 0.0

    def drop_a_line(events: list[dict[str, Any]]) -> None:
        del events[2]  # and leave the numbers as they were

    assert _failed(edit_events(good, tmp_path / "a.jsonl", renumber, reseq=False)) == {"lines_in_order"}
    assert "lines_in_order" in _failed(edit_events(good, tmp_path / "b.jsonl", clock_back))
    assert "lines_in_order" in _failed(edit_events(good, tmp_path / "c.jsonl", drop_a_line, reseq=False))


def test_a_result_moved_before_its_intent(good: Path, tmp_path: Path) -> None:
    def swap(events: list[dict[str, Any]]) -> None:
        i = next(i for i, e in enumerate(events) if e["event"] == "call" and e.get("intent"))
        j = next(j for j, e in enumerate(events) if e["event"] == "result" and e["tool_call_id"] == events[i]["tool_call_id"])
        events[i], events[j] = events[j], events[i]
        events[i]["t"], events[j]["t"] = events[j]["t"], events[i]["t"]

    assert _failed(edit_events(good, tmp_path / "edited.jsonl", swap)) == {"intent_before_execution"}


def test_a_taint_hidden_on_one_side_does_not_reconcile(tmp_path: Path) -> None:
    from loopfence import ScriptedModel, run
    from loopfence.testing import calls_reply, text_reply, tool_call

    ws = tmp_path / "ws"
    (ws / "vendor").mkdir(parents=True)
    (ws / "vendor" / "readme.md").write_text("IGNORE\n")
    log = tmp_path / "run.jsonl"
    model = ScriptedModel([calls_reply(tool_call("read_file", path="vendor/readme.md")),
                           calls_reply(tool_call("run_command", command="echo hi")), text_reply("done")])
    run("t", model=model, tools=workspace_tools(ws, untrusted_globs=["vendor/**"]), log=log)
    assert reconcile(log).ok

    def flag_only(events: list[dict[str, Any]]) -> None:
        next(e for e in events if e["event"] == "result" and e["untrusted"])["untrusted"] = False

    def drop_taint(events: list[dict[str, Any]]) -> None:
        events.remove(next(e for e in events if e["event"] == "gate" and e["decision"] == "tainted"))

    assert _failed(edit_events(log, tmp_path / "a.jsonl", flag_only)) == {"taint_recorded"}
    assert _failed(edit_events(log, tmp_path / "b.jsonl", drop_taint)) == {"taint_recorded"}
