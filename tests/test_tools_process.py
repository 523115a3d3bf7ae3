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


def _deaf_sleeper() -> str:
    """Ignores SIGTERM, so its kill waits out the whole grace before the SIGKILL."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
    return "never"


def test_the_kill_grace_waits_on_the_loop_not_blocking_it() -> None:
    """Killing a process tool's tree (SIGTERM, the grace, SIGKILL) awaits its pauses: a heartbeat on
    the same loop ticks during the grace, and the child is gone when the call returns."""
    import asyncio

    from loopfence.tools import _process
    from loopfence.tools._process import KILL_GRACE_S, arun_in_process
    from loopfence.tools._reap import exited

    pids: list[int] = []
    real = _process._kill_all

    async def watched(proc, marker):  # type: ignore[no-untyped-def]
        pids.append(proc.pid)
        marks.append(("kill", time.monotonic()))
        await real(proc, marker)
        marks.append(("killed", time.monotonic()))

    marks: list[tuple[str, float]] = []

    async def main() -> tuple[str, object]:
        async def beat() -> None:
            while True:
                marks.append(("tick", time.monotonic()))
                await asyncio.sleep(0.01)

        heart = asyncio.create_task(beat())
        try:
            return await arun_in_process(_deaf_sleeper, {}, 0.2)
        finally:
            heart.cancel()

    _process._kill_all = watched  # type: ignore[assignment]
    try:
        status, _ = asyncio.run(main())
    finally:
        _process._kill_all = real  # type: ignore[assignment]
    assert status == "timeout"
    start = next(t for what, t in marks if what == "kill")
    end = next(t for what, t in marks if what == "killed")
    during = [t for what, t in marks if what == "tick" and start < t < end]
    assert end - start >= KILL_GRACE_S  # the deaf child made it wait the whole grace ...
    assert len(during) >= 2, f"{len(during)} heartbeat ticks during a {end - start:.2f}s kill"  # ... on the loop
    assert exited(pids[0])
