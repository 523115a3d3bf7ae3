"""Reconcile re-checks the stop with the guards the ring runs, fed the log (issue 14, must-show 2).

There is no second copy of the stop rules: the log is folded through the ring (`_drivers/_refold`),
and the guards are asked where the ring asks them. So a hand edit that makes a run go on past a
limit, stop one step early, or claim repeats that the replies do not show is caught, and changing a
guard changes what reconcile accepts.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence import Guard, Limits, RunLog, ScriptedModel, Stop, StopReason, run, tool, workspace_tools
from loopfence._drivers._refold import FROM_OUTSIDE, refold
from loopfence.runlog import read_log, reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

from _runlog_support import config_script, edit_events, make_workspace, read_lines, record, stop_scenarios

SRC = Path(__file__).resolve().parent.parent / "src" / "loopfence"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


def _failed(path: Path, **kw: Any) -> set[str]:
    return {c.name for c in reconcile(path, **kw).failed}


def _limit(path: Path, **kw: Any) -> Any:
    return reconcile(path, **kw).check("limit_reached")


def _dirs(n: int) -> list[dict[str, Any]]:
    return [calls_reply(tool_call("list_dir", path=f"d{i}")) for i in range(n)]


def _run_tests_tool() -> Any:
    def run_tests(cmd: str) -> str:
        """Run the tests (a side effect: nothing is cached)."""
        return "1 failed"

    return tool(run_tests)


def _fix_ledger(events: list[dict[str, Any]]) -> None:
    """After removing events: the stop's ledger as the remaining events count it (every call here
    has one result, none rejected)."""
    stop = events[-1]
    replies = [e for e in events if e["event"] == "reply"]
    results = [e for e in events if e["event"] == "result"]
    per_step = [[r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]] for r in replies]
    stop["ledger"].update(
        model_requests=sum(e["event"] == "request" for e in events), tool_calls=len(results),
        tool_executions=sum(r["decision"] == "executed" for r in results),
        reused=sum(r["decision"] == "reused" for r in results),
        refused=sum(r["decision"] == "refused" for r in results), rejected=0,
        prompt_tokens=sum(p for p, _ in per_step), completion_tokens=sum(c for _, c in per_step))
    stop["per_step"] = per_step


# ---------------------------------------------------------------------------- no second copy
def test_there_is_no_second_copy_of_the_stop_rules() -> None:
    assert importlib.util.find_spec("loopfence._drivers._stopcheck") is None
    # the repetition rules are applied by the guards only: nothing that reads logs back uses them
    for folder in ("_log", "_drivers"):
        for path in (SRC / folder).glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not any(m.endswith("_repeats") for m in names), f"{path.name} imports the repetition rules"


def test_reconcile_asks_the_step_guard_the_ring_runs(tmp_path: Path, ws: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    record(tmp_path / "steps.jsonl", _dirs(6), workspace_tools(ws), limits=Limits(max_steps=3))
    assert reconcile(tmp_path / "steps.jsonl").ok
    from loopfence._guards import StepLimit

    def stricter(self: StepLimit, s: Any) -> Stop | None:  # one request fewer than the limit says
        n = s.ledger.model_requests
        if self.limit is not None and n >= self.limit - 1:
            return Stop(StopReason.MAX_STEPS, "stricter", {"limit": self.limit, "value": n + 1})
        return None

    monkeypatch.setattr(StepLimit, "before_request", stricter)
    check = _limit(tmp_path / "steps.jsonl")
    assert not check.ok
    assert "stops here with max_steps (stricter)" in check.detail and "the log goes on" in check.detail


def test_reconcile_asks_the_repetition_rules_the_guards_apply(tmp_path: Path, ws: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    script, extra, options = stop_scenarios()["repeated_call"]
    record(tmp_path / "rep.jsonl", script, [*workspace_tools(ws), *extra], workspace=ws, **options)
    assert reconcile(tmp_path / "rep.jsonl").ok
    from loopfence._repeats import RepeatCounts

    counted = RepeatCounts.asked

    def twice(self: RepeatCounts, keys: Any) -> None:
        keys = list(keys)
        counted(self, keys)
        counted(self, keys)

    monkeypatch.setattr(RepeatCounts, "asked", twice)  # the rule changes: reconcile's verdict follows
    check = _limit(tmp_path / "rep.jsonl")
    assert not check.ok and "stops here with repeated_call" in check.detail


def test_a_stop_made_by_a_guard_is_that_guards_own_stop(tmp_path: Path, ws: Path) -> None:
    """For every kind of stop, the ring, fed the log, makes the stop the recorded run made: the same
    reason, detail and data; only a stop from outside the ring (a cancel) is taken from the log."""
    for name, (script, extra, options) in stop_scenarios().items():
        path = tmp_path / f"{name}.jsonl"
        record(path, script, [*workspace_tools(ws), *extra], workspace=ws, **options)
        log = read_log(path)
        verdict = refold(log)
        assert verdict.ok and verdict.stop is not None, (name, verdict.detail)
        recorded = log.stop
        assert recorded is not None and verdict.stop.reason == recorded.reason, name
        assert verdict.decided == (name != "cancelled"), name  # Ctrl-C while a tool ran: the log's word
        if recorded.reason != StopReason.MAX_WALL_SECONDS:  # the clock's reading is not the log's
            assert (verdict.stop.detail, verdict.stop.data) == (recorded.detail, recorded.data), name


@pytest.mark.parametrize("reason", list(StopReason))
def test_only_a_reason_from_outside_the_ring_is_taken_from_the_log(reason: StopReason, tmp_path: Path,
                                                                    ws: Path) -> None:
    """A stop right after a request, where only the model call could have ended the run: earned for
    what an endpoint, a cut stream, Ctrl-C or a bug end a run with; for a guard's reason, no guard
    stopped there."""
    record(tmp_path / "good.jsonl", config_script(), workspace=ws)

    def cut(events: list[dict[str, Any]]) -> None:
        stop = events[-1]
        first = next(i for i, e in enumerate(events) if e["event"] == "request")
        del events[first + 1:]
        stop.update(seq=len(events), reason=str(reason), detail="edited", data={}, final_answer=None,
                    verdict="SHIP" if reason is StopReason.FINAL_ANSWER else "KILL")
        events.append(stop)
        _fix_ledger(events)

    edited = edit_events(tmp_path / "good.jsonl", tmp_path / "edited.jsonl", cut)
    check = _limit(edited)
    assert check.ok == (reason in FROM_OUTSIDE), check.detail
    assert _failed(edited) == (set() if reason in FROM_OUTSIDE else {"limit_reached"})


def test_the_reasons_taken_from_the_log_are_none_of_the_rings_own() -> None:
    """The reasons taken from the log are none of the guards' budgets and repetition rules."""
    guards_own = {StopReason.MAX_STEPS, StopReason.MAX_TOOL_CALLS, StopReason.MAX_PROMPT_TOKENS,
                  StopReason.MAX_COMPLETION_TOKENS, StopReason.MAX_WALL_SECONDS, StopReason.REPEATED_CALL,
                  StopReason.REPEATED_RESULT, StopReason.NO_PROGRESS, StopReason.FINAL_ANSWER,
                  StopReason.EMPTY_ANSWER}
    assert not FROM_OUTSIDE & guards_own


# ---------------------------------------------------------------------------- hand edits caught
def test_a_run_that_went_on_past_its_limit_is_caught(tmp_path: Path, ws: Path) -> None:
    """As if the stop line had been cut from the middle and the run gone on: four steps and an
    answer, under a header that says max_steps=3. Every count adds up; the guards stop at step 4."""
    record(tmp_path / "long.jsonl", [*_dirs(4), text_reply("done")], workspace_tools(ws),
           limits=Limits(max_steps=12))
    assert reconcile(tmp_path / "long.jsonl").ok

    def tighten(events: list[dict[str, Any]]) -> None:
        events[0]["limits"]["max_steps"] = 3

    edited = edit_events(tmp_path / "long.jsonl", tmp_path / "edited.jsonl", tighten)
    assert _failed(edited) == {"limit_reached"}
    fourth = next(e for e in read_lines(edited) if e["event"] == "request" and e["step"] == 4)
    detail = _limit(edited).detail
    assert f"line {fourth['seq'] + 1}: the ring, fed the log, stops here with max_steps" in detail
    assert "the log goes on to stop final_answer" in detail


def test_a_max_steps_stop_one_step_early_is_caught(tmp_path: Path, ws: Path) -> None:
    record(tmp_path / "steps.jsonl", _dirs(6), workspace_tools(ws), limits=Limits(max_steps=3))

    def early(events: list[dict[str, Any]]) -> None:
        events[:] = [e for e in events if e.get("step") != 3]
        for i, e in enumerate(events):
            e["seq"] = i
        events[-1]["data"] = {"limit": 3, "value": 3}
        _fix_ledger(events)

    edited = edit_events(tmp_path / "steps.jsonl", tmp_path / "edited.jsonl", early)
    assert read_lines(edited)[-1]["ledger"]["model_requests"] == 2
    assert _failed(edited) == {"limit_reached"}
    detail = _limit(edited).detail
    assert "the log stops max_steps, but no guard stops there" in detail and '"step": 3' in detail


def test_a_repeated_call_stop_without_the_repeats_is_caught(tmp_path: Path) -> None:
    """The second reply asked for another call; the call lines still name the repeated one. The
    guards count what the replies asked: the third ask is the second, no stop."""
    r = run("fix it", model=ScriptedModel([calls_reply(tool_call("run_tests", cmd="pytest -q"))]),
            tools=[_run_tests_tool()], log=RunLog(tmp_path / "run.jsonl"))
    assert r.stop.reason is StopReason.REPEATED_CALL and r.ledger.model_requests == 3
    assert reconcile(tmp_path / "run.jsonl").ok

    def other(events: list[dict[str, Any]]) -> None:
        reply = next(e for e in events if e["event"] == "reply" and e["step"] == 2)
        call = reply["raw"]["choices"][0]["message"]["tool_calls"][0]
        call["function"]["arguments"] = json.dumps({"cmd": "pytest -x"})

    edited = edit_events(tmp_path / "run.jsonl", tmp_path / "edited.jsonl", other)
    assert _failed(edited) == {"limit_reached"}
    assert "the log stops repeated_call where the ring, fed the log, goes on" in _limit(edited).detail


def test_a_repeated_call_stop_under_a_higher_max_repeats_is_caught(tmp_path: Path) -> None:
    run("fix it", model=ScriptedModel([calls_reply(tool_call("run_tests", cmd="pytest -q"))]),
        tools=[_run_tests_tool()], log=RunLog(tmp_path / "run.jsonl"))
    edited = edit_events(tmp_path / "run.jsonl", tmp_path / "edited.jsonl",
                         lambda ev: ev[0]["limits"].__setitem__("max_repeats", 4))
    assert _failed(edited) == {"limit_reached"}
    assert "the log stops repeated_call where the ring, fed the log, goes on" in _limit(edited).detail


def test_a_wall_clock_stop_before_the_limit_is_caught(tmp_path: Path, ws: Path) -> None:
    """The clock is the one input the log holds only as numbers: the guard is asked at the stop's t."""
    script, extra, options = stop_scenarios()["max_wall_seconds"]
    record(tmp_path / "wall.jsonl", script, [*workspace_tools(ws), *extra], workspace=ws, **options)
    assert reconcile(tmp_path / "wall.jsonl").ok

    def later_limit(events: list[dict[str, Any]]) -> None:
        events[0]["limits"]["max_wall_seconds"] = events[-1]["t"] + 60.0
        events[-1]["data"]["limit"] = events[0]["limits"]["max_wall_seconds"]

    edited = edit_events(tmp_path / "wall.jsonl", tmp_path / "edited.jsonl", later_limit)
    assert _failed(edited) == {"limit_reached"}
    assert "the log stops max_wall_seconds, but no guard stops there" in _limit(edited).detail


@pytest.mark.parametrize("retry_in_s, earned", [(90.0, True), (5.0, False)])
def test_an_adapter_that_gave_up_before_the_deadline_is_checked_by_its_logged_wait(
        retry_in_s: float, earned: bool, tmp_path: Path, ws: Path) -> None:
    """An endpoint adapter may stop max_wall_seconds before the deadline when the retry it would wait
    for passes it; the stop's t plus that logged wait must reach the limit."""
    record(tmp_path / "good.jsonl", config_script(), workspace=ws)

    def gave_up(events: list[dict[str, Any]]) -> None:
        stop = events[-1]
        first = next(i for i, e in enumerate(events) if e["event"] == "request")
        del events[first + 1:]
        events[0]["limits"]["max_wall_seconds"] = 60.0
        stop.update(seq=len(events), reason="max_wall_seconds", detail="HTTP 429; retry 1 would pass",
                    data={"status": 429, "attempts": 1, "retry_in_s": retry_in_s}, final_answer=None,
                    verdict="KILL")
        events.append(stop)
        _fix_ledger(events)

    edited = edit_events(tmp_path / "good.jsonl", tmp_path / "edited.jsonl", gave_up)
    assert _limit(edited).ok is earned, _limit(edited).detail


def test_a_run_stopped_by_its_own_guard_reconciles_with_that_guard(tmp_path: Path, ws: Path) -> None:
    """Extra guards are not in the header: reconcile, like replay, takes fresh ones."""
    class TwoLists(Guard):
        def __init__(self) -> None:
            self.seen = 0

        def after_execution(self, s: Any, c: Any, r: Any) -> Stop | None:
            self.seen += c.tool.name == "list_dir"
            return Stop(StopReason.REPEATED_CALL, "list_dir twice") if self.seen >= 2 else None

    r = record(tmp_path / "own.jsonl", _dirs(4), workspace_tools(ws), guards=[TwoLists()])
    assert r.stop.detail == "list_dir twice"
    assert not _limit(tmp_path / "own.jsonl").ok  # the default guards go on
    assert reconcile(tmp_path / "own.jsonl", guards=[TwoLists()]).ok


# ---------------------------------------------------------------------------- property
def _toy_tools() -> list[Any]:
    def look(path: str) -> str:
        """Read (cached)."""
        return f"contents of {path}"

    def poke(path: str) -> str:
        """Change something."""
        return f"poked {path}"

    return [tool(look, kind="read_only"), tool(poke)]


MOVES = st.sampled_from(["look a", "look b", "poke a", "poke b", "answer", "empty"])


@settings(max_examples=25, deadline=None)
@given(moves=st.lists(MOVES, min_size=1, max_size=8), max_steps=st.integers(1, 6),
       max_tool_calls=st.integers(1, 6), max_repeats=st.integers(2, 3), no_progress=st.booleans())
def test_random_runs_reconcile_and_a_tighter_step_limit_does_not(moves: list[str], max_steps: int,
                                                                 max_tool_calls: int, max_repeats: int,
                                                                 no_progress: bool) -> None:
    """Whatever stopped a random run, reconcile agrees; and a header that allowed one request fewer
    than the run made is caught (the guards stop before the last request)."""
    script = [text_reply("done") if m == "answer" else text_reply(" ") if m == "empty" else
              calls_reply(tool_call(m.split()[0], path=m.split()[1])) for m in moves]
    limits = Limits(max_steps=max_steps, max_tool_calls=max_tool_calls, max_repeats=max_repeats,
                    no_progress=no_progress)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "run.jsonl"
        r = run("task", model=ScriptedModel(script), tools=_toy_tools(), limits=limits, log=RunLog(path))
        assert r.ledger.model_requests <= max_steps and r.ledger.tool_executions <= max_tool_calls
        rec = reconcile(path)
        assert rec.ok, [(c.name, c.detail) for c in rec.failed]
        if r.ledger.model_requests >= 2:
            edited = edit_events(path, Path(d) / "edited.jsonl", lambda ev: ev[0]["limits"].__setitem__(
                "max_steps", r.ledger.model_requests - 1))
            assert _failed(edited) == {"limit_reached"}
