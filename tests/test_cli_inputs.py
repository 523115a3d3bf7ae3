"""Bad inputs through the real console script: one line on stderr, exit 2, never a traceback.

Limits that are not finite numbers, paths that cannot be written or read, and script contents the
reply loader must refuse (non-finite or negative usage, non-string content parts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits
from loopfence._limits import parse_limit
from loopfence.testing import text_reply

from _cli_support import drill_file_error

EXE = [sys.executable, "-m", "loopfence"]


def lf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def write_script(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write_script(tmp_path / "s.jsonl", [json.dumps(text_reply("done"))])


@pytest.fixture
def log(tmp_path: Path, script: Path) -> Path:
    path = tmp_path / "run.jsonl"
    p = lf("run", "t", "--script", str(script), "--log", str(path), "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return path


# 1. limits must be finite

@pytest.mark.parametrize("text", ["max_steps=1e400", "max_wall_seconds=1e400", "tool_timeout_s=-1e400"])
def test_a_non_finite_limit_is_one_line_naming_the_limit(tmp_path: Path, script: Path, text: str) -> None:
    name = text.split("=")[0]
    line = one_line_error(lf("run", "t", "--script", str(script), "--limit", text,
                             "--log", str(tmp_path / "r.jsonl"), cwd=tmp_path))
    assert name in line and "finite" in line
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("name", ["max_steps", "max_wall_seconds", "context_window"])
def test_limits_refuse_non_finite_values(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        Limits.from_json({name: value})


def test_parse_limit_refuses_a_number_too_big_for_a_float() -> None:
    with pytest.raises(ValueError, match="max_wall_seconds must be a finite number"):
        parse_limit("max_wall_seconds=1e400")
    assert parse_limit("max_wall_seconds=none") == ("max_wall_seconds", None)


def test_a_drill_file_with_an_infinite_limit_names_the_field(tmp_path: Path) -> None:
    doc = json.dumps({"name": "x", "task": "t", "replies": [text_reply("done")],
                      "limits": {"max_steps": 12}}).replace('"max_steps": 12', '"max_steps": 1e400')
    (tmp_path / "s.json").write_text(doc, encoding="utf-8")
    line = drill_file_error(lf("drill", "s.json", "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "s.json: limits.max_steps:" in line and "finite" in line


# 2. paths that cannot be written or read

def test_run_log_paths_that_cannot_be_written(tmp_path: Path, script: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    for bad in (str(tmp_path), "/proc/x/y.jsonl", str(tmp_path / "a-file" / "run.jsonl")):
        line = one_line_error(lf("run", "t", "--script", str(script), "--log", bad, cwd=tmp_path))
        assert line.startswith(f"loopfence run: error: --log {bad}: "), line


def test_export_output_paths_that_cannot_be_written(tmp_path: Path, log: Path) -> None:
    for bad in ("/proc/nope/x.json", str(tmp_path)):
        line = one_line_error(lf("export", str(log), "--output", bad, cwd=tmp_path))
        assert line.startswith(f"loopfence export: error: --output {bad}: "), line


def test_drill_out_folders_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"name": "x", "task": "t", "replies": [text_reply("ok")]}))
    (tmp_path / "a-file").write_text("x")
    for bad in ("/proc", "/proc/self", str(tmp_path / "a-file")):
        line = one_line_error(lf("drill", "s.json", "--out", bad, cwd=tmp_path))
        assert line.startswith(f"loopfence drill: error: --out {bad}: "), line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", [["replay"], ["resume"], ["reconcile"], ["export"],
                                     ["fake-server", "--script"], ["run", "t", "--script"], ["drill"]])
@pytest.mark.parametrize("where", ["missing", "folder"])
def test_input_paths_that_cannot_be_read(tmp_path: Path, command: list[str], where: str) -> None:
    bad = str(tmp_path / "nope.jsonl") if where == "missing" else str(tmp_path)
    line = one_line_error(lf(*command, bad, cwd=tmp_path))
    assert bad in line


# 3. script contents the reply loader refuses

def _reply(**over: Any) -> str:
    return json.dumps({**text_reply("done"), **over})


@pytest.mark.parametrize("bad, complaint", [
    ('{"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}], '
     '"usage": {"prompt_tokens": 1e400}}', "usage prompt_tokens must be a finite number >= 0"),
    ('{"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}], '
     '"usage": {"completion_tokens": NaN}}', "usage completion_tokens must be a finite number >= 0"),
    (_reply(usage={"prompt_tokens": -5, "completion_tokens": 1}), "usage prompt_tokens must be a finite"),
    (_reply(usage={"prompt_tokens": 5, "completion_tokens": -1}), "usage completion_tokens must be"),
    (_reply(choices=[{"message": {"role": "assistant", "content": [{"type": "text", "text": 5}]},
                      "finish_reason": "stop"}]), "content[0].text must be a string"),
])
def test_a_script_line_the_loader_refuses_is_named_by_file_and_line(tmp_path: Path, bad: str,
                                                                    complaint: str) -> None:
    path = write_script(tmp_path / "s.jsonl", [_reply(), bad])
    line = one_line_error(lf("run", "t", "--script", str(path), "--log", str(tmp_path / "r.jsonl"),
                             cwd=tmp_path))
    assert f"{path}:2: " in line and complaint in line, line


def test_text_content_parts_still_join(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "do"}, {"type": "image_url"}, {"type": "text", "text": "ne"}]
    path = write_script(tmp_path / "s.jsonl", [_reply(choices=[
        {"message": {"role": "assistant", "content": parts}, "finish_reason": "stop"}])])
    p = lf("run", "t", "--script", str(path), "--log", str(tmp_path / "r.jsonl"), "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "done"


@pytest.mark.parametrize("obj", [
    {**text_reply("x"), "usage": {"prompt_tokens": -5}},
    {**text_reply("x"), "usage": {"completion_tokens": float("inf")}},
    {"choices": [{"message": {"role": "assistant", "content": [{"type": "text", "text": 5}]}}]},
])
def test_an_endpoint_sending_the_same_is_an_endpoint_error(obj: dict[str, Any]) -> None:
    from loopfence._stops import StopError, StopReason
    from loopfence.models._stream import reply_from_response

    with pytest.raises(StopError) as info:
        reply_from_response(obj)
    assert info.value.stop.reason is StopReason.ENDPOINT_ERROR


# 5. nothing the user has is overwritten by mistake

def test_run_log_never_replaces_a_file_that_is_not_a_finished_run_log(tmp_path: Path, script: Path,
                                                                      log: Path) -> None:
    source = tmp_path / "config.py"
    source.write_text("DEBUG = False\n")
    unfinished = tmp_path / "unfinished.jsonl"
    unfinished.write_text("".join(log.read_text().splitlines(keepends=True)[:3]))
    for path, words in ((script, "is not a loopfence run log"), (source, "is not a loopfence run log"),
                        (unfinished, "loopfence resume")):
        before = path.read_bytes()
        line = one_line_error(lf("run", "t", "--script", str(script), "--log", str(path), "--quiet", cwd=tmp_path))
        assert words in line and str(path.name) in line
        assert path.read_bytes() == before
    again = lf("run", "t", "--script", str(script), "--log", str(log), "--quiet", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # a finished log: run again into it


def test_a_usage_error_found_late_leaves_an_existing_log_whole(tmp_path: Path, script: Path, log: Path) -> None:
    before = log.read_bytes()
    line = one_line_error(lf("run", "t", "--script", str(script), "--tools", "nosuchmod_xyz:x", "--log", str(log),
                             cwd=tmp_path))
    assert "nosuchmod_xyz" in line and log.read_bytes() == before


@pytest.mark.parametrize("command", [["report"], ["export"], ["export", "--format", "otlp"]])
def test_an_output_that_is_the_input_log_is_refused(tmp_path: Path, log: Path, command: list[str]) -> None:
    if "otlp" in command:
        pytest.importorskip("opentelemetry")
    before = log.read_bytes()
    line = one_line_error(lf(*command, str(log), "-o", str(log), cwd=tmp_path))
    assert "that is the input file" in line and log.read_bytes() == before


@pytest.mark.parametrize(("field", "value", "words"), [
    ("t", float("nan"), "finite"), ("t", 1e308, "less than or equal"), ("seq", -1, "greater than or equal"),
    ("started_at", "yesterday", "started_at")])
@pytest.mark.parametrize("command", [["export"], ["reconcile"]])
def test_a_header_with_an_impossible_time_is_refused_by_line_and_field(tmp_path: Path, log: Path, field: str,
                                                                      value: Any, words: str, command: list[str]) -> None:
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    header[field] = value
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")  # json.dumps writes NaN as NaN
    line = one_line_error(lf(*command, str(bad), cwd=tmp_path))
    assert f"{bad.name}:1" in line and field in line and words in line


def test_stdout_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        p = subprocess.run([*EXE, "schema", "events"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip() == "loopfence: cannot write the output: No space left on device"


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "soon"])
def test_mcp_timeout_must_be_a_positive_number_of_seconds(tmp_path: Path, script: Path, value: str) -> None:
    p = lf("run", "t", "--script", str(script), "--mcp-timeout", value, "--log", str(tmp_path / "m.jsonl"),
           cwd=tmp_path)
    assert p.returncode == 2 and "--mcp-timeout" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "m.jsonl").exists()


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path, script: Path, log: Path) -> None:
    """Windows editors start UTF-8 files with a BOM: no part of the JSON, so it is skipped."""
    bom = b"\xef\xbb\xbf"
    with_bom = tmp_path / "bom.jsonl"
    with_bom.write_bytes(bom + script.read_bytes())
    p = lf("run", "t", "--script", str(with_bom), "--log", str(tmp_path / "bom-run.jsonl"), "--quiet", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr
    log.write_bytes(bom + log.read_bytes())
    assert lf("reconcile", str(log), cwd=tmp_path).returncode == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(bom + b"{nope\n")
    assert "bad.jsonl:1" in one_line_error(lf("run", "t", "--script", str(bad), cwd=tmp_path))
