"""`loopfence run`: seed 003's token table in the summary; gate and compaction flags."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from loopfence._commands._common import print_token_table
from loopfence.testing import calls_reply, text_reply, tool_call

EXE = [sys.executable, "-m", "loopfence"]
SEED_003 = [334, 903, 1518, 2127, 2640, 2967]  # prompt tokens per turn, break 3's paginated run


def lf(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          input=stdin if stdin is not None else "")


def write_script(path: Path, replies: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    return path


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "pages").mkdir()
    text = "".join(f"Sentence {i} of the Pi article, about a small coding agent. " for i in range(110))
    (tmp_path / "pages" / "pi.txt").write_text(text)
    return tmp_path


def test_token_table_rows_and_total():
    buf = io.StringIO()
    print_token_table([(p, 50) for p in SEED_003], Console(file=buf, width=100))
    out = buf.getvalue()
    assert "tokens per turn" in out and "10,489" in out and "300" in out
    for p in SEED_003:
        assert f"{p:,}" in out


def test_summary_prints_prompt_and_completion_per_turn_and_total(ws):
    replies = [calls_reply(tool_call("read_file", path="pages/pi.txt", page=n), usage=(p, 20 + n))
               for n, p in enumerate(SEED_003[:5], start=1)] + [text_reply("the note", usage=(SEED_003[5], 90))]
    script = write_script(ws / "s.jsonl", replies)
    p = lf("run", "Make a note from pages/pi.txt", "--script", str(script), "--workspace", str(ws),
           "--log", str(ws / "run.jsonl"), "--quiet", cwd=ws)
    assert "tokens per turn" in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if "│" in line]
    for turn, prompt in enumerate(SEED_003, start=1):
        assert any(f" {turn} " in line and f"{prompt:,}" in line for line in lines), (turn, p.stderr)
    total = next(line for line in lines if "total" in line)
    assert "10,489" in total and f"{sum(20 + n for n in range(1, 6)) + 90:,}" in total
    stop = events(ws / "run.jsonl")[-1]
    assert [s[0] for s in stop["per_step"]] == SEED_003
