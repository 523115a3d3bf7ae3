"""`run_command`: a shell command in the workspace whose timeout stops the work, not only the waiting.

Containment, outside in:
- rlimits (CPU seconds, address space, open files, processes, file size), set by a tiny launcher
  that then execs the command, so they hold for everything the command starts;
- its own session and process group (SIGTERM to the group at the timeout, SIGKILL after a grace);
- a sweep of every process that carries this command's marker in its environment (catches
  `setsid` double-forks that left the group, when they kept their environment);
- with the sandbox (the default): bubblewrap with its own PID namespace and `--die-with-parent`.
  When the sandbox's init dies the kernel kills every process in the namespace, whatever it did
  with sessions or its environment; that is the robust part. The sandbox also has no network
  (`--unshare-net`), no capabilities, the system folders read-only, a private scratch /tmp that is
  discarded at exit, and the workspace as the only writable host folder.

If the sandbox is required but bubblewrap is missing or cannot start, the command does not run: the
result is a structured `sandbox_unavailable` error (fail closed). `sandbox=False` is the explicit
opt-out (`loopfence run --unsandboxed`).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._executor import time_left
from ._reap import MARKER_ENV, exited, kill_tree
from ._sandbox import sandbox_prefix

__all__ = ["CommandLimits", "Shell"]

_READ = 65_536

_LAUNCHER = """\
import json, os, resource, sys
for name, soft, hard in json.loads(sys.argv[1]):
    res = getattr(resource, name)
    cur = resource.getrlimit(res)[1]
    if cur != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur), min(hard, cur)
    resource.setrlimit(res, (soft, hard))
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"loopfence: cannot start {sys.argv[2]}: {exc}\\n")
    os._exit(127)
"""


@dataclass(frozen=True, slots=True)
class CommandLimits:
    """rlimits for every process a command starts. None leaves that limit as inherited."""

    cpu_s: int | None = None  # None: the command's timeout (rounded up) + 1
    address_space_bytes: int | None = 4 << 30
    open_files: int | None = 256
    processes: int | None = 512  # RLIMIT_NPROC counts all processes of the user; not enforced for root
    file_size_bytes: int | None = 256 << 20

    def rlimits(self, timeout_s: float) -> list[tuple[str, int, int]]:
        cpu = self.cpu_s if self.cpu_s is not None else math.ceil(timeout_s) + 1
        pairs = [("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", self.address_space_bytes, None),
                 ("RLIMIT_NOFILE", self.open_files, None), ("RLIMIT_NPROC", self.processes, None),
                 ("RLIMIT_FSIZE", self.file_size_bytes, None)]
        return [(n, v, h if h is not None else v) for n, v, h in pairs if v is not None]


class _Capture:
    """One output stream: keeps the head, counts the rest, caps with an honest marker.

    The cap counts characters as they will appear in the JSON result (a quote or a newline costs
    two), so stdout and stderr together always fit the executor's result cap uncut.
    """

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self.keep = max(chars * 4, 1 << 20)
        self.buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.buf)
        if room > 0:
            self.buf += data[:room]

    def text(self) -> str:
        text = self.buf.decode("utf-8", errors="replace")
        cut = _fit(text, self.chars)
        if self.total <= len(self.buf):
            if cut == len(text):
                return text
            return f"{text[:cut]}\n[truncated: {len(text):,} characters, showing the first {cut:,}]"
        return f"{text[:cut]}\n[truncated: {self.total:,} bytes of output, showing the first {cut:,} characters]"


def _fit(text: str, budget: int) -> int:
    """How many leading characters of `text` fit in `budget` characters once JSON-escaped."""
    used = 0
    for i, ch in enumerate(text[:budget]):
        used += 1 if ch >= " " and ch not in "\\\"" else len(json.dumps(ch)) - 2
        if used > budget:
            return i
    return min(len(text), budget)


class Shell:
    """Runs commands for one workspace. Thread-safe; each call is independent."""

    def __init__(self, root: Path, *, sandbox: bool = True, limits: CommandLimits | None = None,
                 output_chars: int = 6_000, max_timeout_s: float = 300.0, kill_grace_s: float = 0.5) -> None:
        self.root = Path(root)
        self.sandbox = sandbox
        self.limits = limits or CommandLimits()
        self.output_chars = output_chars
        self.max_timeout_s = max_timeout_s
        self.kill_grace_s = kill_grace_s

    # ------------------------------------------------------------------ public
    def run(self, command: str, timeout_s: float) -> dict[str, Any]:
        if not isinstance(command, str) or not command.strip():
            return _error("invalid_value", "the command is empty")
        if "\x00" in command:
            return _error("invalid_value", "the command contains a NUL byte")
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0 or math.isinf(timeout_s):
            return _error("invalid_value", f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        left = time_left()  # the run's tool timeout / wall clock, when called from the executor
        timeout = min(float(timeout_s), self.max_timeout_s, *([max(left, 0.05)] if left is not None else []))
        marker = uuid.uuid4().hex
        if self.sandbox:
            prefix = sandbox_prefix(self.root, marker)
            if isinstance(prefix, dict):
                return prefix
            argv, env = [*prefix, "/bin/sh", "-c", command], _minimal_env()
        else:
            argv, env = ["/bin/sh", "-c", command], dict(os.environ)
        env[MARKER_ENV] = marker
        launch = [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(self.limits.rlimits(timeout)), *argv]
        result = self._execute(launch, env, marker, timeout)
        if timeout < timeout_s:
            why = "the maximum" if timeout == self.max_timeout_s else "what the run's limits leave"
            result["timeout_note"] = f"timeout_s {timeout_s:g} was lowered to {why}, {timeout:g}"
        return result

    def sandbox_status(self) -> str | None:
        """None when the sandbox can start here, else why not."""
        found = sandbox_prefix(self.root, "probe")
        return None if isinstance(found, list) else str(found["message"])

    # ------------------------------------------------------------------ execution
    def _execute(self, argv: list[str], env: dict[str, str], marker: str, timeout: float) -> dict[str, Any]:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return _error("command_failed_to_start", f"{type(exc).__name__}: {exc}")
        _track(proc)
        out, err = _Capture(self.output_chars), _Capture(self.output_chars)
        sel = selectors.DefaultSelector()
        for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            sel.register(stream.fileno(), selectors.EVENT_READ, sink)
        code: int | None = None
        try:
            timed_out = not _pump(sel, start + timeout, lambda: exited(proc.pid))
            if not timed_out:  # output written before the exit; leftovers may hold the pipes open
                _pump(sel, time.monotonic() + 0.2, lambda: not sel.get_map())
            leftovers = kill_tree(proc.pid, marker, self.kill_grace_s)
            _pump(sel, time.monotonic() + 1.0, lambda: not sel.get_map())
            code = proc.wait()
        finally:
            if code is None:  # interrupted (e.g. Ctrl-C): the command must not outlive us
                kill_tree(proc.pid, marker, 0.0)
                proc.wait()
            sel.close()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            _LIVE.discard(proc)
        return self._result(code, timed_out, leftovers, out, err, timeout, time.monotonic() - start)

    def _result(self, code: int, timed_out: bool, leftovers: int, out: _Capture, err: _Capture,
                timeout: float, duration: float) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": code == 0 and not timed_out}
        if timed_out:
            body.update(error="timeout", timeout_s=timeout, message=(
                f"the command did not finish within {timeout:g}s; it was stopped: SIGTERM, then SIGKILL to "
                "its whole process group" + (" and sandbox" if self.sandbox else "")))
        elif code != 0:
            body.update(error="nonzero_exit", message=_exit_message(code))
        body.update(exit_code=None if timed_out else code, stdout=out.text(), stderr=err.text(),
                    duration_s=round(duration, 3),
                    sandbox="bubblewrap" if self.sandbox else "none (unsandboxed: explicit opt-out)")
        if leftovers and not timed_out:
            body["note"] = (f"{leftovers} background process(es) were still running when the command "
                            "ended; they were killed")
        return body


# ---------------------------------------------------------------------- helpers
def _pump(sel: selectors.BaseSelector, deadline: float, done: Any) -> bool:
    """Read output until `done()` (True) or the deadline (False). Keeps waiting after EOF."""
    while True:
        if done():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not sel.get_map():
            time.sleep(min(left, 0.01))
            continue
        for key, _ in sel.select(min(left, 0.05)):
            try:
                data = os.read(key.fd, _READ)
            except BlockingIOError:
                continue
            if data:
                key.data.add(data)
            else:
                sel.unregister(key.fd)


def _exit_message(code: int) -> str:
    if code < 0 or code > 128:
        num = -code if code < 0 else code - 128
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        hint = {"SIGXCPU": " (CPU-time limit)", "SIGXFSZ": " (file-size limit)"}.get(name, "")
        return f"the command exited with status {code}: killed by {name}{hint}"
    return f"the command exited with status {code}"


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": kind, "message": message}


def _minimal_env() -> dict[str, str]:
    """The launcher's environment in sandbox mode (bwrap then clears it and sets its own)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


_LIVE: set[subprocess.Popen[bytes]] = set()
_HOOKED: list[bool] = []


def _track(proc: subprocess.Popen[bytes]) -> None:
    if not _HOOKED:  # registered on first use: importing the module has no side effects
        _HOOKED.append(True)
        atexit.register(_kill_live)
    _LIVE.add(proc)


def _kill_live() -> None:
    """Interpreter exit: no command outlives loopfence."""
    for proc in list(_LIVE):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
