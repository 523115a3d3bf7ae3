"""Run a Python tool in a child process so that its timeout stops the work, not only the waiting."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from typing import Any

__all__ = ["run_in_process"]


def _child(conn: Any, fn: Any, args: dict[str, Any]) -> None:
    os.setsid()  # own process group: the whole group is killed at the timeout
    try:
        conn.send(("ok", fn(**args)))
    except BaseException as exc:  # noqa: BLE001
        try:
            conn.send(("error", exc))
        except Exception:  # noqa: BLE001 - an unpicklable exception
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def run_in_process(fn: Any, args: dict[str, Any], timeout_s: float | None) -> tuple[str, Any]:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            try:
                return parent.recv()
            except EOFError:
                return "error", RuntimeError(f"tool process died (exit code {proc.exitcode})")
        return "timeout", None
    finally:
        _kill_group(proc)
        parent.close()


def _kill_group(proc: Any) -> None:
    if proc.is_alive() and proc.pid:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            proc.join(0.5)
            if not proc.is_alive():
                break
    proc.join(0.1)
