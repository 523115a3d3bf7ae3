"""`loopfence batch` killed with SIGKILL at random points, then `--resume`: every episode appears
exactly once in results.jsonl, every log ends with its stop and reconciles, and the side-effect
counter (a custom tool given with --tools that appends its key to a file) shows that no side effect
ran twice: every call the model asks for has a key of its own, so a key seen twice in the file
would be an effect run again by the resume. Trials: 1 in the fast tier, 10 more in the slow tier."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from loopfence.runlog import reconcile

from _batch_support import episode_server, kinds, log_ledgers, result_rows, side_effects, write_episodes, \
    write_tools_module

N = 40
CONCURRENCY = 8
WAIT_S = 120  # a hang, not a timing: each wait is for the job to make progress at all


def _start(tmp: Path, *argv: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp), *sys.path]),
           "BATCH_SIDE_EFFECTS": str(tmp / "effects.txt"), "BATCH_TOOL_SLEEP": "0.01"}
    return subprocess.Popen([sys.executable, "-m", "loopfence", "batch", *argv, "--quiet"], cwd=tmp, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _rows_now(out: Path) -> int:
    try:
        return (out / "results.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _kill_after(proc: subprocess.Popen[bytes], out: Path, rows: int, rng: random.Random) -> bool:
    """SIGKILL once the job has `rows` rows (plus a random few ms); False if it ended first."""
    deadline = time.monotonic() + WAIT_S
    while _rows_now(out) < rows and proc.poll() is None:
        assert time.monotonic() < deadline, "the batch made no progress"
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.03))
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait(WAIT_S)
    return True


def _trial(tmp: Path, seed: int) -> None:
    rng = random.Random(seed)
    write_tools_module(tmp)
    # no "repeat" runaways here: they ask for one call twice on purpose (a key of its own per call)
    episodes = write_episodes(tmp / "episodes.jsonl", kinds(N, every=8, runaways=("fresh",)))
    kind = {e["id"]: e["metadata"]["kind"] for e in episodes}
    out = tmp / "job"
    with episode_server(delay_s=0.005) as url:
        first = _start(tmp, "episodes.jsonl", "--out", str(out), "--base-url", url, "--tools",
                       "batch_side_effects:TOOLS", "--concurrency", str(CONCURRENCY))
        killed = [_kill_after(first, out, rng.randint(1, N - 2 * CONCURRENCY), rng)]  # 2 waves still to go
        for _ in range(rng.choice([0, 1])):  # sometimes the resume is killed too
            again = _start(tmp, "--resume", str(out))
            killed.append(_kill_after(again, out, min(_rows_now(out) + rng.randint(1, 6), N - 1), rng))
        final = _start(tmp, "--resume", str(out))
        _, err = final.communicate(timeout=WAIT_S * 2)
        assert final.returncode == 0, err.decode()
    assert killed[0], "the first batch ended before it could be killed"

    rows = result_rows(out)
    assert Counter(r["id"] for r in rows) == Counter({e["id"]: 1 for e in episodes})  # exactly once
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == N and summary["finished"] == N and summary["pending"] == 0
    assert summary["resumed"] >= 1, "no episode was continued from its log: the kill tested nothing"

    ledgers = log_ledgers(out)
    assert set(ledgers) == set(kind)
    intents: Counter[str] = Counter()
    unknown = 0
    for ident in kind:
        path = out / "episodes" / f"{ident}.jsonl"
        check = reconcile(path)
        assert check.ok, (ident, [str(c) for c in check.failed])
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e["event"] == "call" and e.get("intent"):
                intents[e["arguments"]["key"]] += 1
            if e["event"] == "result" and e.get("error") == "outcome_unknown":
                unknown += 1
    for r in rows:
        led = ledgers[r["id"]]
        assert (r["requests"], r["executions"], r["tool_calls"]) == \
            (led["model_requests"], led["tool_executions"], led["tool_calls"])
        assert r["stop"] == "final_answer" if kind[r["id"]] == "normal" else r["verdict"] == "KILL", r

    effects = side_effects(tmp / "effects.txt")
    twice = {k: n for k, n in effects.items() if n > 1}
    assert not twice, f"side effects that ran more than once: {twice}"
    assert set(effects) <= set(intents), "an effect ran without its intent in a log"
    assert all(n == 1 for n in intents.values()), "a call was started twice"
    print(f"\nseed {seed}: killed {sum(killed)} time(s); resumed {summary['resumed']} episode(s), "
          f"{unknown} call(s) answered outcome_unknown, {sum(effects.values())} side effects")


def test_kill_then_resume_runs_every_episode_once_and_no_side_effect_twice(tmp_path: Path) -> None:
    _trial(tmp_path, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 110))
def test_kill_at_random_points_then_resume(tmp_path: Path, seed: int) -> None:
    _trial(tmp_path, seed)
