"""Kill-and-resume trials: a real process running a real run is killed with SIGKILL, then resumed.

Every trial checks: the log reads back to its last complete line, resume finishes the run (or says
it had already ended), the finished log reconciles and replays identically, and no side-effecting
tool executed twice (a counter file outside the process is the witness).

Two runners: `_resume_agent.py` (loopfence.run with a side-effecting Python tool that appends to a
counter file; resumed in-process with the same tools) and the real CLI (`loopfence run` with the
built-in `run_command` appending to a file in the workspace; resumed with `loopfence resume`).
Kill points are spread over the run: stratified random delays after the header appears, plus
exact points (inside the tool before and after its effect, after the N-th log line).

A kill that lands after the run ended proves nothing, so every trial says whether it really killed
the run mid-way (SIGKILL, and no stop event in the log), and the tests count: every fast-tier trial
and at least 80% of each slow tier's trials must have been killed mid-run. To make that hold on any
machine, the killed run is slowed with sleeps (the tool's, and the scripted model's via
LOOPFENCE_SCRIPTED_DELAY_S) whose sum is a lower bound on its length however fast the machine is,
and the random delays are spread over at most 90% of that bound. The resumes run without the delay.
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
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopfence.runlog import read_log, reconcile, replay, resume

from _resume_agent import TURNS, trial_tools
from _runlog_support import check_no_double_effects, read_lines

HERE = Path(__file__).resolve().parent
DELAY_ENV = "LOOPFENCE_SCRIPTED_DELAY_S"  # seconds each scripted reply takes (ScriptedModel)
LOOPFENCE = [sys.executable, "-c", "from loopfence.cli import main; main()"]  # `loopfence`, this Python
SLOW_TRIALS = 30
CLI_SLOW_TRIALS = 8
CLI_TURNS = 5
MIN_KILLED = 0.8  # of a slow tier's trials, killed mid-run (the fast tier: all of them)
AGENT_DELAY = 0.02  # per tool, before and after its effect
AGENT_MODEL_DELAY = 0.03  # per scripted reply (LOOPFENCE_SCRIPTED_DELAY_S in the killed process)
CLI_MODEL_DELAY = 0.05
CLI_SLEEP = 0.03  # each scripted command sleeps this long before and after its effect
# Header to stop takes at least the sum of the sleeps in between (one reply per turn plus the final
# one; append_line's two sleeps per turn, or the command's): kills before it land inside the run.
AGENT_MIN_RUN = (TURNS + 1) * AGENT_MODEL_DELAY + TURNS * 2 * AGENT_DELAY  # 0.59 s
CLI_MIN_RUN = (CLI_TURNS + 1) * CLI_MODEL_DELAY + CLI_TURNS * 2 * CLI_SLEEP  # 0.60 s
SPAN = 0.9  # random kills fall within this fraction of the minimum run


@dataclass(frozen=True)
class Trial:
    killed: bool  # SIGKILL landed while the run was going: no stop event in the log when it died
    last: str  # kind of the last complete event before resume
    unknown: int  # side-effecting calls resume reported as outcome_unknown


def _stratified(n: int, seed: int, min_run: float) -> list[float]:
    """n kill delays, one in each n-th of the first SPAN of the minimum run."""
    rng = random.Random(seed)
    return [min_run * SPAN * (i + rng.random()) / n for i in range(n)]


def _assert_mostly_killed(trials: list[Trial], delays: list[float]) -> None:
    killed = sum(t.killed for t in trials)
    missed = [round(d, 3) for t, d in zip(trials, delays) if not t.killed]
    assert killed >= MIN_KILLED * len(trials), (
        f"only {killed}/{len(trials)} trials were killed mid-run; finished first at delays {missed}")


def _wait_for_header(path: Path, proc: subprocess.Popen[bytes], limit: float = 20.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and b"\n" in path.read_bytes()[:65536]:
            return
        time.sleep(0.003)


def _kill_after(proc: subprocess.Popen[bytes], log: Path, delay: float) -> None:
    """SIGKILL `proc` `delay` seconds after its log's header appears, unless it has exited by then.
    Whether the kill landed mid-run is for the caller to judge: returncode -9 and no stop event."""
    _wait_for_header(log, proc)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _check_readback(log: Path) -> tuple[str, bool]:
    """The log reads back to its last complete line; strict reading of that part succeeds.
    Returns the last event's kind and whether the run had ended (a stop event)."""
    data = log.read_bytes()
    back = read_log(log, tolerant=True)
    assert back.complete_bytes == data.rfind(b"\n") + 1 and back.torn_bytes == len(data) - back.complete_bytes
    last = back.events[-1].event if back.events else "header"
    return last, back.stop is not None


def _agent_trial(tmp: Path, *, die_at: str | None = None, delay: float | None = None) -> Trial:
    log, counter = tmp / "run.jsonl", tmp / "counter.txt"
    env = {**os.environ, "LOOPFENCE_TRIAL_DELAY_S": str(AGENT_DELAY), DELAY_ENV: str(AGENT_MODEL_DELAY)}
    if die_at:
        env["LOOPFENCE_TRIAL_DIE_AT"] = die_at
    proc = subprocess.Popen([sys.executable, str(HERE / "_resume_agent.py"), str(log), str(counter)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if delay is not None:
        _kill_after(proc, log, delay)
    proc.wait(timeout=60)
    last, ended = _check_readback(log)
    killed = proc.returncode == -signal.SIGKILL and not ended
    outcome = resume(log, tools=trial_tools(counter))  # in this process: no scripted delay
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
    if killed:  # resume went live where the log ended and finished the run
        assert outcome.ended is None and outcome.result is not None
        assert len(final.of("resume")) == 1
    else:
        assert outcome.ended is not None and not final.of("resume")
    return Trial(killed, last, len(outcome.outcome_unknown))


@pytest.mark.parametrize("die_at", ["before:line-2", "after:line-5", "event:9", "event:2"])
def test_agent_killed_at_exact_points(die_at: str, tmp_path: Path) -> None:
    trial = _agent_trial(tmp_path, die_at=die_at)
    assert trial.killed
    if die_at.startswith(("before", "after")):
        assert trial.last == "call" and trial.unknown == 1
    lines = (tmp_path / "counter.txt").read_text().splitlines()
    if die_at == "before:line-2":
        assert "line-2" not in lines  # it never ran, and was not run again: the model was told
    if die_at == "after:line-5":
        assert lines.count("line-5") == 1


@pytest.mark.parametrize("trial", range(3))
def test_agent_killed_at_random_fast(trial: int, tmp_path: Path) -> None:
    delay = _stratified(3, 1000, AGENT_MIN_RUN)[trial]
    assert _agent_trial(tmp_path, delay=delay).killed, f"the run finished before the kill at {delay:.3f}s"


@pytest.mark.slow
def test_agent_killed_at_random(tmp_path: Path) -> None:
    delays = _stratified(SLOW_TRIALS, 0, AGENT_MIN_RUN)
    trials = []
    for i, delay in enumerate(delays):
        (tmp_path / str(i)).mkdir()
        try:
            trials.append(_agent_trial(tmp_path / str(i), delay=delay))
        except AssertionError as exc:
            raise AssertionError(f"trial {i} (kill {delay:.3f}s after the header): {exc}") from exc
    _assert_mostly_killed(trials, delays)


# -- the real CLI: `loopfence run` killed, `loopfence resume` -------------------------------------
def _cli_script(path: Path, turns: int) -> None:
    def call(i: int) -> dict[str, object]:
        cmd = f"sleep {CLI_SLEEP}; echo line-{i} >> counter.txt; sleep {CLI_SLEEP}; echo wrote line-{i}"
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


def _cli_trial(tmp: Path, delay: float, turns: int = CLI_TURNS) -> Trial:
    ws, log, script = tmp / "ws", tmp / "run.jsonl", tmp / "script.jsonl"
    ws.mkdir()
    _cli_script(script, turns)
    env = {k: v for k, v in os.environ.items() if k != DELAY_ENV}
    proc = subprocess.Popen([*LOOPFENCE, "run", "Count.", "--script", str(script), "--workspace", str(ws),
                             "--log", str(log), "--quiet"], env={**env, DELAY_ENV: str(CLI_MODEL_DELAY)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_after(proc, log, delay)
    last, ended = _check_readback(log)
    killed = proc.returncode == -signal.SIGKILL and not ended
    done = subprocess.run([*LOOPFENCE, "resume", str(log)], env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    if killed:  # resumed and finished live, then reconciled
        assert "already ended" not in done.stderr and "reconcile: all 14 invariants hold" in done.stderr, done.stderr
    else:
        assert "already ended" in done.stderr, done.stderr
    final = read_log(log)
    assert len(final.of("resume")) == int(killed)
    assert final.stop is not None and final.stop.reason == "final_answer", (final.stop, done.stderr)
    assert replay(log).ok
    counter = ws / "counter.txt"
    lines = counter.read_text().splitlines() if counter.exists() else []
    known, unknown = _cli_effects(log)
    assert len(lines) == len(set(lines)), f"a command ran twice: {lines}"
    assert all(lines.count(k) == 1 for k in known) and set(lines) - set(known) <= set(unknown)
    assert sorted(known + unknown) == sorted(f"line-{i}" for i in range(turns))
    return Trial(killed, last, len(unknown))


needs_sandbox = pytest.mark.skipif(shutil.which("bwrap") is None,
                                   reason="run_command needs bubblewrap (`make sandbox` installs it)")


@needs_sandbox
def test_cli_killed_and_resumed_fast(tmp_path: Path) -> None:
    delay = CLI_MIN_RUN * SPAN * (0.25 + 0.5 * random.Random(50).random())
    assert _cli_trial(tmp_path, delay).killed, f"the run finished before the kill at {delay:.3f}s"


@pytest.mark.slow
@needs_sandbox
def test_cli_killed_and_resumed(tmp_path: Path) -> None:
    delays = _stratified(CLI_SLOW_TRIALS, 500, CLI_MIN_RUN)
    trials = []
    for i, delay in enumerate(delays):
        (tmp_path / str(i)).mkdir()
        try:
            trials.append(_cli_trial(tmp_path / str(i), delay))
        except AssertionError as exc:
            raise AssertionError(f"trial {i} (kill {delay:.3f}s after the header): {exc}") from exc
    _assert_mostly_killed(trials, delays)
