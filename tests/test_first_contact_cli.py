"""First contact, third pass: the commands and Python errors a newcomer meets first.

Several logs on the command line (a verdict line each, the worst exit), a mistyped flag (the
command's usage, the nearest flag), logs of runs with a custom guard (unchecked, or `--guard`), what
`tools=` takes, keyword typos anywhere in the public API, the same true words on bytes that are not
a log, `--quiet` saying why a run was killed, a tool's own PermissionError kept apart from the gate's
refusal, and a warning for a tool the model is told nothing about.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from loopfence import Agent, Limits, Policy, ScriptedModel, arun, batch, run, stream, tool, workspace_tools
from loopfence.cli import cli
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
GUARD_MODULE = '''
from loopfence import Guard

class DeleteTwice(Guard):
    def __init__(self) -> None:
        self.deletes = 0

    def before_execution(self, s, c, reuse):
        if c.tool.name.startswith("delete_"):
            self.deletes += 1
            self.note(s, f"delete number {self.deletes}", path=c.args.get("path"))
            if self.deletes == 2:
                return self.stop(f"{c.tool.name}: a second delete_* call", limit=1, value=2)
        return None
'''


def lf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPFENCE_", "OPENAI_"))}
    return subprocess.run([*EXE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def _delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


def ship_log(path: Path) -> Path:
    model = ScriptedModel([calls_reply(tool_call("read_file", path="a")), text_reply("done")])
    run("read a", model=model, tools=[tool(_read_file, name="read_file", kind="read_only")], log=path)
    return path


def kill_log(path: Path) -> Path:
    model = ScriptedModel([calls_reply(tool_call("read_file", path="a"))])  # the same call forever
    result = run("read a", model=model, tools=[tool(_read_file, name="read_file", kind="read_only")], log=path)
    assert result.verdict == "KILL"
    return path


# -- 1. several logs ---------------------------------------------------------------------------------
@pytest.fixture
def logs(tmp_path: Path) -> list[Path]:
    return [ship_log(tmp_path / "a.jsonl"), kill_log(tmp_path / "b.jsonl"), ship_log(tmp_path / "c.jsonl")]


def test_reconcile_takes_several_logs_a_verdict_line_each_and_a_summary(logs: list[Path], tmp_path: Path) -> None:
    p = lf("reconcile", *map(str, logs), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for log in logs:
        assert f"{log}: reconcile: all 14 invariants hold" in p.stderr
    assert "reconcile: 3 logs: 3 hold, 0 FAIL, 0 unfinished, 0 unchecked (a custom guard), 0 unreadable" in p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["log"] for r in rows] == list(map(str, logs)) and all(r["ok"] for r in rows)


def test_several_logs_exit_with_the_worst(logs: list[Path], tmp_path: Path) -> None:
    unfinished = tmp_path / "d.jsonl"
    unfinished.write_text("".join(logs[0].read_text().splitlines(keepends=True)[:-1]))
    assert cli(["reconcile", *map(str, logs), str(unfinished)]) == 3
    failing = tmp_path / "e.jsonl"  # a ledger that does not add up
    lines = logs[0].read_text().splitlines()
    stop = json.loads(lines[-1])
    stop["ledger"]["tool_executions"] += 1
    failing.write_text("\n".join([*lines[:-1], json.dumps(stop)]) + "\n")
    assert cli(["reconcile", *map(str, logs), str(unfinished), str(failing)]) == 1
    garbage = tmp_path / "f.jsonl"
    garbage.write_bytes(os.urandom(2000))
    p = lf("reconcile", *map(str, logs), str(unfinished), str(failing), str(garbage), cwd=tmp_path)
    assert p.returncode == 2 and f"{garbage}: not a readable run log" in p.stderr
    assert "reconcile: 6 logs: 3 hold, 1 FAIL, 1 unfinished, 0 unchecked (a custom guard), 1 unreadable" in p.stderr


@pytest.mark.parametrize("command", ["replay", "resume"])
def test_commands_of_one_log_say_so_and_name_the_newest(command: str, logs: list[Path], tmp_path: Path) -> None:
    os.utime(logs[1], (2e9, 2e9))
    p = lf(command, *map(str, logs), cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"{command} takes one log, got 3" in p.stderr and f"the newest is {logs[1]}" in p.stderr
    assert "unrecognized arguments" not in p.stderr and "usage: loopfence [-h]" not in p.stderr


def test_report_writes_a_page_next_to_each_log(logs: list[Path], tmp_path: Path) -> None:
    p = lf("report", *map(str, logs), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(log.with_suffix(".html")) for log in logs]
    assert all(log.with_suffix(".html").stat().st_size > 1000 for log in logs)
    refused = lf("report", *map(str, logs), "-o", "one.html", cwd=tmp_path)
    assert refused.returncode == 2 and "-o names one page, and there are 3 logs" in refused.stderr


def test_export_of_several_logs_is_json_lines(logs: list[Path], tmp_path: Path) -> None:
    p = lf("export", *map(str, logs), "--format", "atif", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    docs = [json.loads(line) for line in p.stdout.splitlines()]
    assert [d["schema_version"] for d in docs] == ["ATIF-v1.4"] * 3
    assert len({d["session_id"] for d in docs}) == 3
    assert cli(["export", *map(str, logs), str(tmp_path / "nothere.jsonl"), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 3  # what could be read is written
    assert cli(["export", str(logs[0]), "-o", str(tmp_path / "one.jsonl")]) == 0  # a glob that matched one log
    assert len([json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]) == 1


def test_a_mistyped_flag_shows_the_commands_usage_and_the_nearest_flag(tmp_path: Path) -> None:
    p = lf("run", "hi", "--limt", "max_steps=3", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.startswith("usage: loopfence run ")
    assert "loopfence run: error: unrecognized arguments: --limt max_steps=3 (did you mean --limit?)" in p.stderr
    p = lf("reconcile", "x.jsonl", "--jsn", cwd=tmp_path)
    assert p.stderr.startswith("usage: loopfence reconcile ") and "(did you mean --json?)" in p.stderr
    p = lf("replay", "x.jsonl", "--zzzzzz", cwd=tmp_path)  # nothing near: no guess
    assert "unrecognized arguments: --zzzzzz\n" in p.stderr
    p = lf("--quiet", "run", "hi", cwd=tmp_path)  # a command's flag before the command
    assert "--quiet goes after the command: loopfence COMMAND --quiet" in p.stderr
    usage = lf("replay", "--help", cwd=tmp_path).stdout
    assert "LOG.jsonl\n" in usage and "[LOG.jsonl ...]" not in usage  # it takes one


# -- 2. a custom guard -------------------------------------------------------------------------------
@pytest.fixture
def guard_log(tmp_path: Path) -> Path:
    (tmp_path / "myguards.py").write_text(GUARD_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import myguards  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("myguards", None)
    model = ScriptedModel([calls_reply(tool_call("delete_file", path="a")),
                           calls_reply(tool_call("delete_file", path="b")), text_reply("done")])
    path = tmp_path / "guard.jsonl"
    result = run("tidy", model=model, tools=[tool(_delete_file, name="delete_file")],
                 guards=[myguards.DeleteTwice()], log=path)
    assert result.stop.reason == "guard"
    return path


def test_reconcile_without_the_guard_says_unchecked_naming_it(guard_log: Path) -> None:
    p = lf("reconcile", str(guard_log), "--json", cwd=guard_log.parent)
    assert p.returncode == 4, p.stderr  # not 1 (nothing failed), not 0 (not everything was checked)
    assert "FAIL" not in p.stderr
    assert "all 13 invariants checked hold; limit_reached unchecked (custom guard DeleteTwice: give it with " \
        "--guard MODULE:NAME)" in p.stderr
    out = json.loads(p.stdout)
    assert out["unchecked"] == ["limit_reached"] and out["custom_guards"] == ["DeleteTwice"]
    assert out["holds"] and not out["ok"]


def test_reconcile_and_replay_with_the_guard_check_it(guard_log: Path) -> None:
    p = lf("reconcile", str(guard_log), "--guard", "myguards:DeleteTwice", cwd=guard_log.parent)
    assert p.returncode == 0 and "all 14 invariants hold" in p.stderr, p.stderr
    assert lf("reconcile", str(guard_log), str(guard_log), "--guard", "myguards:DeleteTwice",
              cwd=guard_log.parent).returncode == 0  # a fresh guard for each log
    p = lf("replay", str(guard_log), "--guard", "myguards:DeleteTwice", cwd=guard_log.parent)
    assert p.returncode == 0 and "replayed identically: guard at step 2" in p.stderr, p.stderr


def test_replay_without_the_guard_names_it_and_the_flag(guard_log: Path) -> None:
    p = lf("replay", str(guard_log), cwd=guard_log.parent)
    assert p.returncode == 2 and "diverges" not in p.stderr
    assert "the run had the custom guard 'DeleteTwice'" in p.stderr and "--guard MODULE:DeleteTwice" in p.stderr


def test_a_custom_guard_hides_no_other_failure(tmp_path: Path) -> None:
    """A guard that only wrote notes decides nothing: a log whose limits were edited still FAILs; and a
    guard's stop with a header that cannot be read is a failure, not unchecked."""
    (tmp_path / "notes.py").write_text("from loopfence import Guard\n\nclass Notes(Guard):\n"
                                       "    def before_execution(self, s, c, reuse):\n"
                                       "        self.note(s, 'saw a call')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import notes  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("notes", None)
    log = tmp_path / "n.jsonl"
    model = ScriptedModel([calls_reply(tool_call("read_file", path=str(i))) for i in range(5)])
    result = run("read", model=model, tools=[tool(_read_file, name="read_file", kind="read_only")],
                 limits={"max_steps": 2}, guards=[notes.Notes()], log=log)
    assert result.stop.reason == "max_steps"
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    header["limits"]["max_steps"] = 10  # the stop is no longer earned
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert reconcile(log).ok  # notes alone: the fold checks it all
    rec = reconcile(forged)
    assert not rec.holds and rec.check("limit_reached").ok is False and rec.custom_guards == ()
    assert cli(["reconcile", str(forged)]) == 1


def test_a_guards_stop_under_an_unreadable_header_fails(guard_log: Path, tmp_path: Path) -> None:
    lines = guard_log.read_text().splitlines()
    header = json.loads(lines[0])
    header["limits"]["max_steps"] = "many"
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    rec = reconcile(edited)
    assert not rec.holds and "header limits unreadable" in rec.check("limit_reached").detail
    p = lf("reconcile", str(guard_log), "--guard", "myguards:nothere", cwd=guard_log.parent)
    assert p.returncode == 2 and "--guard myguards:nothere: myguards has no attribute 'nothere'" in p.stderr


@pytest.mark.parametrize("spec,said", [("myguards", "expects module:attr"), ("os:sep", "expected a Guard subclass")])
def test_a_bad_guard_flag_is_one_line(guard_log: Path, spec: str, said: str) -> None:
    p = lf("reconcile", str(guard_log), "--guard", spec, cwd=guard_log.parent)
    assert p.returncode == 2 and said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# -- 3. tools= ---------------------------------------------------------------------------------------
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("tools", [weather, tool(weather)])
def test_a_single_tool_is_taken_as_a_list_of_one(tools: Any) -> None:
    model = ScriptedModel([calls_reply(tool_call("weather", city="Oslo")), text_reply("sunny")])
    result = run("weather?", model=model, tools=tools)
    assert result.final_answer == "sunny" and result.ledger.tool_executions == 1


@pytest.mark.parametrize("tools,said", [
    ("weather", "got the string 'weather'"), ({"w": weather}, "got a dict"), (3, "got an int"),
    ([None], "tools[0] is None, not a tool"), ([weather, 5], "tools[1] is an int, not a tool"),
    ([Limits], "tools[0] is the class Limits, not a tool")])
def test_what_tools_takes_is_said(tools: Any, said: str) -> None:
    for make in (lambda: run("hi", model=ScriptedModel([text_reply("x")]), tools=tools),
                 lambda: Agent(model=ScriptedModel([text_reply("x")]), tools=tools)):
        with pytest.raises(TypeError) as err:
            make()
        text = str(err.value)
        assert said in text and "tools= takes a list" in text and "tools=[weather]" in text


def test_a_lambdas_error_names_the_tool_it_was_given() -> None:
    with pytest.raises(TypeError, match=r"^tool va: \*args/\*\*kwargs are not allowed"):
        tool(lambda *a: a, name="va")


# -- 4. keyword typos --------------------------------------------------------------------------------
def _model() -> ScriptedModel:
    return ScriptedModel([text_reply("x")])


@pytest.mark.parametrize("call,name", [
    (lambda: run("hi", model=_model(), limts={}), "run()"),
    (lambda: stream("hi", model=_model(), limts={}), "stream()"),
    (lambda: Agent(model=_model(), limts={}), "Agent()"),
    (lambda: Agent(model=_model()).run("hi", limts={}), "Agent.run()"),
    (lambda: Agent(model=_model()).stream("hi", limts={}), "Agent.stream()"),
])
def test_a_mistyped_setting_names_what_was_called_and_the_nearest(call: Any, name: str) -> None:
    with pytest.raises(TypeError) as err:
        call()
    text = str(err.value)
    assert text.startswith(f"{name} got an unknown keyword 'limts' (did you mean 'limits'?); it takes: ")
    assert "model, tools, limits, policy" in text and "Agent.__init__" not in text


def test_arun_names_itself() -> None:
    with pytest.raises(TypeError, match=r"^arun\(\) got an unknown keyword 'limts' \(did you mean 'limits'\?\)"):
        asyncio.run(arun("hi", model=_model(), limts={}))


@pytest.mark.parametrize("call,said", [
    (lambda: Limits(max_step=3), "Limits() got an unknown keyword 'max_step' (did you mean 'max_steps'?)"),
    (lambda: Limits().replace(max_step=3), "Limits() got an unknown keyword 'max_step'"),
    (lambda: Policy(nudg=True), "Policy() got an unknown keyword 'nudg' (did you mean 'nudge'?)"),
    (lambda: tool(weather, knd="read_only"), "tool() got an unknown keyword 'knd' (did you mean 'kind'?)"),
    (lambda: workspace_tools(".", sandbx=False), "workspace_tools() got an unknown keyword 'sandbx'"),
    (lambda: batch([], model=_model(), out="x", concurency=2), "batch() got an unknown keyword 'concurency' "
     "(did you mean 'concurrency'?)"),
    (lambda: Agent(model=_model(), limit=3, polcy={}), "Agent() got an unknown keyword 'limit' (did you mean "
     "'limits'?) (and 'polcy')"),
    (lambda: Agent(model=_model(), xyzzy=1), "Agent() got an unknown keyword 'xyzzy'; it takes: model,"),
])
def test_every_public_call_says_the_same(call: Any, said: str) -> None:
    with pytest.raises(TypeError) as err:
        call()
    assert str(err.value).startswith(said), str(err.value)


def test_openai_model_too() -> None:
    from loopfence import OpenAIModel

    with pytest.raises(TypeError, match=r"^OpenAIModel\(\) got an unknown keyword 'base_ur' \(did you mean 'base_url'"):
        OpenAIModel(base_ur="http://127.0.0.1:9/v1")


# -- 5. hints ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["reconcile", "replay", "resume", "export", "report"])
def test_random_bytes_are_said_to_be_what_they_are_by_every_command(command: str, tmp_path: Path) -> None:
    garbage = tmp_path / "r.jsonl"
    garbage.write_bytes(b"\xff\xfe" + os.urandom(3000))
    p = lf(command, str(garbage), cwd=tmp_path)
    assert p.returncode == 2 and f"{garbage}:1: not UTF-8 text" in p.stderr, p.stderr
    assert "truncated" not in p.stderr and "resume reads back" not in p.stderr


def test_a_log_cut_mid_line_is_still_said_so(logs: list[Path], tmp_path: Path) -> None:
    torn = tmp_path / "torn.jsonl"
    torn.write_text(logs[0].read_text()[:-20])
    p = lf("replay", str(torn), cwd=tmp_path)
    assert p.returncode == 2 and "truncated last line" in p.stderr


def test_a_missing_log_has_no_line_zero(tmp_path: Path) -> None:
    p = lf("replay", "nothere.jsonl", cwd=tmp_path)
    assert p.returncode == 2 and "nothere.jsonl: run log not found" in p.stderr and ":0:" not in p.stderr


def test_the_resume_hint_for_a_python_run_names_the_workspace_it_needs(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "app").mkdir(parents=True)
    (ws / "app" / "config.py").write_text("DEBUG = False\n")
    log = tmp_path / "py.jsonl"
    model = ScriptedModel([calls_reply(tool_call("read_file", path="app/config.py")), text_reply("done")])
    run("read", model=model, tools=workspace_tools(ws), log=log)
    killed = tmp_path / "killed.jsonl"
    killed.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))
    p = lf("reconcile", str(killed), cwd=tmp_path)
    assert p.returncode == 3
    assert f"`loopfence resume {killed} --workspace DIR` continues it" in p.stderr
    assert "DIR: the folder the run's workspace_tools() had" in p.stderr
    resumed = lf("resume", str(killed), "--workspace", str(ws), "--quiet", cwd=tmp_path)  # the hint works
    assert resumed.returncode == 0 and resumed.stdout.strip() == "done", resumed.stderr


def test_schema_of_an_unknown_name_says_what_there_is(tmp_path: Path) -> None:
    p = lf("schema", "foo", cwd=tmp_path)
    assert p.returncode == 2 and "argument what" not in p.stderr
    assert "no schema named 'foo'; there is: events" in p.stderr


def test_a_bad_batch_file_lists_the_keys_once(tmp_path: Path) -> None:
    episodes = tmp_path / "e.jsonl"
    episodes.write_text("".join(json.dumps({"id": f"e{i}", "task": "t", "bogus": 1}) + "\n" for i in range(12))
                        + json.dumps({"id": "x", "tsk": "t"}) + "\n")
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps(text_reply("x")) + "\n")
    p = lf("batch", str(episodes), "--out", str(tmp_path / "out"), "--script", str(script), cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.count("id, task, system, workspace") == 1, p.stderr
    assert "tsk: unknown key (did you mean 'task'?)" in p.stderr and "bogus: unknown key;" in p.stderr


# -- 6. --quiet says why a run was killed ------------------------------------------------------------
def test_quiet_kill_prints_the_stop_on_stderr(tmp_path: Path) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps(calls_reply(tool_call("list_dir", path="."))) + "\n")
    log = tmp_path / "q.jsonl"
    p = lf("run", "hi", "--script", str(script), "--workspace", str(tmp_path), "--quiet", "--log", str(log),
           cwd=tmp_path)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        f"stop no_progress (KILL): step 2: all 1 call(s) were answered from the cache; nothing new was learned "
        f"(log: {log})"]
    (tmp_path / "a.jsonl").write_text(json.dumps(text_reply("hello")) + "\n")
    ship = lf("run", "hi", "--script", str(tmp_path / "a.jsonl"), "--quiet", "--log", str(tmp_path / "s2.jsonl"),
              cwd=tmp_path)
    assert ship.returncode == 0 and ship.stdout == "hello\n" and ship.stderr == ""  # an answer: nothing more


# -- 7. a tool's PermissionError is not the gate's refusal -------------------------------------------
def test_a_permission_error_inside_a_tool_is_its_own_error() -> None:
    def locked(path: str) -> str:
        """Read a locked file."""
        raise PermissionError(13, "Permission denied", path)

    model = ScriptedModel([calls_reply(tool_call("locked", path="/root/x")), text_reply("done")])
    result = run("read", model=model, tools=[tool(locked, kind="read_only")])
    tool_msg = next(m for m in result.messages if m["role"] == "tool")
    body = json.loads(tool_msg["content"])
    assert body["error"] == "os_permission_error" and "PermissionError" in body["message"]
    assert body["error"] != "permission_denied"  # the taint gate's refusal keeps that name


# -- 8. a tool the model is told nothing about -------------------------------------------------------
def test_a_tool_with_no_hints_warns_once_naming_what_is_missing() -> None:
    def lookup_zz9(city):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        return city

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = tool(lookup_zz9)
        tool(lookup_zz9)  # once per tool
    said = [str(w.message) for w in caught if "lookup_zz9" in str(w.message)]
    assert said == ["loopfence: tool 'lookup_zz9' is missing type hints on city and a docstring (or description=): "
                    "the model is told those arguments take any value and nothing of what it does; add them to the "
                    "function"]
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert made.schema()["function"]["parameters"]["properties"] == {"city": {}}


def test_a_typed_documented_tool_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tool(weather)
