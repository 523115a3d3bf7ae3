"""Kill-and-resume trials: a real process running a real run is killed with SIGKILL, then resumed.

Every trial checks: the log reads back to its last complete line, resume finishes the run (or says
it had already ended), the finished log reconciles and replays identically, and no side-effecting
tool executed twice (a counter file outside the process is the witness).

Two runners: `_resume_agent.py` (loopfence.run with a side-effecting Python tool that appends to a
counter file; resumed in-process with the same tools) and the real CLI (`loopfence run` with the
built-in `run_command` appending to a file in the workspace; resumed with `loopfence resume`).
Kill points are spread over the run: stratified random delays after the header appears, plus
exact points (inside the tool before and after its effect, after the N-th log line).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopfence.runlog import read_log, reconcile, replay, resume

from _resume_agent import TURNS, trial_tools
from _runlog_support import check_no_double_effects, read_lines

HERE = Path(__file__).resolve().parent
LOOPFENCE = [sys.executable, "-c", "from loopfence.cli import main; main()"]  # `loopfence`, this Python
SLOW_TRIALS = 30
CLI_SLOW_TRIALS = 8
AGENT_DELAY = 0.02  # per tool, before and after its effect: a turn takes ~50 ms
AGENT_SPAN = 0.5  # kill within this long after the header appears
CLI_SPAN = 0.9


def _wait_for_header(path: Path, proc: subprocess.Popen[bytes], limit: float = 20.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and b"\n" in path.read_bytes()[:65536]:
            return
        time.sleep(0.003)


def _kill_after(proc: subprocess.Popen[bytes], log: Path, delay: float) -> str:
    _wait_for_header(log, proc)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return "killed" if proc.returncode == -9 else "finished"


def _check_readback(log: Path) -> str:
    """The log reads back to its last complete line; strict reading of that part succeeds."""
    data = log.read_bytes()
    back = read_log(log, tolerant=True)
    assert back.complete_bytes == data.rfind(b"\n") + 1 and back.torn_bytes == len(data) - back.complete_bytes
    last = back.events[-1].kind if back.events else "header"
    return last


def _agent_trial(tmp: Path, *, die_at: str | None = None, delay: float | None = None) -> tuple[str, int]:
    log, counter = tmp / "run.jsonl", tmp / "counter.txt"
    env = {**os.environ, "LOOPFENCE_TRIAL_DELAY_S": str(AGENT_DELAY)}
    if die_at:
        env["LOOPFENCE_TRIAL_DIE_AT"] = die_at
    proc = subprocess.Popen([sys.executable, str(HERE / "_resume_agent.py"), str(log), str(counter)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if delay is not None:
        _kill_after(proc, log, delay)
    proc.wait(timeout=60)
    last = _check_readback(log)
    outcome = resume(log, tools=trial_tools(counter))
    final = read_log(log)
    assert final.stop is not None and final.stop.reason == "final_answer", final.stop
    rec = reconcile(log)
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    report = replay(log)
    assert report.ok, report.lines()
    lines = counter.read_text().splitlines() if counter.exists() else []
    known, unknown = check_no_double_effects(log, lines)
    assert len(known) + len(unknown) == TURNS  # every turn's call executed exactly once
    assert final.stop.ledger["tool_executions"] == 2 * TURNS
    if outcome.ended is None:
        assert outcome.result is not None
    return last, len(outcome.outcome_unknown)


@pytest.mark.parametrize("die_at", ["before:line-2", "after:line-5", "event:9", "event:2"])
def test_agent_killed_at_exact_points(die_at: str, tmp_path: Path) -> None:
    last, unknown = _agent_trial(tmp_path, die_at=die_at)
    if die_at.startswith(("before", "after")):
        assert last == "call" and unknown == 1
    lines = (tmp_path / "counter.txt").read_text().splitlines()
    if die_at == "before:line-2":
        assert "line-2" not in lines  # it never ran, and was not run again: the model was told
    if die_at == "after:line-5":
        assert lines.count("line-5") == 1


@pytest.mark.parametrize("trial", range(3))
def test_agent_killed_at_random_fast(trial: int, tmp_path: Path) -> None:
    rng = random.Random(1000 + trial)
    _agent_trial(tmp_path, delay=AGENT_SPAN * (trial + rng.random()) / 3)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(SLOW_TRIALS))
def test_agent_killed_at_random(trial: int, tmp_path: Path) -> None:
    rng = random.Random(trial)
    _agent_trial(tmp_path, delay=AGENT_SPAN * (trial + rng.random()) / SLOW_TRIALS)


# -- the real CLI: `loopfence run` killed, `loopfence resume` -------------------------------------
def _cli_script(path: Path, turns: int) -> None:
    def call(i: int) -> dict[str, object]:
        cmd = f"sleep 0.03; echo line-{i} >> counter.txt; sleep 0.03; echo wrote line-{i}"  # distinct results
        return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "run_command", "arguments": json.dumps({"command": cmd})}}]},
            "finish_reason": "tool_calls"}]}

    final = {"choices": [{"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in [*(call(i) for i in range(turns)), final]))


def _cli_effects(log: Path) -> tuple[list[str], list[str]]:
    events = read_lines(log)
    label = {(e["step"], e["tool_call_id"]): re.search(r"line-\d+", e["arguments"]["command"]).group(0)
             for e in events if e["event"] == "call" and e.get("intent")}
    known, unknown = [], []
    for e in events:
        if e["event"] == "result" and e["decision"] == "executed":
            (unknown if e["error"] == "outcome_unknown" else known).append(label[(e["step"], e["tool_call_id"])])
    return known, unknown


def _cli_trial(tmp: Path, delay: float, turns: int = 5) -> None:
    ws, log, script = tmp / "ws", tmp / "run.jsonl", tmp / "script.jsonl"
    ws.mkdir()
    _cli_script(script, turns)
    proc = subprocess.Popen([*LOOPFENCE, "run", "Count.", "--script", str(script), "--workspace", str(ws),
                             "--log", str(log), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_after(proc, log, delay)
    _check_readback(log)
    done = subprocess.run([*LOOPFENCE, "resume", str(log), "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "already ended" in done.stderr or "reconcile: all 12 invariants hold" in done.stderr, done.stderr
    final = read_log(log)
    assert final.stop is not None and final.stop.reason == "final_answer", (final.stop, done.stderr)
    assert replay(log).ok
    counter = ws / "counter.txt"
    lines = counter.read_text().splitlines() if counter.exists() else []
    known, unknown = _cli_effects(log)
    assert len(lines) == len(set(lines)), f"a command ran twice: {lines}"
    assert all(lines.count(k) == 1 for k in known) and set(lines) - set(known) <= set(unknown)
    assert sorted(known + unknown) == sorted(f"line-{i}" for i in range(turns))


needs_sandbox = pytest.mark.skipif(shutil.which("bwrap") is None,
                                   reason="run_command needs bubblewrap (`make sandbox` installs it)")


@needs_sandbox
def test_cli_killed_and_resumed_fast(tmp_path: Path) -> None:
    _cli_trial(tmp_path, CLI_SPAN * random.Random(50).random())


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("trial", range(CLI_SLOW_TRIALS))
def test_cli_killed_and_resumed(trial: int, tmp_path: Path) -> None:
    _cli_trial(tmp_path, CLI_SPAN * (trial + random.Random(500 + trial).random()) / CLI_SLOW_TRIALS)
