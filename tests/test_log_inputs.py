"""What `reconcile`, `report` and `export` take as a log: a regular file only (a FIFO with no writer
is refused at once, never waited on), and a log whose lines were moved gets a warning naming the
first line out of place (as `reconcile` flags it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _runlog_support import config_script, edit_events, make_workspace, record

READERS = [["reconcile"], ["report"], ["export"], ["export", "--format", "otlp"]]


def loopfence(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopfence", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    record(tmp_path / "good.jsonl", config_script(), workspace=make_workspace(tmp_path))
    return tmp_path / "good.jsonl"


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_fifo_with_no_writer_is_refused_at_once(tmp_path: Path, command: list[str]) -> None:
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    try:
        done = loopfence(*command, str(fifo), "-o" if command[0] != "reconcile" else "--json",
                         *([str(tmp_path / "out")] if command[0] != "reconcile" else []), timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loopfence {' '.join(command)} waited on a FIFO with no writer")
    assert done.returncode == 2, done.stderr
    assert "FIFO" in done.stderr and str(fifo) in done.stderr and "regular file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", READERS[1:], ids=" ".join)
def test_a_log_with_lines_swapped_is_shown_with_a_warning(good: Path, tmp_path: Path,
                                                          command: list[str]) -> None:
    def swap(events: list[dict[str, Any]]) -> None:  # two lines moved, numbers left as they were
        events[-2], events[-3] = events[-3], events[-2]

    moved = edit_events(good, tmp_path / "moved.jsonl", swap, reseq=False)
    first = len(read(good)) - 2  # the first line out of place (1-based)
    done = loopfence(*command, str(moved), "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and f"line {first} has seq {first}" in warning[0], done.stderr
    assert str(moved) in warning[0] and "out of order" in warning[0]
    assert (tmp_path / "out").stat().st_size > 0  # the output still comes
    clean = loopfence(*command, str(good), "-o", str(tmp_path / "out2"))
    assert clean.returncode == 0 and "warning" not in clean.stderr, clean.stderr


def read(path: Path) -> list[str]:
    return path.read_text().splitlines()
