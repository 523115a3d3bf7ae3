"""Commands that behave alike (issue 20): --version, --model needs an endpoint, a quiet --quiet, exit
codes in every judging command's --help, and a closed stdout pipe ends any command without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import loopfence
from loopfence.cli import BROKEN_PIPE, cli
from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
DRILLS = Path(__file__).resolve().parent.parent / "drills"


def _script(path: Path, replies: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"loopfence {loopfence.__version__}"


@pytest.mark.parametrize("extra", [[], ["--script", "s.jsonl"]])
def test_run_refuses_model_without_base_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    monkeypatch.delenv("LOOPFENCE_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    _script(tmp_path / "s.jsonl", [text_reply("done")])
    assert cli(["run", "t", "--model", "gpt-x", "--log", str(tmp_path / "r.jsonl"), *extra]) == 2
    err = capsys.readouterr().err
    assert "loopfence run: error: --model needs --base-url" in err and not (tmp_path / "r.jsonl").exists()


def test_drill_refuses_model_without_base_url_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["drill", str(DRILLS / "000-unknown-tool.json"), "--model", "gpt-x"]) == 2
    assert "--model needs --base-url" in capsys.readouterr().err


def test_quiet_prints_only_the_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    script = _script(tmp_path / "s.jsonl", [calls_reply(tool_call("read_file", path="a.txt")), text_reply("it says hello")])
    args = ["run", "t", "--script", str(script), "--workspace", str(tmp_path), "--log", str(tmp_path / "r.jsonl")]
    assert cli([*args, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "it says hello\n" and captured.err == ""
    assert cli(args) == 0  # without it: the live lines, the summary, the token table, the reconcile line
    err = capsys.readouterr().err
    assert "loopfence run" in err and "tokens per turn" in err and "invariants hold" in err


def test_resume_quiet_prints_only_the_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log cut after its first turn, resumed with --quiet: the answer alone, nothing on stderr."""
    (tmp_path / "a.txt").write_text("hello\n")
    script = _script(tmp_path / "s.jsonl", [calls_reply(tool_call("read_file", path="a.txt")), text_reply("it says hello")])
    log = tmp_path / "r.jsonl"
    assert cli(["run", "t", "--script", str(script), "--workspace", str(tmp_path), "--log", str(log), "--quiet"]) == 0
    capsys.readouterr()
    lines = log.read_text(encoding="utf-8").splitlines()
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == "result")
    log.write_text("\n".join(lines[:cut + 1]) + "\n", encoding="utf-8")  # killed after the tool's result
    assert cli(["resume", str(log), "--quiet"]) == 0  # the header names the script
    captured = capsys.readouterr()
    assert captured.out == "it says hello\n" and captured.err == ""


@pytest.mark.parametrize("command", ["run", "batch", "drill", "replay", "reconcile", "resume"])
def test_every_judging_command_lists_its_exit_codes(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit" in text and " 0 " in text and " 1 " in text and " 2 " in text, text


@pytest.mark.parametrize("command", ["replay", "reconcile", "drill", "batch"])
def test_every_judging_command_but_run_and_resume_has_json(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli([command, "--help"]) == 0
    assert "--json" in capsys.readouterr().out


def _closed_stdout(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the console script with its stdout a pipe whose reading end is already closed: its first
    write to stdout fails with EPIPE, as under `| head` once head has gone."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*EXE, *args], cwd=cwd, stdout=write, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write)


def test_drill_json_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    p = _closed_stdout(["drill", str(DRILLS / "000-unknown-tool.json"), "--json", "--out", str(tmp_path / "o")],
                       tmp_path)
    err = p.stderr.decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert p.returncode == BROKEN_PIPE


@pytest.mark.parametrize("command", [["schema", "events"], ["--help"]])
def test_any_command_into_a_closed_pipe_ends_quietly(tmp_path: Path, command: list[str]) -> None:
    p = _closed_stdout(command, tmp_path)
    err = p.stderr.decode()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert p.returncode in (0, BROKEN_PIPE)  # argparse's help goes through its own exit


def test_a_long_answer_into_head_ends_without_a_traceback(tmp_path: Path) -> None:
    """A real `| head -c 5`: the answer (2 MB) is far larger than the pipe's buffer."""
    script = _script(tmp_path / "s.jsonl", [text_reply("x" * 2_000_000)])
    cmd = " ".join([*EXE, "run", "t", "--script", str(script), "--workspace", str(tmp_path), "--log",
                    str(tmp_path / "r.jsonl"), "--quiet"])
    p = subprocess.run(["bash", "-o", "pipefail", "-c", f"{cmd} | head -c 5"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.stdout == "xxxxx"
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert p.returncode == BROKEN_PIPE
