"""The benchmarks run (quick mode, loopfence's parts; peers only where installed) and loopfence's
behaviour in them is what the bench claims. No timing assertions: machines are noisy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "bench" / "run.py"
MINIMUM = {"retry_storm": 1, "duplicate_args": 1, "ok_forever": 6, "unknown_tool": 0, "truncated_json": 0,
           "ping_pong": 6}


def _bench(tmp_path: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--json", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    return _bench(tmp_path_factory.mktemp("bench"), "--frameworks", "loopfence")


def test_waste_is_at_the_rules_minimum(quick: tuple[str, dict]) -> None:
    results = quick[1]["Waste on runaway scripts"]["results"]["loopfence"]
    assert {name: r["executions"] for name, r in results.items()} == MINIMUM
    assert results["truncated_json"]["ended"].startswith("invalid_json")
    assert results["unknown_tool"]["ended"].startswith("unknown_tool")
    assert results["ok_forever"]["ended"].startswith("repeated_result")
    assert results["ping_pong"]["ended"].startswith("repeated_result")  # the cycle rule, not a budget


def test_no_false_stops(quick: tuple[str, dict]) -> None:
    results = quick[1]["No false stops"]["results"]["loopfence"]
    assert set(results) == {"polling_8", "paging_5", "retry_changed_args", "edit_and_test"}
    assert all(r["answer"] for r in results.values()), results
    assert results["edit_and_test"]["executions"] == 8


def test_overhead_stream_and_concurrency_report_numbers(quick: tuple[str, dict]) -> None:
    report, data = quick
    per_step = data["Overhead per step"]["per_step_us"]["loopfence"]
    assert all(v > 0 for v in per_step.values())
    assert data["Stream assembly"]["loopfence_s"]["sse"] > 0
    for level in data["Concurrency"].values():
        assert level["answered"] >= level["runs"]
        assert level["harness_us"] > 0
    assert {"arun-1", "arun-10"} <= set(data["Concurrency"])  # concurrent arun()s on one loop
    for title in ("## Waste on runaway scripts", "## No false stops", "## Overhead per step",
                  "## Stream assembly", "## Concurrency", "| loopfence |"):
        assert title in report


def test_peers_are_run_or_reported_missing(tmp_path: Path) -> None:
    report, data = _bench(tmp_path, "--only", "false_stops")
    results = data["No false stops"]["results"]
    for peer, dist in (("pydantic_ai", "pydantic-ai"), ("agents_sdk", "openai-agents"),
                       ("langchain", "langchain"), ("smolagents", "smolagents")):
        assert peer in results or "not installed" in report, (peer, dist)


def test_unknown_section_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, str(RUN), "--only", "nope"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "unknown 'nope'" in proc.stderr


def test_the_profile_drives_a_real_run_on_the_profiled_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile section samples the calling thread: it profiles `asyncio.run(arun(...))` with an
    async tool, whose ring, model and tool all run there, so the ring's own code is what it shows."""
    import threading

    monkeypatch.syspath_prepend(str(ROOT))
    from bench.common import Workspace
    from bench.frameworks import loopfence_fw
    from bench.scripts import overhead_script
    from bench.sections import profile

    threads: list[int] = []
    real = loopfence_fw.SourceModel.complete

    def where(self, request):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())
        return real(self, request)

    monkeypatch.setattr(loopfence_fw.SourceModel, "complete", where)
    with Workspace() as ws:
        go = loopfence_fw.prepare(overhead_script(3), ws, cap=100, unbounded=True, **profile.PROFILED)
        outcome = go()
    assert outcome.executions == 3 and outcome.answered
    assert threads == [threading.get_ident()] * 4

FLOOR = ROOT / "bench" / "proxy_floor.py"


def _floor(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(FLOOR), "--rounds", "1", "--stages", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _stages(out: str) -> dict[str, tuple[float, float]]:
    """The proxy's stage lines: label -> (median, mean) ms per request."""
    got = {}
    for line in out.splitlines():
        head, _, nums = line.rstrip().rpartition(" ")
        label, _, median = head.rstrip().rpartition(" ")
        if line.startswith("  ") and label.strip() and not label.strip().startswith("stage"):
            got[label.strip()] = (float(median), float(nums))
    return got


def test_the_proxy_floor_says_where_the_proxys_time_goes() -> None:
    """`bench/proxy_floor.py --stages`: every stage is timed on the proxy's requests, a nested stage
    within the one above it; at a length, only the requests carrying its window count (4 grown
    conversations: the requests carrying 7, 9, 11 and 13 messages), so no run's start is among them,
    where every short conversation's first request starts one."""
    grown = _floor("--length", "10", "--conversations", "4")
    assert "loopfence proxy    p50" in grown and "(16 requests)" in grown, grown
    at = _stages(grown)
    whole, answered = at["the whole request (ASGI call to its end)"], at["run placed, fenced and answered (Runs.answer)"]
    upstream, canned = at["upstream: body written, sent, reply read"], at["of which the canned upstream's own answer"]
    assert whole[1] > answered[1] > upstream[1] > canned[1] > 0, at
    for label in ("results through the guards, logged", "request's budgets, logged", "reply checked, logged",
                  "reply's calls prechecked (settle)", "of these: log events written", "of these: notes written"):
        assert 0 < at[label][1] < answered[1], (label, at)
    for label in ("request checked and read (parse: digests, view)", "body parsed (JSON)", "body weighed"):
        assert 0 < at[label][1] < whole[1] - answered[1], (label, at)
    assert at["run started (its first request)"] == (0.0, 0.0), at
    short = _stages(_floor("--conversations", "4"))
    assert short["run started (its first request)"][1] > 0, short  # one request in five starts its run
    under = _floor("--length", "10", "--conversations", "4", "--session", "ses_floor")  # a session's conversations
    assert "(16 requests)" in under and _stages(under)["run started (its first request)"] == (0.0, 0.0), under
