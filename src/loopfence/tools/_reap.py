"""Finding and killing everything a tool started: its process group, and any process that carries
the call's marker in its environment (which catches `setsid` double-forks that left the group)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Generator

__all__ = ["MARKER_ENV", "exited", "members", "kill_tree", "akill_tree", "reap_orphans"]

MARKER_ENV = "LOOPFENCE_COMMAND_ID"


def exited(pid: int) -> bool:
    """Has child `pid` exited? Leaves it unreaped: a zombie keeps its pid and group id from reuse."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _processes() -> Generator[tuple[int, bytes, list[bytes]], None, None]:
    """(pid, comm, the /proc/PID/stat fields after comm: state, ppid, pgrp, ...) of every process
    but this one that can still be read."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
            comm, fields = data[data.index(b"(") + 1:data.rindex(b")")], data.rsplit(b")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if len(fields) >= 3:
            yield int(name), comm, fields


def members(pgid: int, marker: str | None) -> list[int]:
    """Live processes in group `pgid` or carrying the marker (zombies excluded; never this process)."""
    found = []
    needle = f"{MARKER_ENV}={marker}".encode() if marker else None
    for pid, _, fields in _processes():
        if fields[0] in (b"Z", b"X"):
            continue
        if int(fields[2]) == pgid:
            found.append(pid)
        elif needle is not None:
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if needle in fh.read():
                        found.append(pid)
            except OSError:
                continue
    return found


def kill_tree(pgid: int, marker: str | None, grace: float) -> int:
    """SIGTERM, then (after `grace` seconds) SIGKILL, to the group and the marked processes.
    Returns how many processes other than the group leader were still alive."""
    steps = _kill_steps(pgid, marker, grace)
    try:
        while True:
            time.sleep(next(steps))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def akill_tree(pgid: int, marker: str | None, grace: float) -> int:
    """`kill_tree` that waits on the event loop, not on it: other runs go on during the grace."""
    steps = _kill_steps(pgid, marker, grace)
    try:
        while True:
            await asyncio.sleep(next(steps))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _kill_steps(pgid: int, marker: str | None, grace: float) -> Generator[float, None, int]:
    """The kill, yielding each pause it needs (the caller sleeps it, one way or the other)."""
    alive = members(pgid, marker)
    others = len([p for p in alive if p != pgid])
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
        if not alive:
            break
        _signal(pgid, alive, sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            yield 0.01
            alive = members(pgid, marker)
    return others


def _signal(pgid: int, pids: list[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_orphans() -> int:
    """When this process is PID 1 (a container's init: `docker run IMAGE loopfence ...` without
    `--init`), the sandbox's inner bwrap processes, orphaned when the outer one exits, become its
    children and stay zombies unless it reaps them: reap those that have exited. Only zombies named
    `bwrap`: a child that other code waits for is left to it. How many were reaped."""
    if os.getpid() != 1:
        return 0
    reaped = 0
    for pid, comm, fields in _processes():
        if comm == b"bwrap" and fields[0] == b"Z" and fields[1] == b"1":
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                continue
    return reaped
