"""The bubblewrap sandbox for run_command: its arguments, and a cached probe that it can start.

Inside: no network, no capabilities, its own PID namespace (killed with its parent), the system
folders read-only, a private scratch /tmp discarded at exit, and the workspace as the only writable
host folder, mounted at its own path (so the paths the file tools report stay valid).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from ._reap import MARKER_ENV

__all__ = ["sandbox_prefix", "bwrap_args"]


def sandbox_prefix(root: Path, marker: str) -> list[str] | dict[str, Any]:
    """The argv before `/bin/sh -c COMMAND`, or the structured `sandbox_unavailable` error."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _unavailable("bubblewrap (bwrap) is not installed")
    problem = _probe(bwrap, root)
    if problem:
        return _unavailable(problem)
    return [*bwrap_args(bwrap, root), "--setenv", MARKER_ENV, marker, "--"]


def _unavailable(why: str) -> dict[str, Any]:
    return {"ok": False, "error": "sandbox_unavailable", "message": (
        f"run_command needs its sandbox and it cannot start: {why}. Nothing was run (fail closed)."),
        "hint": "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or opt out explicitly "
                "with `loopfence run --unsandboxed` / workspace_tools(..., sandbox=False)"}


def bwrap_args(bwrap: str, root: Path) -> list[str]:
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--bind", str(root), str(root), "--remount-ro", "/", "--chdir", str(root),
             "--hostname", "sandbox", "--clearenv",
             "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", str(root),
             "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
    return args


_PROBED: dict[tuple[str, str], str | None] = {}
_PROBE_LOCK = threading.Lock()


def _probe(bwrap: str, root: Path) -> str | None:
    """Can this bwrap start a sandbox on this root? Cached; None means yes."""
    key = (bwrap, str(root))
    with _PROBE_LOCK:
        if key not in _PROBED:
            try:
                done = subprocess.run([*bwrap_args(bwrap, root), "--", "/bin/sh", "-c", "exit 0"],
                                      stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
                _PROBED[key] = None if done.returncode == 0 else \
                    f"bwrap failed (exit {done.returncode}): {done.stderr.decode(errors='replace').strip()[:300]}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                _PROBED[key] = f"bwrap failed: {type(exc).__name__}: {exc}"
        return _PROBED[key]
