"""Issue 21: a repetition means nothing changed. Real successful runs finish under the defaults;
cycles and the same call asked again with nothing in between still stop; logs reconcile and replay."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopfence import Limits, Policy, RunLog, ScriptedModel, StopReason, run, tool, workspace_tools
from loopfence._repeats import outcome_fingerprint
from loopfence.cli import cli
from loopfence.drill import load_scenario
from loopfence.runlog import reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call

from _runlog_support import edit_events

REAL_RUNS = Path(__file__).resolve().parent / "data" / "real-runs"
BUDGETS = {"max_steps", "max_tool_calls", "max_prompt_tokens", "max_completion_tokens", "max_wall_seconds"}
REPETITION_STOPS = {StopReason.REPEATED_CALL, StopReason.REPEATED_RESULT, StopReason.NO_PROGRESS}
UNBUDGETED = Limits(max_steps=None, max_tool_calls=None, max_prompt_tokens=None, max_completion_tokens=None,
                    max_wall_seconds=None, tool_timeout_s=None)


# ---------------------------------------------------------------------------- the real runs
@pytest.fixture(scope="module")
def real_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("real-runs")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = cli(["drill", str(REAL_RUNS), "--json", "--out", str(out)])
    rows = [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]
    assert rc == 0, [(r["name"], r["stop"], r["detail"]) for r in rows if not r.get("pass")]
    return rows


def test_the_real_runs_lift_only_the_budgets() -> None:
    files = sorted(REAL_RUNS.glob("*.json"))
    assert len(files) == 8
    for f in files:
        s = load_scenario(f)
        lifted = {k for k, v in json.loads(f.read_text())["limits"].items()}
        assert lifted <= BUDGETS, f.name  # the repetition rules are the defaults
        assert (s.limits.max_repeats, s.limits.max_identical_results, s.limits.max_cycle_repeats) == (3, 5, 3)
        assert s.policy == Policy() and s.expect is not None and str(s.expect.stop) == "final_answer"
        assert f.name in (REAL_RUNS / "SOURCES.md").read_text()


def test_the_real_runs_finish_with_their_answer(real_rows: list[dict[str, Any]]) -> None:
    assert len(real_rows) == 8
    for r in real_rows:
        assert r["stop"] == "final_answer" and r["verdict"] == "SHIP", (r["name"], r["detail"])
    # these three were killed by the old rules: the reproduction script re-run after each fix, the
    # verify-change-verify test, and silent setup commands in a row
    by_name = {r["name"]: r for r in real_rows}
    assert by_name["mini-gemini3pro-django__django-13297"]["tool_executions"] == 88
    assert by_name["mini-gemini3pro-astropy__astropy-12907"]["tool_executions"] == 20
    assert by_name["mini-gemini3pro-sphinx-doc__sphinx-8595"]["tool_executions"] == 69


def test_the_real_runs_logs_reconcile(real_rows: list[dict[str, Any]]) -> None:
    for r in real_rows:
        rec = reconcile(r["log"])
        assert rec.ok, (r["name"], [(c.name, c.detail) for c in rec.failed])


def test_the_old_rules_would_have_stopped_three_real_runs(tmp_path: Path) -> None:
    """The same files under whole-run counting and a streak of 2 (the rules before issue 21)."""
    old = tmp_path / "old"
    old.mkdir()
    for f in REAL_RUNS.glob("*.json"):
        data = json.loads(f.read_text())
        data["limits"].update(max_identical_results=2, max_cycle_repeats=None)
        data["policy"] = {"repeat_scope": "run"}
        (old / f.name).write_text(json.dumps(data))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        cli(["drill", str(old), "--json", "--out", str(tmp_path / "out")])
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    stopped = {r["name"]: r["stop"] for r in rows if r["stop"] != "final_answer"}
    # sphinx's silent setup commands were a streak of identical results; a side effect's empty success
    # now counts only against the same call (issue 54), and whole-run counting still stops that run
    assert stopped == {"mini-gemini3pro-astropy__astropy-12907": "repeated_call",
                       "mini-gemini3pro-django__django-13297": "repeated_call",
                       "mini-gemini3pro-sphinx-doc__sphinx-8595": "repeated_call"}


# ---------------------------------------------------------------------------- cycles through the ring
def _edit_and_test(outputs: list[str]) -> list[Any]:
    """Tools: write(path, content) and run_tests(cmd), the test answering `outputs` in order."""
    served = iter(outputs)
    last = [outputs[-1]]

    def write(path: str, content: str) -> str:
        return f"wrote {len(content)} bytes to {path}"

    def run_tests(cmd: str) -> str:
        last[0] = next(served, last[0])
        return last[0]

    return [tool(write), tool(run_tests)]


EDIT = tool_call("write", path="a.py", content="x = 1\n")
TEST = tool_call("run_tests", cmd="pytest -q")


def _run(tmp_path: Path, replies: list[Any], tools: list[Any], **kw: Any) -> Any:
    return run("fix it", model=ScriptedModel(replies), tools=tools, log=RunLog(tmp_path / "run.jsonl"), **kw)


def _reconciled(tmp_path: Path) -> None:
    rec = reconcile(tmp_path / "run.jsonl")
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    assert replay(tmp_path / "run.jsonl").same_stop


def test_a_ping_pong_one_call_per_reply_stops_at_its_third_round(tmp_path: Path) -> None:
    replies = [calls_reply(EDIT), calls_reply(TEST)] * 10
    r = _run(tmp_path, replies, _edit_and_test(["1 failed"]))
    assert r.stop.reason is StopReason.REPEATED_RESULT
    assert r.ledger.tool_executions == 6 and r.ledger.model_requests == 6
    assert r.stop.detail == ("write a.py → run_tests pytest -q: 3 times with identical results "
                             "(max_cycle_repeats=3)")
    _reconciled(tmp_path)


def test_a_ping_pong_in_one_reply_stops_at_the_third_reply(tmp_path: Path) -> None:
    r = _run(tmp_path, [calls_reply(EDIT, TEST)], _edit_and_test(["1 failed"]))
    assert r.stop.reason is StopReason.REPEATED_RESULT and r.ledger.model_requests == 3
    _reconciled(tmp_path)


def test_a_ping_pong_after_real_progress_stops_three_rounds_into_the_cycle(tmp_path: Path) -> None:
    edits = [tool_call("write", path="a.py", content=f"x = {i + 10}\n") for i in range(4)]
    replies = [x for e in edits for x in (calls_reply(e), calls_reply(TEST))]
    replies += [calls_reply(EDIT), calls_reply(TEST)] * 5
    r = _run(tmp_path, replies, _edit_and_test(["4 failed", "3 failed", "2 failed", "1 failed"]),
             limits=UNBUDGETED)
    assert r.stop.reason is StopReason.REPEATED_RESULT
    # four rounds of progress, the fourth ending in "1 failed" (execution 8); then the stuck edit
    # and the same "1 failed": (test, edit) with identical results a third time at execution 13
    assert r.ledger.tool_executions == 13
    assert r.stop.detail.startswith("run_tests pytest -q → write a.py: 3 times")


def test_a_period_three_cycle_with_identical_results_stops(tmp_path: Path) -> None:
    undo = tool_call("write", path="a.py", content="x = 0\n")
    r = _run(tmp_path, [calls_reply(EDIT), calls_reply(TEST), calls_reply(undo)] * 5,
             _edit_and_test(["1 failed"]))
    assert r.stop.reason is StopReason.REPEATED_RESULT and r.ledger.tool_executions == 9
    assert r.stop.data["period"] == 3
    _reconciled(tmp_path)


def test_the_same_edit_and_test_with_progress_is_not_a_cycle(tmp_path: Path) -> None:
    outputs = ["5 failed", "4 failed", "3 failed", "2 failed", "1 failed", "passed"]
    replies = [calls_reply(EDIT), calls_reply(TEST)] * 6 + [text_reply("done")]
    r = _run(tmp_path, replies, _edit_and_test(outputs), limits=UNBUDGETED)
    assert r.stop.reason is StopReason.FINAL_ANSWER  # the tests change: something is happening


def test_a_ping_pong_through_the_real_shell_is_caught_despite_its_timing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "t.py").write_text("print(0)\n")  # so every write reports the same (created: false)
    tools = workspace_tools(ws, names=["write_file", "run_command"], sandbox=False)
    edit = tool_call("write_file", path="t.py", content="print(1/0)\n")
    runit = tool_call("run_command", command="python3 t.py 2>&1 | tail -1")
    r = _run(tmp_path, [calls_reply(edit), calls_reply(runit)] * 5, tools)
    assert r.stop.reason is StopReason.REPEATED_RESULT and r.ledger.tool_executions == 6
    assert "write_file t.py → run_command python3 t.py 2>&1 | tail -1: 3 times" in r.stop.detail
    _reconciled(tmp_path)


def test_turning_cycles_off(tmp_path: Path) -> None:
    r = _run(tmp_path, [calls_reply(EDIT), calls_reply(TEST)] * 10, _edit_and_test(["1 failed"]),
             limits=Limits(max_cycle_repeats=None, max_identical_results=None))
    assert r.stop.reason is StopReason.MAX_STEPS


def test_an_edit_and_a_test_whose_output_carries_its_timing_still_cycle(tmp_path: Path) -> None:
    """Test runners print how long they took (`Ran 1 test in 0.012s`, `1 failed in 0.05s`): the
    same failure with another timing is the same outcome."""
    timings = (f"F\nFAILED (failures=1)\nRan 1 test in 0.0{i}s\n1 failed in {i}.5{i}s (0:00:0{i}) at 12:0{i}:31"
               for i in itertools.count(1))
    tools = [tool(lambda path, content: "wrote", name="write"), tool(lambda cmd: next(timings), name="run_tests")]
    r = _run(tmp_path, [calls_reply(EDIT), calls_reply(TEST)] * 10, tools)
    assert r.stop.reason is StopReason.REPEATED_RESULT and r.ledger.tool_executions == 6, r.stop.detail
    _reconciled(tmp_path)


_WORDS = st.text(st.characters(codec="utf-8", exclude_characters="0123456789"), max_size=12)
_DURATIONS = st.builds(lambda n, frac, unit: f"{n}{frac}{unit}", st.integers(0, 999),
                       st.sampled_from(["", ".5", ".012"]), st.sampled_from(["s", "ms", " s", " seconds", "µs"]))


@given(words=st.lists(_WORDS, min_size=2, max_size=4), first=st.lists(_DURATIONS, min_size=3, max_size=3),
       second=st.lists(_DURATIONS, min_size=3, max_size=3))
def test_property_outputs_that_differ_only_in_their_timings_are_one_outcome(
        words: list[str], first: list[str], second: list[str]) -> None:
    def text(times: list[str]) -> str:
        return " ".join(f"{w} {t}" for w, t in zip(words, times))

    assert outcome_fingerprint(text(first)) == outcome_fingerprint(text(second))
    assert outcome_fingerprint(text(first)) != outcome_fingerprint(text(first) + " 1 failed")


@pytest.mark.parametrize("kind", ["side_effect", "read_only"])
def test_one_reply_asking_twenty_times_for_the_same_call_runs_it_once(tmp_path: Path, kind: str) -> None:
    charged: list[int] = []

    def charge_card(customer: str, amount_cents: int) -> str:
        charged.append(amount_cents)
        return f"charge {len(charged)}"

    copies = [tool_call("charge_card", id=f"c{i}", customer="cus_1", amount_cents=500) for i in range(20)]
    r = _run(tmp_path, [calls_reply(*copies), text_reply("charged")], [tool(charge_card, kind=kind)])
    assert r.stop.reason is StopReason.FINAL_ANSWER and charged == [500]
    assert r.ledger.tool_executions == 1 and r.ledger.refused + r.ledger.reused == 19
    if kind == "side_effect":
        answers = [m["content"] for m in r.messages if m["role"] == "tool"]
        assert answers[0] == "charge 1"
        refused = [json.loads(a) for a in answers[1:]]
        assert {x["error"] for x in refused} == {"duplicate_call"} and {x["first_call"] for x in refused} == {"c0"}
        assert "this reply already asked for charge_card" in refused[0]["message"]
    _reconciled(tmp_path)


def test_a_copy_after_another_change_in_the_same_reply_runs_again(tmp_path: Path) -> None:
    r = _run(tmp_path, [calls_reply(EDIT, TEST, EDIT, TEST), text_reply("done")], _edit_and_test(["1 failed", "passed"]))
    assert r.stop.reason is StopReason.FINAL_ANSWER and r.ledger.tool_executions == 4 and r.ledger.refused == 0


def test_a_nudge_in_the_middle_of_a_reply_runs_nothing_more_of_it(tmp_path: Path) -> None:
    """The 6th identical result becomes the nudge instead of the stop; the reply's other calls are
    refused, so the nudge costs no execution (as many as the stop without it)."""
    runs = {}
    for nudge in (False, True):
        done: list[int] = []

        def record(note: str) -> str:
            done.append(1)
            return "ok"

        calls = [tool_call("record", id=f"r{i}", note=f"step {i}") for i in range(10)]
        r = _run(tmp_path, [calls_reply(*calls), text_reply("done")], [tool(record)], policy=Policy(nudge=nudge))
        runs[nudge] = (r.stop.reason, len(done))
        if nudge:
            results = [json.loads(m["content"]) for m in r.messages if m["role"] == "tool" and m["content"] != "ok"]
            assert {x["error"] for x in results} == {"nudge_pending"} and len(results) == 4
            _reconciled(tmp_path)
    assert runs == {False: (StopReason.REPEATED_RESULT, 6), True: (StopReason.FINAL_ANSWER, 6)}


# ---------------------------------------------------------------------------- repeats
def test_the_same_call_with_nothing_in_between_stops_at_the_third_reply(tmp_path: Path) -> None:
    r = _run(tmp_path, [calls_reply(TEST)], _edit_and_test(["1 failed"]))
    assert r.stop.reason is StopReason.REPEATED_CALL
    assert r.ledger.model_requests == 3 and r.ledger.tool_executions == 2
    _reconciled(tmp_path)


def test_a_large_repeated_call_stops_with_its_short_key_and_replays(tmp_path: Path) -> None:
    """A repeated ~1 MB call: the stop names the key's digest form (as the log's call events do), not
    the call twice over; reconcile and replay fold the same short form."""
    from loopfence._log._large import short_key
    big = tool_call("run_tests", cmd="pytest -q -k " + "x" * 1_000_000)
    r = _run(tmp_path, [calls_reply(big)], _edit_and_test(["1 failed"]), limits=UNBUDGETED)
    key = r.stop.data["key"]
    assert r.stop.reason is StopReason.REPEATED_CALL and r.ledger.model_requests == 3
    assert key.startswith("run_tests:sha256:") and len(key) == len("run_tests:sha256:") + 64
    assert key == short_key('run_tests:{"cmd":"pytest -q -k ' + "x" * 1_000_000 + '"}')
    stop = (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines()[-1]
    assert json.loads(stop)["event"] == "stop" and len(stop) < 4096, len(stop)
    assert len(r.stop.detail) < 300 and key in r.stop.detail
    _reconciled(tmp_path)


def test_a_stop_written_with_the_whole_large_key_still_reconciles_and_replays(tmp_path: Path) -> None:
    """A log written before a stop named a large key by its digest: reconcile and replay compare the
    digest form of the key it wrote (and of the detail that quotes it)."""
    from loopfence._log._large import short_key
    whole = 'run_tests:{"cmd":"pytest -q -k ' + "x" * 100_000 + '"}'
    big = tool_call("run_tests", cmd="pytest -q -k " + "x" * 100_000)
    _run(tmp_path, [calls_reply(big)], _edit_and_test(["1 failed"]), limits=UNBUDGETED)

    def spell_out(events: list[dict[str, Any]]) -> None:
        stop = events[-1]
        assert stop["data"]["key"] == short_key(whole)
        stop["data"]["key"], stop["detail"] = whole, stop["detail"].replace(short_key(whole), whole)

    old = edit_events(tmp_path / "run.jsonl", tmp_path / "old.jsonl", spell_out)
    assert len(old.read_text(encoding="utf-8").splitlines()[-1]) > 200_000
    rec = reconcile(old)
    assert rec.ok, [c.detail for c in rec.failed]
    assert replay(old).ok, replay(old).lines()


def test_reads_in_between_change_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("x = 1\n")
    tools = [*_edit_and_test(["1 failed"]), *workspace_tools(ws, names=["read_file", "list_dir"])]
    replies = [calls_reply(TEST), calls_reply(tool_call("read_file", path="a.py")),
               calls_reply(TEST), calls_reply(tool_call("list_dir")), calls_reply(TEST)]
    r = _run(tmp_path, replies, tools)
    assert r.stop.reason is StopReason.REPEATED_CALL and r.ledger.model_requests == 5
    assert r.stop.data["key"] == 'run_tests:{"cmd":"pytest -q"}'
    _reconciled(tmp_path)


def test_edit_then_test_for_five_rounds_finishes(tmp_path: Path) -> None:
    edits = [tool_call("write", path="a.py", content=f"x = {i}\n") for i in range(5)]
    replies = [x for e in edits for x in (calls_reply(e), calls_reply(TEST))] + [text_reply("fixed")]
    r = _run(tmp_path, replies, _edit_and_test([f"{4 - i} failed" for i in range(5)]))
    assert r.stop.reason is StopReason.FINAL_ANSWER and r.ledger.tool_executions == 10
    _reconciled(tmp_path)


def test_repeat_scope_run_keeps_whole_run_counting(tmp_path: Path) -> None:
    edits = [tool_call("write", path="a.py", content=f"x = {i}\n") for i in range(5)]
    replies = [x for e in edits for x in (calls_reply(e), calls_reply(TEST))] + [text_reply("fixed")]
    r = _run(tmp_path, replies, _edit_and_test([f"{4 - i} failed" for i in range(5)]),
             policy=Policy(repeat_scope="run"))
    assert r.stop.reason is StopReason.REPEATED_CALL and r.ledger.model_requests == 6
    assert "(max_repeats=3, repeat_scope=run)" in r.stop.detail
    header = json.loads((tmp_path / "run.jsonl").read_text().splitlines()[0])
    assert header["policy"]["repeat_scope"] == "run" and header["limits"]["max_cycle_repeats"] == 3
    _reconciled(tmp_path)


# ---------------------------------------------------------------------------- reconcile
def test_a_cycle_stop_whose_results_were_edited_does_not_reconcile(tmp_path: Path) -> None:
    _run(tmp_path, [calls_reply(EDIT), calls_reply(TEST)] * 5, _edit_and_test(["1 failed"]))

    def change(events: list[dict[str, Any]]) -> None:
        first_test = next(e for e in events if e["event"] == "result" and e["name"] == "run_tests")
        first_test["content"] = "2 failed"

    edited = edit_events(tmp_path / "run.jsonl", tmp_path / "edited.jsonl", change)
    assert {c.name for c in reconcile(edited).failed} == {"limit_reached"}


def _three_edits_under_run_scope(tmp_path: Path) -> None:
    """Edit, test, three times, counting over the whole run: the third test stops repeated_call."""
    edits = [tool_call("write", path="a.py", content=f"x = {i}\n") for i in range(3)]
    replies = [x for e in edits for x in (calls_reply(e), calls_reply(TEST))]
    _run(tmp_path, replies, _edit_and_test(["1 failed", "2 failed", "3 failed"]),
         policy=Policy(repeat_scope="run"))


def test_a_repeated_call_stop_under_the_wrong_scope_does_not_reconcile(tmp_path: Path) -> None:
    _three_edits_under_run_scope(tmp_path)
    assert reconcile(tmp_path / "run.jsonl").ok

    def scope(events: list[dict[str, Any]]) -> None:
        events[0]["policy"]["repeat_scope"] = "change"  # under this rule the third test was a new question

    edited = edit_events(tmp_path / "run.jsonl", tmp_path / "edited.jsonl", scope)
    assert {c.name for c in reconcile(edited).failed} == {"limit_reached"}


def test_a_log_written_before_issue_21_is_read_with_the_rules_it_ran_under(tmp_path: Path) -> None:
    _three_edits_under_run_scope(tmp_path)

    def older(events: list[dict[str, Any]]) -> None:
        del events[0]["policy"]["repeat_scope"], events[0]["limits"]["max_cycle_repeats"]

    edited = edit_events(tmp_path / "run.jsonl", tmp_path / "old.jsonl", older)
    assert reconcile(edited).ok
    assert replay(edited).same_stop  # replayed with whole-run counting, as it ran
    events = [json.loads(line) for line in edited.read_text().splitlines()]
    events[-1]["data"].pop("key")  # a stop written before issue 21 did not name the call
    (tmp_path / "older.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert reconcile(tmp_path / "older.jsonl").ok


def test_limits_and_policy_read_the_new_settings() -> None:
    assert Limits.from_json({"max_cycle_repeats": None}).max_cycle_repeats is None
    with pytest.raises(ValueError, match="max_cycle_repeats must be at least 2"):
        Limits.from_json({"max_cycle_repeats": 1})
    assert Policy.from_json({"repeat_scope": "run"}) == Policy(repeat_scope="run")
    with pytest.raises(ValueError, match="repeat_scope must be 'change' or 'run'"):
        Policy.from_json({"repeat_scope": "reply"})
    assert Policy().to_json() == {"on_bad_call": "fail", "max_bad_calls": 2, "repeat_scope": "change"}


# ---------------------------------------------------------------------------- the property
KINDS = {"edit": "side_effect", "test": "side_effect", "read": "read_only"}
KEYS = [(name, arg) for name in KINDS for arg in ("a", "b", "c")]
CHANGE = ("edit", "z")  # a side effect with a new result: what the model sees next is the block's


class Plan:
    """Tools whose n-th execution of a key answers the n-th planned result for it (after the plan
    runs out: the key's block result)."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, str], list[str]] = {k: [] for k in [*KEYS, CHANGE]}
        self.block: dict[tuple[str, str], str] = {}
        self.done: dict[tuple[str, str], int] = dict.fromkeys(self.results, 0)

    def tools(self) -> list[Any]:
        def make(name: str) -> Any:
            def fn(arg: str) -> str:
                k = (name, arg)
                n, self.done[k] = self.done[k], self.done[k] + 1
                planned = self.results[k]
                return planned[n] if n < len(planned) else self.block[k]

            fn.__name__ = name
            fn.__doc__ = f"{name} something"
            return tool(fn, kind=KINDS[name])

        return [make(name) for name in KINDS]


@st.composite
def progress(draw: st.DrawFn, plan: Plan, max_calls: int = 24) -> list[tuple[str, str]]:
    """Calls where every repeat of a call follows a different side-effecting call with a new result
    (its own result may be the same as last time: the test still fails the same way)."""
    fresh = itertools.count()
    last: dict[tuple[str, str], str] = {}
    changed_since: dict[tuple[str, str], bool] = {}
    seq: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, max_calls))):
        allowed = [k for k in KEYS if k not in last or changed_since[k]]
        if not allowed:
            break
        k = draw(st.sampled_from(allowed))
        same = k in last and draw(st.booleans())
        result = last[k] if same else f"result {next(fresh)}"
        plan.results[k].append(result)
        last[k] = result
        changed_since[k] = False
        if KINDS[k[0]] == "side_effect" and not same:
            for other in changed_since:
                if other != k:
                    changed_since[other] = True
        seq.append(k)
    return seq


def _replies(draw: st.DrawFn, calls: list[tuple[str, str]]) -> list[Any]:
    out, i = [], 0
    while i < len(calls):
        n = draw(st.integers(1, 3))
        out.append(calls_reply(*(tool_call(name, arg=arg) for name, arg in calls[i:i + n])))
        i += n
    return out


@settings(max_examples=150)
@given(st.data())
def test_property_repeats_after_a_change_never_stop_a_run(data: st.DataObject) -> None:
    plan = Plan()
    calls = data.draw(progress(plan))
    replies = [*_replies(data.draw, calls), text_reply("done")]
    r = run("work", model=ScriptedModel(replies), tools=plan.tools(), limits=UNBUDGETED, log=RunLog(None))
    assert r.stop.reason is StopReason.FINAL_ANSWER, (calls, r.stop.detail)
    assert r.ledger.tool_executions == len(calls) and r.ledger.reused == 0


@settings(max_examples=150)
@given(st.data())
def test_property_three_repetitions_of_a_block_with_identical_results_stop_a_run(data: st.DataObject) -> None:
    plan = Plan()
    prefix = data.draw(progress(plan, max_calls=12))
    period = data.draw(st.integers(1, 3))
    block = data.draw(st.lists(st.sampled_from(KEYS), min_size=period, max_size=period))
    for k in block:
        plan.block[k] = f"block result {k}"
    plan.results[CHANGE].append("a change nobody has seen")
    prefix.append(CHANGE)  # so no read in the block answers from before it: every result is the block's
    tail = block * 3
    if data.draw(st.booleans()):  # one call per reply, or one block per reply
        tail_replies = [calls_reply(tool_call(name, arg=arg)) for name, arg in tail]
    else:
        tail_replies = [calls_reply(*(tool_call(name, arg=arg) for name, arg in block))] * 3
    replies = [*_replies(data.draw, prefix), *tail_replies, text_reply("done")]
    r = run("work", model=ScriptedModel(replies), tools=plan.tools(), limits=UNBUDGETED, log=RunLog(None))
    assert r.stop.reason in REPETITION_STOPS, (prefix, block, r.stop.reason, r.stop.detail)
    assert r.ledger.model_requests <= len(replies) - 1  # before the final answer was asked for


# ---------------------------------------------------------------------------- empty successes (issue 54)
MINI_EMPTY = "<returncode>0</returncode>\n<output>\n</output>"
SHELL_EMPTY = json.dumps({"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "duration_s": 0.01,
                          "sandbox": "bubblewrap"})
WRITES = [f"cat <<'EOF' > pkg/m{i}.py\nx = {i}\nEOF" for i in range(10)]


def _bash(output: str | list[str], kind: str = "side_effect") -> Any:
    outputs = iter([output] if isinstance(output, str) else output)
    last = [output if isinstance(output, str) else output[-1]]

    def bash(command: str) -> str:
        last[0] = next(outputs, last[0])
        return last[0]
    return tool(bash, kind=kind)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(6, 10), output=st.sampled_from(["", MINI_EMPTY, SHELL_EMPTY]), appends=st.booleans())
def test_six_to_ten_writes_that_succeed_with_empty_output_are_steady_work(n: int, output: str, appends: bool) -> None:
    """Six files written in a row, or a script appended line by line: every call changed something,
    with different arguments; their identical empty outputs are not a loop."""
    commands = [f"echo 'line {i}' >> fix.py" for i in range(n)] if appends else WRITES[:n]
    replies = [calls_reply(tool_call("bash", command=c, id=f"c{i}")) for i, c in enumerate(commands)]
    r = run("write the package", model=ScriptedModel([*replies, text_reply("done")]), tools=[_bash(output)],
            limits=UNBUDGETED)
    assert r.stop.reason is StopReason.FINAL_ANSWER, r.stop.detail
    assert r.ledger.tool_executions == n


@pytest.mark.parametrize("output", [
    json.dumps({"ok": False, "error": "nonzero_exit", "exit_code": 1, "stdout": "", "stderr": "Permission denied"}),
    "<returncode>1</returncode>\n<output>\n</output>",  # a failure with nothing to say is still a failure
    "<returncode>126</returncode>\n<output>\nbash: ./run.sh: Permission denied\n</output>"])
def test_a_storm_of_different_commands_failing_with_one_error_still_stops_within_six(tmp_path: Path,
                                                                                    output: str) -> None:
    replies = [calls_reply(tool_call("bash", command=f"./run.sh --try {i}", id=f"c{i}")) for i in range(20)]
    r = _run(tmp_path, replies, [_bash(output)], limits=UNBUDGETED)
    assert r.stop.reason is StopReason.REPEATED_RESULT and r.ledger.tool_executions == 6, r.stop.detail
    _reconciled(tmp_path)


def test_identical_empty_results_of_read_only_calls_are_still_a_repetition(tmp_path: Path) -> None:
    """grep after grep with no match: nothing changed, and nothing was learned."""
    replies = [calls_reply(tool_call("bash", command=f"grep -r pattern{i} src", id=f"c{i}")) for i in range(20)]
    r = _run(tmp_path, replies, [_bash("", kind="read_only")], limits=UNBUDGETED)
    assert r.stop.reason is StopReason.REPEATED_RESULT and r.ledger.tool_executions == 6
    _reconciled(tmp_path)


def test_the_same_write_again_and_again_is_still_stopped(tmp_path: Path) -> None:
    """An empty success counts against the same call: the same write, with nothing else between."""
    r = _run(tmp_path, [calls_reply(tool_call("bash", command=WRITES[0], id=f"c{i}")) for i in range(10)],
             [_bash(MINI_EMPTY)], limits=UNBUDGETED)
    assert r.stop.reason is StopReason.REPEATED_CALL and r.ledger.tool_executions == 2
    _reconciled(tmp_path)


@settings(max_examples=50, deadline=None)
@given(a=st.integers(1, 10**7), b=st.integers(1, 10**7), label=st.sampled_from(["Process Group PGID: ", "Background PIDs: ", "PID="]))
def test_the_process_ids_a_harness_prints_are_not_part_of_an_outcome(a: int, b: int, label: str) -> None:
    """Gemini CLI ends a command's output with its process group id, new each time: the same failing
    command is the same outcome whatever the id (and a different output is still different)."""
    out = "AssertionError\nExit Code: 1\n"
    assert outcome_fingerprint(f"{out}{label}{a}\n") == outcome_fingerprint(f"{out}{label}{b}\n")
    assert outcome_fingerprint(f"{out}{label}{a}\n") != outcome_fingerprint(f"passed\nExit Code: 0\n{label}{a}\n")


# the timing pattern as it was before its quantifiers were made possessive (issue 62): the same rewrite, faster
_TIMING_BACKTRACKING = re.compile(
    r"[0-9](?<![\w.][0-9])(?:[0-9]*(?:\.[0-9]+)?\s?(?:ms|µs|us|ns|s|sec|secs|seconds)\b"
    r"|[0-9]*(?:-[0-9][0-9]-[0-9][0-9][T ][0-9][0-9]?)?:[0-9][0-9]:[0-9][0-9](?:[.,][0-9]+)?(?![0-9]))")
_NEAR_TIMINGS = st.lists(st.sampled_from([*"0123456789", ".", ",", ":", "-", " ", "\n", "T", "s", "m", "µ", "u", "n",
                                          "e", "c", "o", "d", "x", "_", " PID", " PGID", " PIDs", ": ", "=", "seconds", "sec"]),
                         max_size=40).map("".join)


@given(text=_NEAR_TIMINGS)
@example(text="Process Group PGID: 25158 in 0.5s")  # (Gemini CLI's words)
@example(text="Background PIDs: 101, 102 at 12:01:33.5")
@settings(max_examples=500)
def test_property_the_timing_and_pid_rewrites_are_the_ones_before(text: str) -> None:
    from loopfence._repeats import _PIDS, _TIMING, _outcome
    from loopfence._json import fingerprint

    assert _TIMING.sub("<time>", text) == _TIMING_BACKTRACKING.sub("<time>", text)
    before = fingerprint(_PIDS.sub(r"\1\2<pid>", _TIMING_BACKTRACKING.sub("<time>", text)))
    assert _outcome(text) == before  # the process ids looked for only where "PID" or "PGID" is written


def test_a_timing_and_a_pid_are_still_left_out() -> None:  # the property above compares; this says what they do
    assert outcome_fingerprint("ran 12 tests in 0.53s at 12:01:33, PIDs: 101, 102") == \
        outcome_fingerprint("ran 12 tests in 1.7 s at 09:14:02, PIDs: 7")
    assert outcome_fingerprint("ran 12 tests") != outcome_fingerprint("ran 13 tests")
