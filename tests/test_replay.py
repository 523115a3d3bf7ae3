"""Replay: the ring runs again from the log; identical, or the first divergence (step, expected, got)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, StopReason, workspace_tools
from loopfence._json import fingerprint
from loopfence._stops import StopError
from loopfence.cli import cli
from loopfence.runlog import LogError, read_log, replay
from loopfence.testing import calls_reply, text_reply, tool_call

from _runlog_support import config_script, edit_events, make_workspace, read_lines, record, stop_scenarios


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


@pytest.fixture
def good(tmp_path: Path, ws: Path) -> Path:
    result = record(tmp_path / "good.jsonl", config_script(), workspace=ws)
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.ledger.reused == 1
    return tmp_path / "good.jsonl"


def test_replay_is_identical_and_consumes_every_event(good: Path) -> None:
    report = replay(good)
    assert report.ok and report.same_stop and report.divergence is None
    assert report.replayed is not None and report.replayed.ledger.model_requests == 3
    assert report.replayed.final_answer == "DEBUG is True"
    reused = [e for e in read_lines(good) if e["event"] == "result" and e["decision"] == "reused"]
    assert reused and "[reused:" in reused[0]["content"]  # the cached result replays identically


def test_replay_cli_exit_codes(good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["replay", str(good)]) == 0
    assert "replayed identically: final_answer at step 3" in capsys.readouterr().err
    bad = edit_events(good, tmp_path / "bad.jsonl", _change_first_result)
    assert cli(["replay", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "replay diverges" in err and "step 2: the request differs" in err
    assert "expected (line 6)" in err and "got:" in err


def _change_first_result(events: list[dict[str, Any]]) -> None:
    """Another content with its own fingerprint: a consistent edit, so the NEXT request differs."""
    r = next(e for e in events if e["event"] == "result")
    r["content"] = "DEBUG = False\n[page 1 of 1: end of file]"
    r["fingerprint"] = fingerprint(r["content"])


def test_a_result_whose_content_does_not_match_its_fingerprint(good: Path, tmp_path: Path) -> None:
    def change(events: list[dict[str, Any]]) -> None:
        next(e for e in events if e["event"] == "result")["content"] = "tampered"

    d = replay(edit_events(good, tmp_path / "bad.jsonl", change)).divergence
    assert d is not None and d.got is not None and d.expected is not None and d.got["event"] == "result"
    assert d.got["fingerprint"] == fingerprint("tampered") != d.expected["fingerprint"]


def test_an_edited_result_changes_the_next_request(good: Path, tmp_path: Path) -> None:
    bad = edit_events(good, tmp_path / "bad.jsonl", _change_first_result)
    report = replay(bad)
    d = report.divergence
    assert not report.ok and d is not None and d.step == 2 and d.line == 6
    assert d.expected is not None and d.got is not None
    assert d.expected["event"] == d.got["event"] == "request" and d.expected["step"] == 2
    assert d.expected["fingerprint"] != d.got["fingerprint"]
    assert "request differs" in d.what and f"line {d.line}" in d.describe()


def test_an_edited_reply_changes_the_call(good: Path, tmp_path: Path) -> None:
    def change(events: list[dict[str, Any]]) -> None:
        reply = next(e for e in events if e["event"] == "reply")
        fn = reply["raw"]["choices"][0]["message"]["tool_calls"][0]["function"]
        fn["arguments"] = json.dumps({"path": "README.md"})

    report = replay(edit_events(good, tmp_path / "bad.jsonl", change))
    d = report.divergence
    assert d is not None and d.step == 1 and d.got is not None and d.expected is not None
    assert d.got["event"] == "call" and "README.md" in d.got["key"] and "config.py" in d.expected["key"]


def test_other_tool_schemas_diverge_at_the_first_request(good: Path, tmp_path: Path) -> None:
    def change(events: list[dict[str, Any]]) -> None:
        events[0]["tools"][0]["function"]["description"] = "something else"

    d = replay(edit_events(good, tmp_path / "bad.jsonl", change)).divergence
    assert d is not None and d.expected is not None and d.expected["step"] == 1 and d.expected["event"] == "request"


def test_a_stop_at_another_place_fails(good: Path, tmp_path: Path) -> None:
    def change(events: list[dict[str, Any]]) -> None:
        events[0]["limits"]["max_steps"] = 2  # the recorded run made 3 requests under these "limits"

    report = replay(edit_events(good, tmp_path / "bad.jsonl", change))
    d = report.divergence
    assert not report.ok and d is not None and d.got is not None and d.expected is not None
    assert d.got["event"] == "stop" and d.got["reason"] == "max_steps" and d.expected["event"] == "request"


def test_a_log_without_its_stop_is_not_replayed(good: Path, tmp_path: Path) -> None:
    bad = edit_events(good, tmp_path / "bad.jsonl", lambda ev: ev.pop())
    with pytest.raises(LogError, match="no stop event as its last line"):
        replay(bad)


def test_every_recorded_event_must_be_consumed(good: Path, tmp_path: Path) -> None:
    def change(events: list[dict[str, Any]]) -> None:  # a second stop: the replay stops at the first
        events.insert(-1, dict(events[-1]))

    report = replay(edit_events(good, tmp_path / "bad.jsonl", change))
    assert not report.ok and report.divergence is not None
    assert "before the end of the recording" in report.divergence.what


# -- what-if limits -------------------------------------------------------------------------------
def test_what_if_a_smaller_budget_stops_earlier(good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = replay(good, limits={"max_steps": 2})
    assert report.ok and report.what_if and not report.same_stop
    assert report.replayed is not None and report.replayed.stop.reason is StopReason.MAX_STEPS
    assert report.replayed.ledger.model_requests == 2
    assert cli(["replay", str(good), "--limit", "max_tool_calls=1"]) == 0
    err = capsys.readouterr().err
    assert "under max_tool_calls=1: stops with max_tool_calls at step 2 (1 executions)" in err
    assert "recorded: final_answer at step 3" in err


def test_what_if_a_budget_that_would_not_have_mattered(good: Path) -> None:
    report = replay(good, limits={"max_steps": 20})
    assert report.ok and report.divergence is None and report.replayed is not None
    assert report.replayed.stop.reason is StopReason.FINAL_ANSWER
    assert "the same stop" in report.lines()[0]


def test_what_if_a_bigger_budget_goes_past_the_recording(tmp_path: Path, ws: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    script = [calls_reply(tool_call("read_file", path=f"f{i}.txt")) for i in range(5)]
    record(tmp_path / "steps.jsonl", script, workspace=ws, limits=Limits(max_steps=2))
    report = replay(tmp_path / "steps.jsonl", limits={"max_steps": 5})
    assert report.ok and report.past_end is not None and "step 3" in report.past_end
    assert cli(["replay", str(tmp_path / "steps.jsonl"), "--limit", "max_steps=5"]) == 0
    assert "goes on past the recording" in capsys.readouterr().err


def test_a_bad_limit_flag_is_a_usage_error(good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["replay", str(good), "--limit", "max_stepz=3"]) == 2
    assert "unknown limit 'max_stepz'" in capsys.readouterr().err


# -- --execute-tools ------------------------------------------------------------------------------
def test_execute_tools_reruns_for_real_in_a_fresh_copy(good: Path, ws: Path) -> None:
    report = replay(good, execute_tools=True)
    assert report.ok and set(report.executed) == {"read_file", "list_dir"}
    assert sorted(p.name for p in ws.iterdir()) == ["README.md", "app"]  # the original untouched


def test_execute_tools_catches_what_the_log_did_not_record(good: Path, ws: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "app" / "config.py").write_text("DEBUG = False\n")  # the world moved under the log
    with pytest.raises(LogError, match="changed app/config.py"):  # the header's manifest says so first
        replay(good, execute_tools=True)
    report = replay(good, execute_tools=True, workspace_as_is=True)  # run anyway: the result shows it
    d = report.divergence
    assert not report.ok and d is not None and d.got is not None and d.expected is not None
    assert d.got["event"] == "result" and "DEBUG = False" in d.got["content"]
    assert "DEBUG = True" in d.expected["content"]
    assert replay(good).ok  # recorded results still replay: no side effects, no disk
    assert cli(["replay", str(good), "--execute-tools", "--workspace-as-is"]) == 1
    assert "DEBUG = False" in capsys.readouterr().err


# -- every kind of stop plays back ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(stop_scenarios()))
def test_every_stop_replays(name: str, tmp_path: Path, ws: Path) -> None:
    script, extra_tools, options = stop_scenarios()[name]
    path = tmp_path / f"{name}.jsonl"
    result = record(path, script, [*workspace_tools(ws), *extra_tools], workspace=ws, **options)
    expected = {"schema_mismatch_result": "schema_mismatch", "feedback_then_answer": "final_answer",
                "gate_refusal": "final_answer"}.get(name, name)
    assert str(result.stop.reason) == expected
    report = replay(path)
    assert report.ok, report.lines()
    assert report.replayed is not None and report.replayed.stop.reason is result.stop.reason
    if name == "gate_refusal":
        gates = [e for e in read_lines(path) if e["event"] == "gate"]
        assert {g["decision"] for g in gates} >= {"tainted", "refused"}


def test_a_model_error_replays_as_the_same_stop(tmp_path: Path, ws: Path) -> None:
    class Failing:
        def __init__(self) -> None:
            self.n = 0

        def complete(self, request: Any) -> Any:
            self.n += 1
            if self.n == 2:
                raise StopError(StopReason.ENDPOINT_ERROR, "HTTP 500: upstream broke", status=500)
            from loopfence import Reply
            return Reply.from_response(calls_reply(tool_call("list_dir")))

        def describe(self) -> dict[str, Any]:
            return {"kind": "failing"}

    from loopfence import RunLog, run
    path = tmp_path / "err.jsonl"
    result = run("t", model=Failing(), tools=workspace_tools(ws), log=RunLog(path))
    assert result.stop.reason is StopReason.ENDPOINT_ERROR
    report = replay(path)
    assert report.ok and report.replayed is not None
    assert report.replayed.stop.detail == "HTTP 500: upstream broke"
    assert read_log(path).stop is not None


def test_a_run_that_read_html_from_the_workspace_replays(tmp_path: Path) -> None:
    """make run's shape: the page taints the context with a reason that names its provenance (HTML
    that was in the workspace at the start, the --trust hint); replay's recorded tools cannot see
    the workspace, yet what was tainted and by which call must match, and the run replays."""
    from loopfence import ScriptedModel, run

    ws = tmp_path / "ws"
    (ws / "pages").mkdir(parents=True)
    (ws / "pages" / "p.html").write_text("<html><body><h1>Hello</h1><p>Some text here.</p></body></html>")
    log = tmp_path / "run.jsonl"
    model = ScriptedModel([calls_reply(tool_call("read_file", path="pages/p.html")), text_reply("noted")])
    result = run("Read pages/p.html", model=model, tools=workspace_tools(ws), log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    gates = [e for e in read_lines(log) if e["event"] == "gate" and e["decision"] == "tainted"]
    assert gates and "--trust" in gates[0]["reason"]  # the live reason has the provenance hint
    report = replay(log)
    assert report.ok, report


@pytest.mark.parametrize("policy", ["fail", "feedback"])
def test_a_refused_call_to_a_function_tool_replays_in_the_words_it_was_refused_in(tmp_path: Path, policy: str) -> None:
    """A function's signature validated the call live (pydantic's words); replay's recorded tool
    rebuilds that model from the schema, so the rejection, and what the model read, are the same."""
    from typing import Literal

    from loopfence import Policy, ScriptedModel, Tool, run, tool
    from loopfence.testing import calls_reply, text_reply, tool_call

    def fetch(url: str, retries: int = 2, mode: Literal["get", "head"] = "get", tags: list[str] | None = None) -> str:
        """fetch a page"""
        return "page"

    plain = Tool.from_schema("lookup", lambda q: q, {"type": "object", "properties": {"q": {"type": "string"}},
                                                     "required": ["q"]})
    bad = [tool_call("fetch", nourl="x"), tool_call("fetch", url=1, retries="2"), tool_call("fetch", url="u", mode="put"),
           tool_call("fetch", url="u", tags=[1]), tool_call("lookup", q=3)]
    log = tmp_path / "r.jsonl"
    model = ScriptedModel([calls_reply(c) for c in bad] + [text_reply("done")])
    run("t", model=model, tools=[tool(fetch), plain], log=log, limits=Limits(max_steps=8),
        policy=Policy(on_bad_call=policy, max_bad_calls=None))
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert [t.get("arguments") for t in events[0]["tools"]] == ["signature", None]
    rejected = [json.loads(e["content"])["message"] for e in events if e["event"] == "result"]
    assert rejected[0] == "fetch: missing required argument 'url'; unexpected argument 'nourl'"
    if policy == "feedback":  # told, the model goes on: every kind of refusal is in the log
        assert len(rejected) == len(bad)
        assert "Input should be a valid string" in rejected[1] and "Input should be 'get' or 'head'" in rejected[2]
    report = replay(log)
    assert report.ok and report.divergence is None, report.lines()
