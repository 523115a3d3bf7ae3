"""Run a Python tool in a child process so that its timeout stops the work, not only the waiting.

The child is forked (so closures work; arguments and the result must be picklable), starts its own
session and process group, and carries a marker in its environment. When the call ends, whether it
returned, raised or timed out, the whole group and every marked process are killed (SIGTERM, then
SIGKILL): nothing the tool started outlives the call. The child also dies if this process dies.
The timeout clock starts when the child says it is ready (after its setsid), so a timeout can never
fire while the child is still in this process's group, where the group kill would miss it.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import multiprocessing as mp
import os
import signal
import time
import uuid
from typing import Any

from .._aio import Expired, run_sync, within
from ._reap import MARKER_ENV, akill_tree, exited

__all__ = ["run_in_process", "arun_in_process", "KILL_GRACE_S", "READY_S"]

KILL_GRACE_S = 0.5
READY_S = 30.0  # how long a forked child may take to set itself up before the call gives up on it
_PR_SET_PDEATHSIG = 1


def _child(conn: Any, fn: Any, args: dict[str, Any], marker: str, parent_pid: int) -> None:
    os.setsid()  # own session and process group: the whole group is killed when the call ends
    os.environ[MARKER_ENV] = marker  # inherited by what the tool starts, even after a setsid
    _die_with_parent(parent_pid)
    try:
        conn.send(("ready", None))  # the parent starts the timeout clock only now: a kill finds us
        value = fn(**args)
        conn.send(("ok", asyncio.run(value) if inspect.iscoroutine(value) else value))
    except BaseException as exc:  # noqa: BLE001
        try:
            conn.send(("error", exc))
        except Exception:  # noqa: BLE001 - an unpicklable exception
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the timeout still kills the group
        return
    if os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


async def _readable(conn: Any) -> None:
    """Until the pipe has data or is closed (the child answered, or died)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)


async def _ready(conn: Any) -> bool:
    """Wait for the child's "ready" (sent after setsid and the marker); False if it died first."""
    try:
        await within(time.monotonic() + READY_S, _readable(conn))
        return bool(conn.recv()[0] == "ready")
    except (Expired, EOFError):
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _kill_all(proc: Any, marker: str) -> None:
    """The child's tree killed and the child reaped, waiting on the loop (other runs go on during
    the grace); cancelled while it waits, the child is killed at once."""
    try:
        await akill_tree(proc.pid, marker, KILL_GRACE_S)
        if not exited(proc.pid):  # not yet its own group (no setsid yet): kill it by pid
            _kill(proc.pid)
        deadline = time.monotonic() + 1.0
        while proc.exitcode is None and time.monotonic() < deadline:  # exitcode reaps it when it is done
            await asyncio.sleep(0.01)
    except BaseException:
        _kill(proc.pid)
        raise
    finally:
        proc.join(0)


def run_in_process(fn: Any, args: dict[str, Any], timeout_s: float | None) -> tuple[str, Any]:
    """The blocking form of `arun_in_process`."""
    return run_sync(arun_in_process(fn, args, timeout_s))


async def arun_in_process(fn: Any, args: dict[str, Any], timeout_s: float | None) -> tuple[str, Any]:
    """(status, value) of `fn(**args)` in a child process: "ok", "error" or "timeout". The child's
    whole tree is killed when the call ends, however it ends: returned, raised, timed out, or the
    awaiting cancelled (the cancel propagates once the tree is gone)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    marker = uuid.uuid4().hex
    proc = ctx.Process(target=_child, args=(child, fn, args, marker, os.getpid()), daemon=True)
    proc.start()
    child.close()
    status: tuple[str, Any] | None = None
    try:
        if not await _ready(parent):
            status = None  # the child died (or never got going) before it could run the tool
        else:
            try:  # the timeout clock starts now: the child is in its own group, where a kill finds it
                await within(None if timeout_s is None else time.monotonic() + timeout_s, _readable(parent))
                status = parent.recv()
            except Expired:
                status = ("timeout", None)
            except EOFError:
                status = None  # the child died without an answer
    finally:
        try:  # before any join: an unreaped child keeps its pid, so the group id cannot be reused
            if proc.pid:
                await _kill_all(proc, marker)
        finally:
            parent.close()
    if status is None:
        return "error", RuntimeError(f"tool process died (exit code {proc.exitcode})")
    return status
