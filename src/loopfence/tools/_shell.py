"""`run_command`: a shell command in the workspace whose timeout stops the work, not only the waiting.

Containment, outside in:
- rlimits (CPU seconds, address space, open files, processes, file size), set by a tiny launcher
  that then execs the command, so they hold for everything the command starts;
- its own session and process group (SIGTERM to the group at the timeout, SIGKILL after a grace);
- a sweep of every process that carries this command's marker in its environment (catches
  `setsid` double-forks that left the group, when they kept their environment);
- a cgroup per command where the machine lets us make one (tools/_cgroup): a process count and a
  memory ceiling for the whole tree, and every member found and killed at the end, `setsid env -i`
  escapees included (sandboxed or not);
- with the sandbox (the default): bubblewrap with its own PID namespace and `--die-with-parent`.
  When the sandbox's init dies the kernel kills every process in the namespace, whatever it did
  with sessions or its environment; that is the robust part. The sandbox also has no network
  (`--unshare-net`), no capabilities, the system folders read-only, a private scratch /tmp that is
  discarded at exit, and the workspace as the only writable host folder; the command never runs as
  root on the host (tools/_sandbox, tools/_launch) and cannot set a setuid bit (tools/_seccomp).
Unsandboxed commands get the environment less SECRET_ENV and `hide_env`; those values are masked in
any output either way (the literal value only: a command that encodes it gets it past the mask). Before
each one, this process makes itself non-dumpable, so that its own environment (which
`/proc/PID/environ` keeps as it started, key included), memory and ptrace are closed to them; that
holds against processes of the same unprivileged user, never against root, and nothing closes the
user's other processes and files to them: `--unsandboxed` cannot keep a secret the user can reach.
It cannot be scoped to the child (the child reads the parent's /proc entry), so the host process
stays non-dumpable from its first unsandboxed command on: no core dumps, no `py-spy`/`gdb -p` by the
same user. Where the kernel refuses it, a RuntimeWarning names the errno, once.

If the sandbox is required but bubblewrap is missing or cannot start, the command does not run: the
result is a structured `sandbox_unavailable` error (fail closed). `sandbox=False` is the explicit
opt-out (`loopfence run --unsandboxed`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._cgroup import TreeCgroup
from ._executor import on_cancel, time_left
from ._reap import MARKER_ENV, exited, kill_tree, reap_orphans
from ._sandbox import SandboxPlan, SetuidScanError, plan, setuid_files
from ._seccomp import program

__all__ = ["CommandLimits", "Shell"]

_READ = 65_536

@dataclass(frozen=True, slots=True)
class CommandLimits:
    """Bounds on what a command may use. None leaves that bound off (or as inherited).

    Per process (rlimits, set before the command starts): cpu_s, address_space_bytes, open_files,
    processes (RLIMIT_NPROC: real because the command never runs as root), file_size_bytes.
    For the whole tree (a cgroup, where this machine lets us make one): tree_processes, tree_memory_bytes.
    """

    cpu_s: int | None = None  # None: the command's timeout (rounded up) + 1
    address_space_bytes: int | None = 4 << 30
    open_files: int | None = 256
    processes: int | None = 512
    file_size_bytes: int | None = 256 << 20
    tree_processes: int | None = 256
    tree_memory_bytes: int | None = 4 << 30

    def rlimits(self, timeout_s: float) -> list[tuple[str, int, int]]:
        cpu = self.cpu_s if self.cpu_s is not None else math.ceil(timeout_s) + 1
        pairs = [("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", self.address_space_bytes, None),
                 ("RLIMIT_NOFILE", self.open_files, None), ("RLIMIT_NPROC", self.processes, None),
                 ("RLIMIT_FSIZE", self.file_size_bytes, None)]
        return [(n, v, h if h is not None else v) for n, v, h in pairs if v is not None]


# variables never passed to an unsandboxed command (the sandbox clears the whole environment)
SECRET_ENV = ("OPENAI_API_KEY", "LOOPFENCE_API_KEY")
_LAUNCH = str(Path(__file__).with_name("_launch.py"))
_PROBED: dict[tuple[str, int], str | None] = {}
_PROBE_LOCK = threading.Lock()


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
    """Runs commands for one workspace. Thread-safe; each call is independent.

    hide_env: more environment variable names kept from unsandboxed commands (besides SECRET_ENV).
    """

    def __init__(self, root: Path, *, sandbox: bool = True, limits: CommandLimits | None = None,
                 output_chars: int = 6_000, max_timeout_s: float = 300.0, kill_grace_s: float = 0.5,
                 hide_env: Iterable[str] = ()) -> None:
        self.root = Path(root)
        self.sandbox = sandbox
        self.limits = limits or CommandLimits()
        self.output_chars = output_chars
        self.max_timeout_s = max_timeout_s
        self.kill_grace_s = kill_grace_s
        self.hide_env = frozenset((*SECRET_ENV, *hide_env))

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
        if self.sandbox and (problem := self.sandbox_status()):
            return _unavailable(problem)
        try:  # found before every command: a file made setuid since the last one is guarded too
            read_only = tuple(setuid_files(self.root)) if self.sandbox else ()
        except SetuidScanError as exc:
            return _error("setuid_files", f"{exc}. Nothing was run (fail closed).")
        marker = uuid.uuid4().hex
        group = TreeCgroup.create(f"loopfence-{marker}", self.limits.tree_processes, self.limits.tree_memory_bytes)
        try:
            with _seccomp_fd() if self.sandbox else contextlib.nullcontext(None) as fd:
                argv, env, cfg = self._command(command, marker, fd, read_only)
                cfg.update(rlimits=self.limits.rlimits(timeout), cgroups=list(group.procs_files) if group else [])
                launch = [sys.executable, "-I", "-S", _LAUNCH, json.dumps(cfg), *argv]
                result = self._execute(launch, env, marker, timeout, group, () if fd is None else (fd,))
        finally:
            if group is not None:
                group.kill_all()
                group.remove()
        if round(timeout, 1) < round(float(timeout_s), 1):  # not for the clock's few ms since the call
            why = "the maximum" if timeout == self.max_timeout_s else "what the run's limits leave"
            result["timeout_note"] = f"timeout_s {timeout_s:g} was lowered to {why}, {timeout:g}"
        return result

    def sandbox_status(self) -> str | None:
        """None when the sandbox can start here, else why not (probed once per workspace and user)."""
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            return "bubblewrap (bwrap) is not installed"
        key = (str(self.root), os.geteuid())
        with _PROBE_LOCK:
            if key not in _PROBED:
                _PROBED[key] = self._probe()
            return _PROBED[key]

    def bounds(self) -> dict[str, Any]:
        """For the log header: which bounds are in force for a command here, and who runs it."""
        lim = self.limits
        group = TreeCgroup.create(f"loopfence-probe-{uuid.uuid4().hex}", lim.tree_processes, lim.tree_memory_bytes)
        if group is not None:
            group.remove()
        tree = group.describe() if group else {
            "tree_bounds": "none (no cgroup could be made here): per-process rlimits only"
            if lim.tree_processes or lim.tree_memory_bytes else "off"}
        who = ("root: an unprivileged uid on an idmapped workspace" if os.geteuid() == 0 else
               f"uid {os.geteuid()}") if self.sandbox else f"uid {os.geteuid()} (unsandboxed)"
        return {**tree, "rlimits": {n: v for n, v, _ in lim.rlimits(1.0) if n != "RLIMIT_CPU"},
                "command_user": who,
                "setuid_filter": "seccomp" if self.sandbox and program() is not None else "none"}

    # ------------------------------------------------------------------ execution
    def _mask(self, text: str) -> str:
        """No secret's value reaches the model or the log, whatever the command printed."""
        for name in sorted(self.hide_env):
            value = os.environ.get(name)
            if value and len(value) >= 4 and value in text:
                text = text.replace(value, f"[{name} withheld]")
        return text

    def _command(self, command: str, marker: str, fd: int | None, read_only: tuple[str, ...] = ()
                 ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        if not self.sandbox:
            _undumpable()
            env = {k: v for k, v in os.environ.items() if k not in self.hide_env}
            env[MARKER_ENV] = marker
            return ["/bin/sh", "-c", command], env, {}
        how: SandboxPlan = plan(str(shutil.which("bwrap")), self.root, fd, read_only)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", MARKER_ENV: marker}
        return [*how.argv, "--setenv", MARKER_ENV, marker, "--", "/bin/sh", "-c", command], env, dict(how.launch)

    def _probe(self) -> str | None:
        with _seccomp_fd() as fd:
            argv, env, cfg = self._command("exit 0", "probe", fd)
            try:
                done = subprocess.run([sys.executable, "-I", "-S", _LAUNCH, json.dumps(cfg), *argv], env=env,
                                      cwd=self.root, stdin=subprocess.DEVNULL, capture_output=True, timeout=20,
                                      pass_fds=() if fd is None else (fd,))
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"bwrap failed: {type(exc).__name__}: {exc}"
        if done.returncode == 0:
            return None
        return f"bwrap failed (exit {done.returncode}): {done.stderr.decode(errors='replace').strip()[:300]}"

    def _execute(self, argv: list[str], env: dict[str, str], marker: str, timeout: float,
                 group: TreeCgroup | None, fds: tuple[int, ...]) -> dict[str, Any]:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=self.root, env=env, stdin=subprocess.DEVNULL, pass_fds=fds,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return _error("command_failed_to_start", f"{type(exc).__name__}: {exc}")
        _track(proc)
        on_cancel(lambda: _kill_group(proc))  # the run went on without this call: stop the command now
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
            if group is not None:
                leftovers = max(leftovers, group.kill_all())
            _pump(sel, time.monotonic() + 1.0, lambda: not sel.get_map())
            code = proc.wait()
        finally:
            if code is None:  # interrupted (e.g. Ctrl-C): the command must not outlive us
                kill_tree(proc.pid, marker, 0.0)
                if group is not None:
                    group.kill_all()
                proc.wait()
            sel.close()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            _LIVE.discard(proc)
            reap_orphans()  # as a container's PID 1: the sandbox's inner bwrap, orphaned, is ours to reap
        result = self._result(code, timed_out, leftovers, out, err, timeout, time.monotonic() - start, group)
        if group is not None and group.oom_killed():
            result["memory_note"] = (f"the command's process tree reached its memory ceiling "
                                     f"({group.memory_bytes:,} bytes): the kernel killed a process")
        return result

    def _result(self, code: int, timed_out: bool, leftovers: int, out: _Capture, err: _Capture,
                timeout: float, duration: float, group: TreeCgroup | None) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": code == 0 and not timed_out}
        if timed_out:
            whom = ("its whole process group" + (" and sandbox" if self.sandbox else "")
                    + (" and every process in its cgroup" if group else ""))
            body.update(error="timeout", timeout_s=timeout, message=(
                f"the command did not finish within {timeout:g}s; it was stopped: SIGTERM, then SIGKILL to "
                f"{whom}" + ("" if group or self.sandbox else
                             "; a process that left the group and cleared its environment cannot be found "
                             "without a cgroup and may still run")))
        elif code != 0:
            body.update(error="nonzero_exit", message=_exit_message(code))
        body.update(exit_code=None if timed_out else code, stdout=self._mask(out.text()),
                    stderr=self._mask(err.text()),
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


def _unavailable(why: str) -> dict[str, Any]:
    return {"ok": False, "error": "sandbox_unavailable", "message": (
        f"run_command needs its sandbox and it cannot start: {why}. Nothing was run (fail closed)."),
        "hint": "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or opt out explicitly "
                "with `loopfence run --unsandboxed` / workspace_tools(..., sandbox=False)"}


def _undumpable() -> None:
    """Before an unsandboxed command: this process's environment (`/proc/PID/environ`, which keeps
    the key it started with), memory and ptrace closed to other processes of its user. Not to root:
    an unsandboxed command run as root reads every secret on the machine."""
    if sys.platform != "linux":
        return
    # one call each time: a change of uid since would have reset it
    if _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 and not _WARNED:
        _WARNED.append(True)
        err = ctypes.get_errno()
        warnings.warn(f"loopfence: prctl(PR_SET_DUMPABLE, 0) failed ({errno.errorcode.get(err, '?')}, errno "
                      f"{err}: {os.strerror(err)}): unsandboxed commands can read this process's "
                      "environment (/proc/PID/environ, the key included) and memory", RuntimeWarning, stacklevel=2)


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


_PR_SET_DUMPABLE = 4
_WARNED: list[bool] = []  # the failure is said once per process


@contextlib.contextmanager
def _seccomp_fd() -> Iterator[int | None]:
    """The setuid filter in a memfd, for bwrap's --seccomp (None where there is no filter)."""
    code = program()
    if code is None:
        yield None
        return
    fd = os.memfd_create("loopfence-seccomp", 0)  # not CLOEXEC: the launcher and bwrap inherit it
    try:
        os.write(fd, code)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


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
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the command's group (the sandbox's PID namespace dies with it); the thread running
    the command then reaps it and sweeps what is left (marker, cgroup) as after any end."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
