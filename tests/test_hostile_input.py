"""Issue 12, section 3: hostile input ends named, never a traceback, never a lost log line.

Lone surrogates, deep nesting and huge integers at every JSON boundary (the ring, scripts, drill
files, logs); inputs that are too big, empty or not files; a log that cannot be written; a replay
that would print a huge event. Each test's assertion is the named stop or the one-line error, and
every log a run wrote reconciles (and replays)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, RunLog, ScriptedModel, StopReason, run, workspace_tools
from loopfence._json import MAX_DEPTH, MAX_INT_DIGITS, JsonLimitError, dumps, loads
from loopfence.runlog import read_log, reconcile
from loopfence._drivers._replay import replay
from loopfence.testing import calls_reply, text_reply, tool_call

from _cli_support import drill_file_error

EXE = [sys.executable, "-m", "loopfence"]
DEEP = 100_000


def lf(*args: str, cwd: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=120, **kw)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-4000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr[-2000:]
    return lines[0]


def holds(log: Path) -> None:
    """The log reads back, reconciles and replays identically."""
    rec = reconcile(log)
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    assert replay(log).ok


def go(ws: Path, replies: list[Any], **kw: Any) -> Any:
    log = ws.parent / "run.jsonl"
    result = run("task", model=ScriptedModel(replies), tools=workspace_tools(ws, sandbox=False),
                 log=RunLog(log), header={"workspace": str(ws)}, **kw)
    assert read_log(log).stop is not None
    holds(log)
    return result, log


def script(path: Path, replies: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("alpha\n")
    return root


# ------------------------------------------------------------------ lone surrogates


def test_a_lone_surrogate_in_the_content_is_logged_and_the_run_ships(ws: Path) -> None:
    result, log = go(ws, [text_reply("x\ud800y")])
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.final_answer == "x\ud800y"
    line = log.read_text(encoding="utf-8").splitlines()[2]
    assert "\\ud800" in line  # escaped in the JSON line: the file is UTF-8 and reads back the same
    assert read_log(log).of("reply")[0].record["raw"]["choices"][0]["message"]["content"] == "x\ud800y"


def test_lone_surrogates_in_arguments_are_logged_with_their_result(ws: Path) -> None:
    replies = [calls_reply(tool_call("write_file", '{"path": "b.txt", "content": "\\udfff!"}'),
                           tool_call("write_file", '{"path": "c\\ud800.txt", "content": "x"}'),
                           tool_call("read_file", '{"path": "a.txt", "encoding": "\\ud800"}')),
               text_reply("ok")]
    result, log = go(ws, replies)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    results = read_log(log).of("result")
    assert [r.record["ok"] for r in results] == [True, False, False]
    assert results[1].record["error"] == "invalid_path" and "lone surrogate" in results[1].record["content"]
    assert (ws / "b.txt").read_bytes() == b"\xed\xbf\xbf!"  # written as the model sent it


def test_a_lone_surrogate_from_the_cli_is_escaped_on_the_terminal(tmp_path: Path, ws: Path) -> None:
    s = script(tmp_path / "s.jsonl", [text_reply("hi \ud800 there")])
    p = lf("run", "t", "--script", str(s), "--log", str(tmp_path / "r.jsonl"), "--workspace", str(ws),
           cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "hi \\ud800 there\n" and "Traceback" not in p.stderr
    holds(tmp_path / "r.jsonl")


def test_dumps_escapes_lone_surrogates_and_reads_back() -> None:
    value = {"k\udc80": ["\\\ud800", "ok \u00e9"]}
    text = dumps(value)
    text.encode("utf-8")
    assert loads(text) == value


# ------------------------------------------------------------------ depth and size


def test_arguments_nested_100000_deep_are_refused_by_the_contract(ws: Path) -> None:
    args = '{"path": ' + "[" * DEEP + "]" * DEEP + "}"
    result, log = go(ws, [calls_reply(tool_call("read_file", args)), text_reply("ok")])
    assert result.stop.reason is StopReason.SCHEMA_MISMATCH
    assert result.stop.detail == ("read_file: arguments are over a limit: nested 100,001 levels deep "
                                  "(the limit is 64)")
    assert lf("export", str(log), cwd=ws.parent).returncode == 0


def test_arguments_deep_as_an_object_and_a_huge_integer_are_refused_too(ws: Path) -> None:
    nested: Any = "x"
    for _ in range(70):
        nested = {"a": nested}
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": nested}}
    reply = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]},
                          "finish_reason": "tool_calls"}]}
    result, _ = go(ws, [reply, text_reply("ok")])
    assert result.stop.reason is StopReason.SCHEMA_MISMATCH and "nested 70 levels deep" in result.stop.detail
    huge = '{"path": "a.txt", "page": ' + "9" * 5_000 + "}"
    result, _ = go(ws, [calls_reply(tool_call("read_file", huge)), text_reply("ok")])
    assert result.stop.reason is StopReason.SCHEMA_MISMATCH
    assert f"an integer with 5,000 digits (the limit is {MAX_INT_DIGITS:,})" in result.stop.detail


def test_a_reply_nested_past_the_limit_ends_as_an_endpoint_error(ws: Path) -> None:
    nested: Any = {}
    for _ in range(250):
        nested = {"a": nested}
    reply = text_reply("hi")
    reply["extra"] = nested

    class Deep:  # an adapter of one's own: nothing parsed its reply with a bound
        def complete(self, request: Any) -> Any:
            from loopfence._messages import Reply

            return Reply.from_response(reply)

    log = ws.parent / "deep.jsonl"
    result = run("t", model=Deep(), tools=workspace_tools(ws), log=RunLog(log))
    assert result.stop.reason is StopReason.ENDPOINT_ERROR
    assert result.stop.detail == (f"the reply is nested 252 levels deep (the limit is {MAX_DEPTH}): the log "
                                  "could not record it")
    assert reconcile(log).ok
    with pytest.raises(ValueError, match=f"scripted reply 2 is nested 252 levels deep \\(the limit is {MAX_DEPTH}\\)"):
        ScriptedModel([text_reply("a"), reply])  # its header would record it


def test_bounded_parse_names_the_limit() -> None:
    with pytest.raises(JsonLimitError, match=f"nested 100,000 levels deep \\(the limit is {MAX_DEPTH}\\)"):
        loads("[" * DEEP + "]" * DEEP)
    with pytest.raises(JsonLimitError, match="an integer with 5,000 digits"):
        loads("1" * 5_000)
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None


def test_a_deep_script_line_is_one_line_naming_file_line_and_limit(tmp_path: Path, ws: Path) -> None:
    s = tmp_path / "s.jsonl"
    s.write_text(json.dumps(text_reply("a")) + "\n" + "[" * DEEP + "]" * DEEP + "\n", encoding="utf-8")
    line = one_line_error(lf("run", "t", "--script", str(s), "--log", str(tmp_path / "r.jsonl"),
                             "--workspace", str(ws), cwd=tmp_path))
    assert f"s.jsonl:2: JSON over a limit: nested 100,000 levels deep (the limit is {MAX_DEPTH})" in line


def test_a_deep_drill_file_is_an_error_row_naming_it(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text('{"name": "x", "task": ' + "[" * DEEP + "]" * DEEP + "}")
    line = drill_file_error(lf("drill", str(tmp_path / "deep.json"), "--out", str(tmp_path / "out"),
                               cwd=tmp_path))
    assert "deep.json: JSON over a limit: nested 100,001 levels deep" in line


def test_a_drill_whose_model_nests_arguments_100000_deep_runs_and_reads_its_log(tmp_path: Path) -> None:
    args = '{"path": ' + "[" * DEEP + "]" * DEEP + "}"
    scenario = {"name": "deep", "task": "t", "tools": ["read_file"],
                "replies": [calls_reply(tool_call("read_file", args))], "expect": {"stop": "schema_mismatch"}}
    (tmp_path / "deep.json").write_text(json.dumps(scenario))
    p = lf("drill", str(tmp_path / "deep.json"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert reconcile(tmp_path / "out" / "deep.jsonl").ok


@pytest.mark.parametrize("command", ["reconcile", "replay", "export", "resume"])
@pytest.mark.parametrize("bad", ["integer", "deep"])
def test_a_log_line_over_a_limit_is_one_line_naming_the_line(tmp_path: Path, ws: Path, command: str,
                                                            bad: str) -> None:
    _, log = go(ws, [text_reply("done")])
    lines = log.read_text(encoding="utf-8").splitlines()
    lines.insert(1, '{"event": "gate", "seq": 1, "n": ' + "7" * 5_000 + "}" if bad == "integer" else
                 '{"event": "gate", "x": ' + "[" * DEEP + "]" * DEEP + "}")
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = one_line_error(lf(command, str(log), cwd=tmp_path))
    assert f"run.jsonl:2: JSON over a limit: {'an integer with 5,000 digits' if bad == 'integer' else 'nested'}" \
        in line


# ------------------------------------------------------------------ inputs that are not scripts


def test_script_from_dev_zero_is_a_bounded_read(tmp_path: Path, ws: Path) -> None:
    line = one_line_error(lf("run", "t", "--script", "/dev/zero", "--log", str(tmp_path / "r.jsonl"),
                             "--workspace", str(ws), cwd=tmp_path))
    assert "/dev/zero: script file is over the" in line and "-byte limit" in line


def test_a_100_mb_script_is_refused_before_it_is_read(tmp_path: Path, ws: Path) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("wb") as fh:
        fh.truncate(100 << 20)  # sparse: nothing is written
    line = one_line_error(lf("run", "t", "--script", str(big), "--log", str(tmp_path / "r.jsonl"),
                             "--workspace", str(ws), cwd=tmp_path))
    assert "big.jsonl: script file is over the" in line
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("text", ["[]", "  [ ]\n"])
def test_a_script_holding_an_empty_array_is_one_line(tmp_path: Path, ws: Path, text: str) -> None:
    (tmp_path / "s.json").write_text(text)
    line = one_line_error(lf("run", "t", "--script", str(tmp_path / "s.json"), "--log",
                             str(tmp_path / "r.jsonl"), "--workspace", str(ws), cwd=tmp_path))
    assert "s.json: script file is an empty array" in line


def test_the_header_records_the_script_file_not_its_replies(tmp_path: Path, ws: Path) -> None:
    replies = [calls_reply(tool_call("read_file", path="a.txt")), calls_reply(tool_call("list_dir")),
               text_reply("x" * 50_000)]
    s = script(tmp_path / "s.jsonl", replies)
    log = tmp_path / "r.jsonl"
    p = lf("run", "t", "--script", str(s), "--log", str(log), "--workspace", str(ws), "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    model = read_log(log).header.model
    assert "script" not in model and model["script_path"] == str(s.resolve())
    assert len(model["script_sha256"]) == 64
    assert len(log.read_text(encoding="utf-8").splitlines()[0]) < 10_000  # the header: no 50 KB reply
    assert lf("replay", str(log), cwd=tmp_path).returncode == 0
    # cut the run after its first result: resume reads the script file again and finishes it
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    first_result = next(i for i, x in enumerate(lines) if json.loads(x)["event"] == "result")
    log.write_text("".join(lines[:first_result + 1]), encoding="utf-8")
    p = lf("resume", str(log), "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    holds(log)
    # a script that changed since the run cannot continue it
    log.write_text("".join(lines[:first_result + 1]), encoding="utf-8")
    script(s, [text_reply("other")])
    line = one_line_error(lf("resume", str(log), cwd=tmp_path))
    assert "the script file changed since the run" in line


# ------------------------------------------------------------------ a log that cannot be written


def test_log_to_dev_full_is_one_line(tmp_path: Path, ws: Path) -> None:
    s = script(tmp_path / "s.jsonl", [text_reply("done")])
    line = one_line_error(lf("run", "t", "--script", str(s), "--log", "/dev/full", "--workspace", str(ws),
                             cwd=tmp_path))
    assert line.startswith("loopfence run: error: cannot write the run log /dev/full: No space left on device")


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (12_000, 12_000))  # Python ignores SIGXFSZ: writes fail


def test_a_disk_that_fills_mid_run_stops_it_and_resume_finishes_it(tmp_path: Path, ws: Path) -> None:
    replies = [calls_reply(tool_call("write_file", path=f"f{i}.txt", content="x" * 1_500)) for i in range(6)]
    s = script(tmp_path / "s.jsonl", [*replies, text_reply("done")])
    log = tmp_path / "r.jsonl"
    p = lf("run", "t", "--script", str(s), "--log", str(log), "--workspace", str(ws), "--quiet",
           "--unsandboxed", "--limit", "no_progress=off", cwd=tmp_path, preexec_fn=_small_files)
    line = one_line_error(p)
    assert "cannot write the run log" in line and "File too large" in line and "loopfence resume" in line
    assert read_log(log, tolerant=True).stop is None
    p = lf("resume", str(log), "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert read_log(log).stop.reason == "final_answer"
    assert reconcile(log).ok


def test_the_python_api_raises_the_write_error_and_writes_nothing_after_it(tmp_path: Path, ws: Path) -> None:
    from loopfence._log._writer import LogWriteError

    with pytest.raises(LogWriteError, match="/dev/full"):
        run("t", model=ScriptedModel([text_reply("done")]), tools=workspace_tools(ws), log="/dev/full")


# ------------------------------------------------------------------ replay prints bounded events


def test_replay_shows_a_huge_diverging_result_clipped(tmp_path: Path, ws: Path) -> None:
    _, log = go(ws, [calls_reply(tool_call("read_file", path="a.txt")), text_reply("done")])
    lines = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()]
    for e in lines:
        if e["event"] == "result":
            e["content"] = "y" * 5_000_000
    log.write_text("".join(json.dumps(e) + "\n" for e in lines), encoding="utf-8")
    p = lf("replay", str(log), "--execute-tools", cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "replay diverges from the log" in p.stderr and "more characters]" in p.stderr
    assert len(p.stderr) < 20_000


def test_replay_execute_tools_copies_a_fifo_and_leaves_no_temp_folder(tmp_path: Path, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    _, log = go(ws, [calls_reply(tool_call("read_file", path="pipe"), tool_call("list_dir")),
                     text_reply("done")])
    assert read_log(log).of("result")[0].record["error"] == "special_file"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = lf("replay", str(log), "--execute-tools", cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stderr
    assert "replayed identically" in p.stderr and not list(tmp.iterdir())


def test_replay_execute_tools_on_a_socket_is_one_line_and_cleans_up(tmp_path: Path, ws: Path) -> None:
    import socket

    _, log = go(ws, [text_reply("done")])
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(ws / "s.sock"))
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        line = one_line_error(lf("replay", str(log), "--execute-tools", cwd=tmp_path,
                                 env={**os.environ, "TMPDIR": str(tmp)}))
    finally:
        sock.close()
    assert "--execute-tools cannot copy the workspace" in line and "s.sock" in line
    assert not list(tmp.iterdir())


def test_a_reply_at_the_input_limit_is_logged_and_read_back(ws: Path) -> None:
    from loopfence._contract import MAX_ARGUMENT_DEPTH
    from loopfence._json import MAX_LOG_DEPTH

    assert MAX_ARGUMENT_DEPTH < MAX_DEPTH < MAX_LOG_DEPTH  # a log line wraps an input in its event
    nested: Any = "x"
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    reply = text_reply("hi")
    reply["extra"] = nested  # the reply is exactly MAX_DEPTH deep; its header copy is deeper
    result, _ = go(ws, [reply], limits=Limits(max_steps=2))
    assert result.stop.reason is StopReason.FINAL_ANSWER


# ------------------------------------------------------------------ from an HTTP endpoint

DEEP_BODY = '{"choices": ' + "[" * DEEP + "]" * DEEP + "}"


@pytest.mark.parametrize("form", [{"fault": "invalid_json", "body": DEEP_BODY},
                                  {"sse": f"data: {DEEP_BODY}\n\n"},
                                  {"status": 400, "body": DEEP_BODY},
                                  {"fault": "invalid_json", "body": '{"n": ' + "1" * 5_000 + "}"}])
def test_a_hostile_http_body_ends_named(ws: Path, form: dict[str, Any]) -> None:
    from loopfence.models import OpenAIModel
    from loopfence.testing import FakeServer

    log = ws.parent / "http.jsonl"
    with FakeServer([form]) as srv, OpenAIModel(srv.base_url, "m", None, max_retries=0) as model:
        result = run("t", model=model, tools=workspace_tools(ws), log=RunLog(log))
    assert result.stop.reason in (StopReason.ENDPOINT_ERROR, StopReason.INCOMPLETE_STREAM)
    assert "Traceback" not in result.stop.detail and "RecursionError" not in result.stop.detail
    assert reconcile(log).ok
