"""The strict reader: every broken log is an error naming the file and the line, never a green replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopfence.cli import cli
from loopfence.runlog import VERSION, LogError, read_log
from loopfence._log._schema import CallLine, HeaderLine, ReplyLine, RequestLine, ResultLine, StopLine

from _runlog_support import config_script, make_workspace, read_lines, record, write_lines


@pytest.fixture
def good(tmp_path: Path) -> Path:
    ws = make_workspace(tmp_path)
    record(tmp_path / "good.jsonl", config_script(), workspace=ws)
    return tmp_path / "good.jsonl"


def _error(path: Path, *, tolerant: bool = False) -> LogError:
    with pytest.raises(LogError) as info:
        read_log(path, tolerant=tolerant)
    return info.value


def test_a_good_log_reads_back_typed(good: Path) -> None:
    """The reader returns the schema's own models (the ones the ring writes), each with its line and record."""
    log = read_log(good)
    kinds = [type(e) for e in log.events]
    assert isinstance(log.header, HeaderLine) and log.header.task == "Read app/config.py" and log.header.workspace
    assert kinds[0] is RequestLine and kinds[1] is ReplyLine and CallLine in kinds and ResultLine in kinds
    assert isinstance(log.stop, StopLine) and log.stop.reason == "final_answer"
    assert [e.line for e in log.all_events] == list(range(1, len(log.events) + 2))
    assert [e.record for e in log.all_events] == read_lines(good)
    assert log.torn_bytes == 0 and log.complete_bytes == good.stat().st_size


def test_empty_file_is_an_error_naming_line_1(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    err = _error(p)
    assert err.line == 1 and str(err).startswith(f"{p}:1: empty file")
    assert _error(p, tolerant=True).line == 1  # nothing to resume either


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    assert str(tmp_path / "nope.jsonl") in str(_error(tmp_path / "nope.jsonl"))


def test_missing_header(good: Path, tmp_path: Path) -> None:
    p = tmp_path / "noheader.jsonl"
    write_lines(p, read_lines(good)[1:])
    err = _error(p)
    assert err.line == 1 and "first line must be a header" in str(err)


@pytest.mark.parametrize("field,value,words", [
    ("format", "something.else", "header format"),
    ("version", 7, "header version is 7, this loopfence writes version 6 and reads versions 1 to 6"),
    ("version", "2", "header version is '2'"),
])
def test_invalid_header(good: Path, tmp_path: Path, field: str, value: object, words: str) -> None:
    events = read_lines(good)
    events[0][field] = value
    p = tmp_path / "badheader.jsonl"
    write_lines(p, events)
    err = _error(p)
    assert err.line == 1 and words in str(err)


def test_a_line_that_is_not_json(good: Path, tmp_path: Path) -> None:
    lines = good.read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"
    p = tmp_path / "notjson.jsonl"
    p.write_text("".join(lines))
    err = _error(p)
    assert err.line == 4 and "not JSON" in str(err) and str(p) in str(err)
    assert _error(p, tolerant=True).line == 4  # damage before the last line is never tolerated


@pytest.mark.parametrize("text,words", [
    ("[1, 2]\n", "not a JSON object"),
    ('{"seq": 3}\n', "no \"event\" field"),
    ('{"event": "telepathy", "seq": 3, "t": 0.1}\n', "unknown event kind 'telepathy'"),
    ("\n", "blank line"),
])
def test_lines_that_are_not_events(good: Path, tmp_path: Path, text: str, words: str) -> None:
    lines = good.read_text().splitlines(keepends=True)
    lines.insert(2, text)
    p = tmp_path / "odd.jsonl"
    p.write_text("".join(lines))
    err = _error(p)
    assert err.line == 3 and words in str(err)


def test_a_field_of_the_wrong_type_names_event_and_field(good: Path, tmp_path: Path) -> None:
    events = read_lines(good)
    i = next(i for i, e in enumerate(events) if e["event"] == "result")
    events[i]["ok"] = "yes"
    p = tmp_path / "wrongtype.jsonl"
    write_lines(p, events)
    err = _error(p)
    assert err.line == i + 1 and "result event: field 'ok' must be a boolean" in str(err)


@pytest.mark.parametrize("kind,field,value,words", [
    ("call", "decision", "vaporized", "call event: unknown decision 'vaporized'"),
    ("result", "decision", "maybe", "result event: unknown decision 'maybe'"),
    ("stop", "reason", "bored", "stop event: unknown reason 'bored'"),
    ("request", "step", "1", "request event: field 'step' must be an integer, got str"),
    ("reply", "usage", {"prompt_tokens": 1}, "reply event: missing field 'usage.completion_tokens'"),
    ("result", "surprise", 1, "result event: unknown field 'surprise'"),
])
def test_a_hand_edited_line_is_refused_with_its_line(good: Path, tmp_path: Path, kind: str, field: str,
                                                     value: object, words: str) -> None:
    events = read_lines(good)
    i = next(i for i, e in enumerate(events) if e["event"] == kind)
    events[i][field] = value
    p = tmp_path / "edited.jsonl"
    write_lines(p, events)
    err = _error(p)
    assert err.line == i + 1 and str(err).startswith(f"{p}:{i + 1}: ") and words in str(err)


def test_a_version_1_log_still_reads(good: Path, tmp_path: Path) -> None:
    events = read_lines(good)
    assert events[0]["version"] == VERSION == 6
    events[0]["version"] = 1
    p = tmp_path / "v1.jsonl"
    write_lines(p, events)
    assert read_log(p).stop is not None


def test_a_second_header_is_an_error(good: Path, tmp_path: Path) -> None:
    events = read_lines(good)
    p = tmp_path / "twoheaders.jsonl"
    write_lines(p, [*events[:3], events[0], *events[3:]])
    assert _error(p).line == 4


def test_truncated_last_line_strict_error_tolerant_reads_to_last_complete_line(good: Path,
                                                                               tmp_path: Path) -> None:
    data = good.read_bytes()
    full = read_log(good)
    n_lines = data.count(b"\n")
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1 + 20  # 20 bytes into the last line
    p = tmp_path / "torn.jsonl"
    p.write_bytes(data[:cut])
    err = _error(p)
    assert err.line == n_lines and "truncated last line" in str(err)
    log = read_log(p, tolerant=True)
    assert log.torn_bytes == 20 and len(log.events) == len(full.events) - 1 and log.stop is None


def test_a_complete_json_line_without_its_newline_is_still_torn(good: Path, tmp_path: Path) -> None:
    p = tmp_path / "nonl.jsonl"
    p.write_bytes(good.read_bytes()[:-1])  # the stop line is whole JSON, but the write never finished
    assert "truncated last line" in str(_error(p))
    assert read_log(p, tolerant=True).stop is None


def test_every_cut_reads_back_to_its_last_complete_line(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == 0x0A]
    p = tmp_path / "cut.jsonl"
    for cut in range(ends[0], len(data) + 1, 7):
        p.write_bytes(data[:cut])
        log = read_log(p, tolerant=True)
        complete = max(e for e in ends if e <= cut)
        assert log.complete_bytes == complete and log.torn_bytes == cut - complete
        assert len(log.events) + 1 == ends.index(complete) + 1


def test_cli_refuses_a_broken_log_with_the_line(good: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "torn.jsonl"
    p.write_bytes(good.read_bytes()[:-5])
    for command in ("replay", "export"):
        assert cli([command, str(p)]) == 2
        err = capsys.readouterr().err
        assert f"{p}:" in err and "truncated last line" in err, command
    # reconcile reads a killed run's log as it is: unfinished (exit 3), its torn line named
    assert cli(["reconcile", str(p)]) == 3
    err = capsys.readouterr().err
    assert "the run is unfinished" in err and "then an incomplete line of" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli(["replay", str(empty)]) == 2
    assert f"{empty}:1: empty file" in capsys.readouterr().err


def test_header_tools_are_read_as_specs(good: Path) -> None:
    h = read_log(good).header
    names = [t.name for t in h.specs]
    assert "read_file" in names and "list_dir" in names
    raw = {t["function"]["name"]: t for t in json.loads(good.read_text().splitlines()[0])["tools"]}
    for spec in h.specs:
        assert spec.schema() == {"type": "function", "function": raw[spec.name]["function"]}


@pytest.mark.parametrize("tools,words", [
    ([{"type": "function", "function": {"name": "a"}}, {"type": "function"}],
     "header event: tools[1] is not an OpenAI tools[] entry with a function name"),
    ([{"type": "function", "function": {"name": "a"}, "kind": "pure"}], "header event: tools[0]: unknown kind 'pure'"),
])
def test_a_header_tool_that_is_not_a_spec_names_its_entry(good: Path, tmp_path: Path, tools: list,
                                                           words: str) -> None:
    lines = read_lines(good)
    lines[0]["tools"] = tools
    p = tmp_path / "tools.jsonl"
    write_lines(p, lines)
    err = _error(p)
    assert err.line == 1 and str(err) == f"{p}:1: {words}"


def test_a_reply_that_cannot_be_rebuilt_names_its_file_and_line(good: Path, tmp_path: Path) -> None:
    lines = read_lines(good)
    at = next(i for i, e in enumerate(lines) if e["event"] == "reply")
    lines[at]["raw"] = {"choices": "not a list"}
    p = tmp_path / "reply.jsonl"
    write_lines(p, lines)
    (reply,) = read_log(p).of("reply")[:1]  # the line itself is well-formed: the reader takes it
    with pytest.raises(LogError) as info:
        reply.reply()
    assert (info.value.path, info.value.line) == (str(p), at + 1)
    assert str(info.value).startswith(f"{p}:{at + 1}: reply event: the recorded raw response cannot be rebuilt")
