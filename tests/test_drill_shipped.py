"""The shipped drills (drills/*.json) all pass through the real CLI, and cover the seeds' rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopfence.cli import cli

DRILLS = Path(__file__).resolve().parent.parent / "drills"
REQUIRED = {"name", "stop", "verdict", "detail", "model_requests", "tool_calls", "tool_executions",
            "reused", "prompt_tokens", "completion_tokens", "elapsed_s", "calls", "pass", "mismatches"}


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    import contextlib
    import io

    out = tmp_path_factory.mktemp("drill")
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = cli(["drill", str(DRILLS), "--json", "--out", str(out)])
    lines = [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]
    assert rc == 0, "\n".join(f"{r['name']}: {r.get('mismatches')}" for r in lines if not r.get("pass")) \
        + err.getvalue()[-3000:]
    assert (out / "results.json").is_file()
    return lines


def test_every_shipped_scenario_passes(rows: list[dict]) -> None:
    files = sorted(DRILLS.glob("*.json"))
    assert len(rows) == len(files) >= 25
    for r in rows:
        assert REQUIRED <= set(r), r["name"]
        assert r["pass"] is True and r["mismatches"] == [], r
        assert Path(r["log"]).is_file()


def test_every_shipped_scenario_states_a_stop(rows: list[dict]) -> None:
    for r in rows:
        assert r.get("expected_stop"), f"{r['name']}: a shipped drill must expect a stop"


def test_the_seed_rows_are_covered(rows: list[dict]) -> None:
    stops = {r["stop"] for r in rows}
    assert {"incomplete_stream", "no_progress", "repeated_call", "max_tool_calls", "schema_mismatch",
            "max_steps", "final_answer", "empty_answer", "repeated_result", "max_prompt_tokens",
            "max_wall_seconds", "unknown_tool", "invalid_json"} <= stops
    names = {r["name"] for r in rows}
    for prefix in ("000-", "001-", "002-", "004-", "legit-poll", "legit-paging", "legit-retry"):
        assert any(n.startswith(prefix) for n in names), prefix


def test_legitimate_repetition_is_not_stopped_early(rows: list[dict]) -> None:
    legit = [r for r in rows if r["name"].startswith("legit-")]
    assert len(legit) >= 3
    for r in legit:
        assert r["stop"] == "final_answer" and r["verdict"] == "SHIP", r["name"]


def test_calls_carry_decisions(rows: list[dict]) -> None:
    by_name = {r["name"]: r for r in rows}
    seed001 = by_name["001-reordered-keys-and-defaults"]["calls"]
    assert [c["decision"] for c in seed001] == ["executed", "reused", "reused"]
    assert all(c["arguments"] == {"path": "app/config.py", "encoding": "utf-8", "page": 1} for c in seed001)
    unknown = by_name["000-unknown-tool"]["calls"]
    assert [(c["name"], c["decision"], c["ok"]) for c in unknown] == [("readFile", "rejected", False)]
