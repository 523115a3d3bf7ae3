"""Process-isolated tools: a timeout stops the work even when it fires before the child is set up."""

from __future__ import annotations

import time
from pathlib import Path

from loopfence.tools._process import run_in_process


def _late_write(flag: str) -> str:
    time.sleep(0.3)
    Path(flag).write_text("the work went on", encoding="utf-8")
    return "done"


def test_a_tiny_timeout_never_leaves_the_child_running(tmp_path: Path) -> None:
    """The timeout may fire before the child's setsid(): the kill must still find it."""
    flags = [tmp_path / f"flag-{i}" for i in range(40)]
    for flag in flags:
        status, _ = run_in_process(_late_write, {"flag": str(flag)}, 0.001)
        assert status == "timeout"
    time.sleep(0.6)  # any survivor writes its flag 0.3 s after it started
    survivors = [f.name for f in flags if f.exists()]
    assert not survivors, f"{len(survivors)} of {len(flags)} tool processes outlived their timeout"


def test_the_timeout_counts_from_when_the_child_is_ready(tmp_path: Path) -> None:
    status, value = run_in_process(_late_write, {"flag": str(tmp_path / "f")}, 5.0)
    assert (status, value) == ("ok", "done")
    assert (tmp_path / "f").read_text(encoding="utf-8") == "the work went on"
