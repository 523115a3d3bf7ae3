"""Issue 30: named limit profiles sized from real runs. The recorded real runs, their lifted budgets
removed, replayed under the defaults, `Limits.coding()` and `Limits.chat()`; the docs' tables agree
with the code and with the replay; `--limits NAME` on `run` and `batch`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopfence import Limits
from loopfence.cli import cli
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

ROOT = Path(__file__).resolve().parents[1]
REAL_RUNS = ROOT / "tests" / "data" / "real-runs"
SHARED = ROOT.parent / "shared" / "fixtures" / "real-runs"  # where the recordings were first shared
PAGE = ROOT / "docs" / "limit-profiles.md"
EXE = [sys.executable, "-m", "loopfence"]
BUDGETS = ("max_steps", "max_tool_calls", "max_prompt_tokens", "max_completion_tokens",
           "max_tokens_per_request", "max_wall_seconds", "tool_timeout_s")


# ---------------------------------------------------------------------------- the profiles
def test_a_profile_changes_only_the_budgets_and_each_raises_them() -> None:
    assert Limits.profiles() == ("default", "coding", "chat")
    assert Limits.profile("default") == Limits()
    assert Limits.profile("coding") == Limits.coding() and Limits.profile("chat") == Limits.chat()
    base = Limits().to_json()
    for name in ("coding", "chat"):
        values = Limits.profile(name).to_json()
        changed = {k for k in base if values[k] != base[k]}
        assert changed and changed <= set(BUDGETS), (name, changed)
        assert all(values[k] >= base[k] for k in BUDGETS), name  # a profile for real work never tightens
    coding, chat = Limits.coding(), Limits.chat()
    assert coding.max_steps > 125 and chat.max_steps > 17  # the longest resolved run; the tau-bench p90
    assert all(getattr(coding, k) >= getattr(chat, k) for k in BUDGETS)


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown limit profile 'cod' \(known: default, coding, chat\)"):
        Limits.profile("cod")


@given(st.sampled_from(Limits.profiles()), st.integers(0, 10_000))
def test_a_profile_is_a_limits_that_replace_changes(name: str, steps: int) -> None:
    limits = Limits.profile(name).replace(max_steps=steps)
    assert limits.max_steps == steps
    assert Limits.from_json(limits.to_json()) == limits
    assert {k: v for k, v in limits.to_json().items() if k != "max_steps"} == \
        {k: v for k, v in Limits.profile(name).to_json().items() if k != "max_steps"}


# ---------------------------------------------------------------------------- the real runs
def test_every_shared_real_run_is_in_the_tests_data() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not here (a clone without the shared fixtures)")
    shared = sorted(p.name for p in SHARED.glob("*.json"))
    assert len(shared) == 8
    sources = (REAL_RUNS / "SOURCES.md").read_text(encoding="utf-8")
    for name in shared:
        assert (REAL_RUNS / name).read_bytes() == (SHARED / name).read_bytes(), name
        assert name in sources, name


def _replay(tmp_path: Path, profile: str | None) -> dict[str, dict[str, Any]]:
    """Every real run through `loopfence drill`, its file's `limits` replaced by the profile's
    (None: removed, the defaults); name -> the drill's row."""
    folder = tmp_path / (profile or "removed")
    folder.mkdir()
    for f in sorted(REAL_RUNS.glob("*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        del data["limits"]  # what each file lifted to let only the repetition rules stop it
        if profile is not None:
            data["limits"] = Limits.profile(profile).to_json()
        (folder / f.name).write_text(json.dumps(data), encoding="utf-8")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        cli(["drill", str(folder), "--json", "--out", str(tmp_path / f"{folder.name}-out")])
    rows = [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]
    assert len(rows) == 8
    return {r["name"]: r for r in rows}


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("profiles")
    return {name: _replay(tmp, None if name == "default" else name) for name in Limits.profiles()}


def _stop_line(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(Path(row["log"]).read_text(encoding="utf-8").splitlines()[-1])


def test_all_real_runs_finish_under_the_coding_profile(replays: dict[str, Any]) -> None:
    rows = replays["coding"]
    assert {n: r["stop"] for n, r in rows.items()} == dict.fromkeys(rows, "final_answer")
    for name, row in rows.items():
        assert row["verdict"] == "SHIP", (name, row["detail"])
        rec = reconcile(row["log"])
        assert rec.ok, (name, [(c.name, c.detail) for c in rec.failed])


def test_one_real_run_finishes_under_the_defaults_the_others_stop_at_a_budget(replays: dict[str, Any]) -> None:
    """Observed by running the replay: the short issue fix finishes; the coding runs spend the
    cumulative prompt budget by their 9th to 11th request, and the two with short prompts (the
    sphinx run, the tau-bench conversation) reach max_steps first."""
    rows = replays["default"]
    stops = {n: (r["stop"], _stop_line(r)["ledger"]["model_requests"]) for n, r in rows.items()}
    assert stops == {
        "mini-github-issue-test-repo-1": ("final_answer", 11),
        "mini-gemini3pro-astropy__astropy-12907": ("max_prompt_tokens", 9),
        "mini-gemini3pro-django__django-13297": ("max_prompt_tokens", 9),
        "mini-gemini3pro-sympy__sympy-17655": ("max_prompt_tokens", 10),
        "openhands-resolver-pr-viewer-1-dark-mode": ("max_prompt_tokens", 11),
        "sweagent-pydicom-1458": ("max_prompt_tokens", 10),
        "mini-gemini3pro-sphinx-doc__sphinx-8595": ("max_steps", 12),
        "tau-airline-gpt4o-102": ("max_steps", 12),
    }
    for name, row in rows.items():  # each stop names its limit and the default's value, and is right to
        ledger = _stop_line(row)["ledger"]
        if row["stop"] == "max_prompt_tokens":
            assert "max_prompt_tokens=60000" in row["detail"], row["detail"]
            estimate = int(re.search(r"~(\d+) estimated", row["detail"]).group(1))
            assert ledger["prompt_tokens"] <= 60_000 < ledger["prompt_tokens"] + estimate, name
        elif row["stop"] == "max_steps":
            assert "max_steps=12" in row["detail"] and ledger["model_requests"] == 12, name
        assert row["stop"] == "final_answer" or row["verdict"] == "KILL", name


# ---------------------------------------------------------------------------- the docs agree
def _table(header_start: str) -> list[list[str]]:
    """The rows of the docs page's table whose header row starts with `header_start`."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_the_docs_table_gives_each_profiles_values() -> None:
    rows = _table("| limit |")
    assert [r[0] for r in rows] == list(BUDGETS)
    for name, default, coding, chat in rows:
        for profile, stated in (("default", default), ("coding", coding), ("chat", chat)):
            assert float(stated) == getattr(Limits.profile(profile), name), (name, profile, stated)


def test_the_docs_replay_table_says_what_the_replay_does(replays: dict[str, Any]) -> None:
    rows = _table("| run |")
    assert sorted(r[0] for r in rows) == sorted(replays["default"])
    unbudgeted = replays["coding"]  # every run finishes there: its whole run's counts
    for name, requests, prompt_sum, largest, *stated in rows:
        stop = _stop_line(unbudgeted[name])
        per_step = [p for p, _ in stop["per_step"]]
        assert (int(requests), int(prompt_sum.replace(",", "")), int(largest.replace(",", ""))) == \
            (stop["ledger"]["model_requests"], stop["ledger"]["prompt_tokens"], max(per_step)), name
        for profile, said in zip(Limits.profiles(), stated):
            row = replays[profile][name]
            n = _stop_line(row)["ledger"]["model_requests"]
            assert said == (row["stop"] if row["stop"] == "final_answer" else f"{row['stop']} after {n}"), \
                (name, profile)


# ---------------------------------------------------------------------------- the command line
def _loopfence(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPFENCE_", "OPENAI_"))}
    return subprocess.run([*EXE, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    replies = [calls_reply(tool_call("list_dir", path=".")), text_reply("done")]
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


def test_run_limits_picks_the_profile_and_limit_flags_change_it(tmp_path: Path) -> None:
    script = _script(tmp_path)
    p = _loopfence(tmp_path, "run", "t", "--script", str(script), "--log", "r.jsonl", "--quiet",
                   "--limits", "coding", "--limit", "max_steps=60")
    assert p.returncode == 0, p.stderr
    header = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert header["limits"] == Limits.coding().replace(max_steps=60).to_json()


def test_run_with_an_unknown_profile_is_a_usage_error_naming_the_known_ones(tmp_path: Path) -> None:
    p = _loopfence(tmp_path, "run", "t", "--script", str(_script(tmp_path)), "--log", "r.jsonl",
                   "--limits", "codng")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "--limits codng" in p.stderr and "(known: default, coding, chat)" in p.stderr, p.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_batch_limits_is_every_episodes_base_and_is_recorded(tmp_path: Path) -> None:
    script = _script(tmp_path)
    (tmp_path / "eps.jsonl").write_text(json.dumps({"id": "e1", "task": "t"}) + "\n"
                                        + json.dumps({"id": "e2", "task": "t", "limits": {"max_steps": 7}}) + "\n")
    p = _loopfence(tmp_path, "batch", "eps.jsonl", "--out", "job", "--script", str(script), "--quiet",
                   "--limits", "chat", "--limit", "max_tool_calls=9")
    assert p.returncode == 0, p.stderr
    headers = {f.stem: json.loads(f.read_text().splitlines()[0]) for f in (tmp_path / "job").rglob("e?.jsonl")}
    assert headers["e1"]["limits"] == Limits.chat().replace(max_tool_calls=9).to_json()
    assert headers["e2"]["limits"] == Limits.chat().replace(max_tool_calls=9, max_steps=7).to_json()
    job = json.loads((tmp_path / "job" / "job.json").read_text())
    assert job["settings"]["limits_profile"] == "chat"
    again = _loopfence(tmp_path, "batch", "--resume", "job", "--limits", "coding")
    assert again.returncode == 2 and "--limits" in again.stderr and "Traceback" not in again.stderr, again.stderr
