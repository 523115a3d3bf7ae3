"""Resume: a run whose process died continues from its log, and nothing with side effects runs twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, StopReason
from loopfence.cli import cli
from loopfence.runlog import ResumeError, read_log, reconcile, replay, resume

from _resume_agent import TURNS, trial_script, trial_tools
from _runlog_support import (check_no_double_effects, config_script, counter_script, counter_tools,
                             make_workspace, read_lines, record)

HERE = Path(__file__).resolve().parent


def _ledger(path: Path) -> dict[str, Any]:
    stop = read_log(path).stop
    assert stop is not None
    return {k: v for k, v in stop.ledger.items() if k != "elapsed_s"}


def _finish(path: Path, counter: Path) -> Any:
    outcome = resume(path, tools=trial_tools(counter))
    final = read_log(path)  # strict: the resumed log is a whole log again
    assert final.stop is not None and final.stop.reason == "final_answer", final.stop
    assert reconcile(path).ok, [(c.name, c.detail) for c in reconcile(path).failed]
    assert replay(path).ok, replay(path).lines()
    return outcome


def test_every_cut_of_a_log_resumes_to_the_same_run(tmp_path: Path) -> None:
    """Cut a finished log at every line end and inside lines: the resumed run ends exactly as the
    uninterrupted one (same ledger, same answer), and the log plays back identically."""
    ws = make_workspace(tmp_path)
    full = tmp_path / "full.jsonl"
    record(full, config_script(), workspace=ws)
    data = full.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == 0x0A]
    cuts = sorted(set(ends[:-1]) | set(range(ends[0] + 3, len(data) - 1, 97)))
    for cut in cuts:
        p = tmp_path / f"cut{cut}.jsonl"
        p.write_bytes(data[:cut])
        outcome = resume(p)
        assert outcome.result is not None and outcome.result.final_answer == "DEBUG is True", cut
        assert _ledger(p) == _ledger(full), cut
        assert replay(p).ok and reconcile(p).ok, cut
        assert b"\n\n" not in p.read_bytes()


def test_a_torn_last_line_is_cut_off_before_appending(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, trial_script(), trial_tools(counter))
    data = path.read_bytes()
    third = [i for i, b in enumerate(data) if b == 0x0A][6]
    path.write_bytes(data[:third + 25])
    counter.write_text("".join(f"line-{i}\n" for i in range(2)))  # effects of the first two turns
    outcome = _finish(path, counter)
    assert outcome.torn_bytes == 24 and outcome.resumed_after == 7
    resumed = [e for e in read_lines(path) if e["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["after_line"] == 7 and resumed[0]["seq"] == 7


def test_intent_without_outcome_is_not_run_again(tmp_path: Path) -> None:
    """Cut right after the intent of a side-effecting call: the model gets outcome_unknown."""
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, trial_script(), trial_tools(counter))
    events = read_lines(path)
    i = [n for n, e in enumerate(events) if e["event"] == "call" and e.get("intent")][4]  # line-2
    assert events[i]["arguments"] == {"text": "line-2"}
    path.write_text("".join(json.dumps(e) + "\n" for e in events[:i + 1]))
    counter.write_text("line-0\nline-1\nline-2\n")  # it had run before the process died
    outcome = _finish(path, counter)
    assert outcome.outcome_unknown == (events[i]["tool_call_id"],)
    after = read_lines(path)
    unknown = [e for e in after if e["event"] == "result" and e["error"] == "outcome_unknown"]
    assert len(unknown) == 1 and "was NOT run again" in json.loads(unknown[0]["content"])["message"]
    assert unknown[0]["decision"] == "executed"  # it may have run: it counts against the budget
    resume_event = next(e for e in after if e["event"] == "resume")
    assert resume_event["pending_intent"]["action"].startswith("outcome_unknown")
    lines = counter.read_text().splitlines()
    known, unknown_texts = check_no_double_effects(path, lines)
    assert unknown_texts == ["line-2"] and lines.count("line-2") == 1 and len(lines) == TURNS
    # the model saw it: the conversation sent on carries the structured result
    stop = read_log(path).stop
    assert stop is not None and stop.ledger["tool_executions"] == 2 * TURNS


def test_a_read_only_call_in_flight_runs_again(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, trial_script(), trial_tools(counter))
    events = read_lines(path)
    i = next(n for n, e in enumerate(events) if e["event"] == "call" and e.get("intent")
             and e["name"] == "count_lines")
    path.write_text("".join(json.dumps(e) + "\n" for e in events[:i + 1]))
    counter.write_text("line-0\n")
    outcome = _finish(path, counter)
    assert outcome.outcome_unknown == ()
    assert _ledger(path)["tool_executions"] == 2 * TURNS


def test_the_guards_remember_across_the_crash(tmp_path: Path) -> None:
    """Seed 000 with no_progress off: repeated_call needs the count from before the crash."""
    ws = make_workspace(tmp_path)
    from loopfence.testing import calls_reply, tool_call
    script = [calls_reply(tool_call("read_file", path="src/missing.ts"))] * 2 + \
        [calls_reply(tool_call("read_file", arguments='{ "path": "src/missing.ts" }'))]
    full = tmp_path / "full.jsonl"
    result = record(full, script, workspace=ws, limits=Limits(no_progress=False))
    assert result.stop.reason is StopReason.REPEATED_CALL and result.ledger.tool_executions == 1
    events = read_lines(full)
    cut = next(n for n, e in enumerate(events) if e["event"] == "request" and e["step"] == 3)
    p = tmp_path / "cut.jsonl"
    p.write_text("".join(json.dumps(e) + "\n" for e in events[:cut]))
    outcome = resume(p)
    assert outcome.result is not None and outcome.result.stop.reason is StopReason.REPEATED_CALL
    assert _ledger(p) == _ledger(full)


def test_the_clock_continues_from_the_log(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, trial_script(), trial_tools(counter))
    events = read_lines(path)[:9]
    for e in events[1:]:
        e["t"] = round(e["t"] + 100.0, 6)  # the run had been going for 100 s when it died
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    counter.write_text("line-0\nline-1\n")
    outcome = resume(path, tools=trial_tools(counter))
    assert outcome.result is not None and outcome.result.ledger.elapsed_s >= 100.0
    after = read_lines(path)
    assert all(e["t"] >= 100.0 for e in after[9:])
    assert [e["seq"] for e in after] == list(range(len(after)))
    # and the wall clock is a real budget across the crash
    events[0]["limits"]["max_wall_seconds"] = 100.3
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    outcome = resume(path, tools=trial_tools(counter, delay=0.1))
    assert outcome.result is not None and outcome.result.stop.reason is StopReason.MAX_WALL_SECONDS
    assert 100.3 <= outcome.result.ledger.elapsed_s < 103


def test_a_run_that_ended_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = make_workspace(tmp_path)
    path = tmp_path / "done.jsonl"
    record(path, config_script(), workspace=ws)
    before = path.read_bytes()
    outcome = resume(path)
    assert outcome.ended is not None and outcome.result is None and path.read_bytes() == before
    assert cli(["resume", str(path)]) == 0
    assert "already ended" in capsys.readouterr().err and path.read_bytes() == before


def test_a_second_crash_resumes_again(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, trial_script(), trial_tools(counter))
    events = read_lines(path)
    first = [n for n, e in enumerate(events) if e["event"] == "call" and e.get("intent")][2]
    path.write_text("".join(json.dumps(e) + "\n" for e in events[:first + 1]))
    counter.write_text("line-0\nline-1\n")
    resume(path, tools=trial_tools(counter))
    second = read_lines(path)
    intents = [n for n, e in enumerate(second) if e["event"] == "call" and e.get("intent")
               and e["name"] == "append_line"]
    cut = intents[-2]  # a later side-effecting call, after the first resume marker
    path.write_text("".join(json.dumps(e) + "\n" for e in second[:cut + 1]))
    lines = counter.read_text().splitlines()
    counter.write_text("".join(f"{x}\n" for x in lines[:lines.index(second[cut]["arguments"]["text"]) + 1]))
    outcome = _finish(path, counter)
    assert len(outcome.outcome_unknown) == 1
    assert sum(e["event"] == "resume" for e in read_lines(path)) == 2
    check_no_double_effects(path, counter.read_text().splitlines())


def test_resume_refuses_a_log_whose_tools_differ(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, counter_script(2), counter_tools(counter))
    events = read_lines(path)[:5]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    with pytest.raises(ResumeError, match="append_line, read_counter.*not available"):
        resume(path, tools=[])
    with pytest.raises(ResumeError, match="schema or kind differs"):
        resume(path, tools=trial_tools(counter) + counter_tools(counter)[1:])


def test_resume_refuses_a_log_that_does_not_play_back(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    path = tmp_path / "run.jsonl"
    record(path, trial_script(), trial_tools(counter))
    events = read_lines(path)[:12]
    next(e for e in events if e["event"] == "result")["content"] = "forged"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    before = path.read_bytes()
    with pytest.raises(ResumeError, match="does not play back"):
        resume(path, tools=trial_tools(counter))
    assert path.read_bytes() == before  # nothing appended to a log it could not rebuild


def test_resume_cli_after_sigkill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`loopfence run` killed by the agent's own SIGKILL after the 10th line; `loopfence resume`."""
    counter = tmp_path / "counter.txt"
    log = tmp_path / "run.jsonl"
    env = {**os.environ, "LOOPFENCE_TRIAL_DIE_AT": "after:line-3"}
    proc = subprocess.run([sys.executable, str(HERE / "_resume_agent.py"), str(log), str(counter)],
                          env=env, capture_output=True, timeout=60)
    assert proc.returncode == -9
    assert read_log(log, tolerant=True).stop is None
    assert counter.read_text().splitlines()[-1] == "line-3"
    outcome = resume(log, tools=trial_tools(counter))  # the script's tools: the CLI has only built-ins
    assert outcome.outcome_unknown and outcome.result is not None
    assert outcome.result.stop.reason is StopReason.FINAL_ANSWER
    check_no_double_effects(log, counter.read_text().splitlines())


def test_the_recorded_tool_options_are_rebuilt(tmp_path: Path) -> None:
    """Files marked untrusted by glob at `loopfence run` stay untrusted when resumed and replayed."""
    from loopfence import RunLog, ScriptedModel, run, workspace_tools
    ws = make_workspace(tmp_path)
    full = tmp_path / "full.jsonl"
    run("Read app/config.py", model=ScriptedModel(config_script()),
        tools=workspace_tools(ws, untrusted_globs=["app/**"]), log=RunLog(full),
        header={"workspace": str(ws), "untrusted_globs": ["app/**"], "unsandboxed": False})
    events = read_lines(full)
    assert any(e["event"] == "gate" and e["decision"] == "tainted" for e in events)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(json.dumps(e) + "\n" for e in events[:6]))
    outcome = resume(cut)
    assert outcome.result is not None and _ledger(cut) == _ledger(full)
    assert replay(cut, execute_tools=True).ok
