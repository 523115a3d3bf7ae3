"""Reconcile on the log of a killed run: unfinished, not failed; what its lines show is checked; resume.
And the `--json` shapes of reconcile and replay (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopfence import Limits, StopReason
from loopfence.cli import cli
from loopfence.runlog import reconcile
from loopfence._drivers._reconcile import INVARIANTS, NEED_THE_STOP

from _runlog_support import (config_script, counter_script, counter_tools, edit_events, make_workspace,
                             read_lines, record, write_lines)

RECONCILE_KEYS = {"log", "finished", "ok", "holds", "checks", "unchecked", "custom_guards", "resume"}
REPLAY_KEYS = {"log", "ok", "same_stop", "what_if", "overrides", "recorded", "replayed", "divergence",
               "past_end", "executed", "lines"}


@pytest.fixture
def counter_log(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    result = record(path, counter_script(3), counter_tools(tmp_path / "counter.txt"))
    assert result.stop.reason is StopReason.FINAL_ANSWER
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.jsonl"
    record(path, config_script(), workspace=make_workspace(tmp_path))
    return path


def _cut(src: Path, dst: Path, keep: int) -> Path:
    """The first `keep` lines of a log: what a process killed after writing them leaves (each line is
    flushed as it is written)."""
    write_lines(dst, read_lines(src)[:keep])
    return dst


def test_every_prefix_of_a_log_that_reconciles_is_unfinished_and_holds(counter_log: Path, tmp_path: Path) -> None:
    lines = len(read_lines(counter_log))
    for keep in range(2, lines):  # the header alone up to everything but the stop line
        rec = reconcile(_cut(counter_log, tmp_path / f"k{keep}.jsonl", keep))
        assert not rec.finished and not rec.ok, keep
        assert rec.holds, (keep, [(c.name, c.detail) for c in rec.failed])
        assert set(rec.unchecked) == set(NEED_THE_STOP)
        assert {c.name for c in rec.checks} | set(rec.unchecked) == set(INVARIANTS)


def test_the_cli_says_unfinished_and_points_to_resume(counter_log: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    killed = _cut(counter_log, tmp_path / "killed.jsonl", 7)
    assert cli(["reconcile", str(killed)]) == 3
    err = capsys.readouterr().err
    assert "the run is unfinished" in err and f"loopfence resume {killed}" in err
    assert "FAIL" not in err and "unchecked" in err


def test_a_torn_last_line_is_an_unfinished_run_too(counter_log: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    text = counter_log.read_text().splitlines(keepends=True)
    torn = tmp_path / "torn.jsonl"
    torn.write_text("".join(text[:6]) + text[6][:25])  # killed mid-write
    assert cli(["reconcile", str(torn), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["finished"] is False and out["holds"] is True
    assert out["resume"] == f"loopfence resume {torn} --tools MODULE:ATTR"  # Python tools: the flag they need
    rec = reconcile(torn)
    assert rec.torn_bytes == 25 and rec.lines == 6


def test_what_the_prefix_shows_is_still_checked(counter_log: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix past a limit the header sets (the guards stop at step 1, the log goes on) fails
    limit_reached; one with an orphan result fails no_orphan_results. Exit 1, not 3."""
    def lower(events: list[dict]) -> None:
        events[0]["limits"]["max_steps"] = 1
        del events[-1]

    past = edit_events(counter_log, tmp_path / "past.jsonl", lower)
    rec = reconcile(past)
    assert not rec.finished and {c.name for c in rec.failed} == {"limit_reached"}
    assert "max_steps" in rec.check("limit_reached").detail
    assert cli(["reconcile", str(past)]) == 1
    assert "1 of the 8 invariants its lines can show FAIL: limit_reached" in capsys.readouterr().err

    def orphan(events: list[dict]) -> None:
        del events[-1]
        result = next(e for e in events if e["event"] == "result")
        events.append({**result, "seq": len(events), "tool_call_id": "call_nobody"})

    assert "no_orphan_results" in {c.name for c in reconcile(edit_events(counter_log, tmp_path / "o.jsonl",
                                                                          orphan)).failed}


def test_reconcile_json_has_one_shape(good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["reconcile", str(good), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # stdout is the JSON document alone; the table is on stderr
    assert set(out) == RECONCILE_KEYS and "invariant" in captured.err
    assert out["ok"] and out["finished"] and out["unchecked"] == [] and out["resume"] is None
    assert [c["name"] for c in out["checks"]] == list(INVARIANTS)
    assert all(set(c) == {"name", "ok", "detail", "description"} for c in out["checks"])
    edited = edit_events(good, tmp_path / "edited.jsonl", lambda ev: ev[-1]["ledger"].__setitem__("reused", 5))
    assert cli(["reconcile", str(edited), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert set(out) == RECONCILE_KEYS and not out["ok"] and not out["holds"]
    assert [c["name"] for c in out["checks"] if not c["ok"]] == ["reuses"]


def test_replay_json_has_one_shape(good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["replay", str(good), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert set(out) == REPLAY_KEYS and "replayed identically" in captured.err
    assert out["ok"] and out["same_stop"] and out["divergence"] is None
    assert out["recorded"]["reason"] == out["replayed"]["reason"] == "final_answer"
    assert out["recorded"]["step"] == out["replayed"]["step"] == 3
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text(good.read_text().replace("DEBUG = True", "DEBUG = False"))
    assert cli(["replay", str(tampered), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert set(out) == REPLAY_KEYS and not out["ok"] and out["replayed"] is None
    assert out["divergence"]["line"] > 1 and out["lines"][0] == "replay diverges from the log"
    assert cli(["replay", str(good), "--json", "--limit", "max_steps=1"]) == 0  # what-if: an answer
    out = json.loads(capsys.readouterr().out)
    assert out["what_if"] and out["overrides"] == {"max_steps": 1} and not out["same_stop"]
    assert out["replayed"]["reason"] == "max_steps"


def test_limits_in_a_killed_log_are_read_back_checked(counter_log: Path, tmp_path: Path) -> None:
    """A header whose limits the constructor refuses is named, not a crash."""
    def bad(events: list[dict]) -> None:
        events[0]["limits"]["max_steps"] = "5"
        del events[-1]

    rec = reconcile(edit_events(counter_log, tmp_path / "bad.jsonl", bad))
    assert not rec.check("limit_reached").ok
    assert "max_steps" in rec.check("limit_reached").detail
    assert Limits.from_json({"max_steps": 5}).max_steps == 5
