"""A TypeScript agent loop (tests/ts/loop.ts: plain fetch, the four steps, its own tools doing real work
in a folder; written like seed 003's loop.ts) run with node against `loopfence proxy` in front of the
FakeServer serving the bench's scripts. The loop sends no loopfence header and knows nothing of the
fence: the runs are told apart by their conversations.

A fence that does not execute tools cannot serve a cached result, so the runaways stop at the rules'
minimum without the cache: 2, 2, at most 6, 0, 0, and at most 6 for the ping-pong (the third ask of
the same call is the one refused); the stop reaches the loop as a model's last answer (no tool calls)
naming the reason, so the loop ends as it ends on any answer. The four legitimate scripts reach their
answers. Every log the proxy leaves reconciles and replays.

With no --upstream the proxy answers from the embedded model (SmolLM2 in llama.cpp, in-process): seed
003's task through the same loop ends with a named stop, and its log reconciles (marked local_model).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import shutil

import pytest

from loopfence.runlog import read_log

from _local_support import SAMPLE_TASK, SAMPLE_WORKSPACE, needs_local_model, read_valid_log
from _proxy_support import (Proxy, ScriptServer, kinds_file, logs_in, node_modules, reconciles, replays, run_loop,
                            seed_workspace, stops_at_the_minimum, task)
from bench.scripts import HONEST, RUNAWAY  # _proxy_support put the root on sys.path

ANSWERS_EXECUTE = {"polling_8": 8, "paging_5": 5, "retry_changed_args": 3, "edit_and_test": 8}


@pytest.fixture(scope="module")
def fence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ScriptServer, Proxy, Path]]:
    """One upstream and one proxy for the module (logs in their own folder), as a user would run it."""
    node_modules()
    tmp = tmp_path_factory.mktemp("proxy-ts")
    logs = tmp / "logs"
    with ScriptServer() as upstream, Proxy("--upstream", upstream.base_url, "--logs", str(logs),
                                           "--kinds", str(kinds_file(tmp)), stderr=tmp / "proxy.err") as proxy:
        yield upstream, proxy, logs


def _run(fence: tuple[ScriptServer, Proxy, Path], name: str, tmp_path: Path, tag: str = "") -> tuple[dict[str, Any], Path]:
    _, proxy, logs = fence
    out = run_loop(proxy.base_url, seed_workspace(tmp_path / "ws"), task(name, tag))
    assert out["run"], f"no X-Loopfence-Run header on the answers: {out}"
    log = logs / f"{out['run']}.jsonl"
    assert log.is_file(), (out["run"], [p.name for p in logs_in(logs)], proxy.stderr())
    return out, log


@pytest.mark.parametrize("script", RUNAWAY, ids=lambda s: s.name)
def test_a_runaway_stops_at_the_rules_minimum_and_the_loop_ends_on_it(fence: Any, script: Any, tmp_path: Path) -> None:
    out, log = _run(fence, script.name, tmp_path)
    assert out["rc"] == 0, out  # the loop's own stop gate: an answer with no tool calls
    stops_at_the_minimum(script.name, out["executions"], out["stop"])  # X-Loopfence-Stop
    assert out["stop"] in out["answer"], out  # the text names the reason
    stop = read_log(log).stop
    assert stop is not None and stop.reason == out["stop"] and stop.verdict == "KILL", stop
    upstream = fence[0]
    assert upstream.by_script[script.name] <= out["turns"]  # a refused request never went upstream
    reconciles(log)
    replays(log)


@pytest.mark.parametrize("script", HONEST, ids=lambda s: s.name)
def test_a_legitimate_script_reaches_its_answer(fence: Any, script: Any, tmp_path: Path) -> None:
    out, log = _run(fence, script.name, tmp_path)
    answer = script.turn(out["turns"] - 1)
    assert isinstance(answer, str), out
    assert (out["rc"], out["answer"], out["stop"]) == (0, answer, None), out  # no false stop
    assert out["executions"] == ANSWERS_EXECUTE[script.name]
    assert fence[0].by_script[script.name] == out["turns"]  # every request went upstream once
    stop = read_log(log).stop
    assert stop is not None and stop.reason == "final_answer" and stop.verdict == "SHIP", stop
    reconciles(log)
    replays(log)


def test_edit_and_test_does_its_real_work_through_the_proxy(fence: Any, tmp_path: Path) -> None:
    """The loop's tools wrote the module four times and ran its tests: all four pass at the end."""
    out, _ = _run(fence, "edit_and_test", tmp_path, "again")
    assert out["answer"] == "all 4 tests pass after 4 rounds of edits"
    calc = (tmp_path / "ws" / "calc.py").read_text(encoding="utf-8").splitlines()
    assert len(calc) == 4 and all(line.endswith("# ok") for line in calc), calc


def test_every_log_the_proxy_left_reconciles_and_replays(fence: Any) -> None:
    """After the module's runs (this test runs last in the file): one log per run, each finished."""
    logs = logs_in(fence[2])
    assert len(logs) >= len(RUNAWAY) + len(HONEST)
    for log in logs:
        reconciles(log)
        replays(log)


@pytest.mark.local_model
@pytest.mark.skipif(needs_local_model[1].args[0], reason=needs_local_model[1].kwargs["reason"])
def test_the_embedded_default_ends_seed_003s_task_named(tmp_path: Path) -> None:
    """`loopfence proxy` with no --upstream (the embedded model), seed 003's task ("Make a note from
    pages/tl-intro.html") through the TypeScript loop: the loop ends on an answer (the model's, or the
    stop naming its reason), the run's log ends with one named stop, and it reconciles."""
    node_modules()
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE_WORKSPACE, ws)
    logs = tmp_path / "logs"
    with Proxy("--logs", str(logs), stderr=tmp_path / "proxy.err") as proxy:
        assert "(upstream: embedded; limits: coding)" in proxy.line, proxy.line
        out = run_loop(proxy.base_url, ws, SAMPLE_TASK)
    assert out["rc"] == 0 and out["run"], out  # the loop's stop gate: an answer with no tool calls
    assert [p.name for p in logs_in(logs)] == [f"{out['run']}.jsonl"]  # the one run, one log
    log = logs / f"{out['run']}.jsonl"
    stop = read_valid_log(log)[-1]
    assert out["stop"] == (None if stop["reason"] == "final_answer" else stop["reason"]), (out, stop)
    assert 0 < stop["ledger"]["model_requests"] <= out["turns"], (out, stop)  # the last may be a stop's answer
    assert read_log(log).header.record["proxy"]["upstream"] == "embedded"
    reconciles(log)
