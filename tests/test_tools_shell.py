"""run_command: the timeout stops the work (whole group, setsid double-forks, the sandbox's PID
namespace); the sandbox has no network and only the workspace is writable; it fails closed."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from loopfence.tools import Executor, workspace_tools
from loopfence.tools._shell import CommandLimits, Shell

HAVE_BWRAP = shutil.which("bwrap") is not None and Shell(Path("/tmp")).sandbox_status() is None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap cannot start here (`make sandbox`)")
MODES = [pytest.param(True, id="sandbox", marks=needs_bwrap), pytest.param(False, id="unsandboxed")]


def run(ws: Path, command: str, timeout_s: float = 10, sandbox: bool = True, **options: Any) -> dict[str, Any]:
    t = workspace_tools(ws, names=["run_command"], sandbox=sandbox, **options)[0]
    result = Executor().execute(t, t.validate({"command": command, "timeout_s": timeout_s}), 60)
    return json.loads(result.content)


def marker() -> str:
    """A unique `sleep` argument: how the tests find the command's processes in /proc."""
    return f"3{random.randrange(10**8, 10**9)}"  # seconds; sleep accepts it and never finishes


def with_marker(mark: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if mark.encode() in fh.read():
                    found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


class Watcher:
    """Counts, during the call, the most processes carrying the marker (proves they existed)."""

    def __init__(self, mark: str) -> None:
        self.mark, self.most, self._stop = mark, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, len(with_marker(self.mark)))
            time.sleep(0.05)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def gone_within(mark: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not with_marker(mark):
            return True
        time.sleep(0.05)
    return not with_marker(mark)


@pytest.mark.parametrize("sandbox", MODES)
def test_background_sleep_is_killed_within_2s_of_a_1s_timeout(tmp_path: Path, sandbox: bool) -> None:
    m = marker()
    start = time.monotonic()
    with Watcher(m) as w:
        data = run(tmp_path, f"sleep {m} & sleep {m}; ", timeout_s=1, sandbox=sandbox)
    assert data["error"] == "timeout" and data["exit_code"] is None
    assert w.most >= 2, "the command's processes never ran"
    assert gone_within(m, start + 3.0), f"survivors: {with_marker(m)}"


@pytest.mark.parametrize("sandbox", MODES)
def test_setsid_double_fork_is_killed_within_2s_of_a_1s_timeout(tmp_path: Path, sandbox: bool) -> None:
    m = marker()
    start = time.monotonic()
    with Watcher(m) as w:
        data = run(tmp_path, f"(setsid sh -c 'sleep {m} & sleep {m}' &) ; sleep {m}", timeout_s=1,
                   sandbox=sandbox)
    assert data["error"] == "timeout"
    assert w.most >= 3
    assert gone_within(m, start + 3.0), f"survivors: {with_marker(m)}"


@needs_bwrap
def test_sandbox_kills_an_escapee_that_left_the_group_and_cleared_its_environment(tmp_path: Path) -> None:
    """Only the PID namespace catches this one: new session, no marker in the environment."""
    m = marker()
    start = time.monotonic()
    with Watcher(m) as w:
        data = run(tmp_path, f"(setsid env -i /bin/sleep {m} &) ; sleep 0.2; echo started", timeout_s=1)
    assert w.most >= 1
    assert data["ok"] and "started" in data["stdout"]  # the command itself finished
    assert gone_within(m, start + 3.0), f"survivors: {with_marker(m)}"


@pytest.mark.parametrize("sandbox", MODES)
def test_a_finished_command_leaves_no_background_process(tmp_path: Path, sandbox: bool) -> None:
    m = marker()
    data = run(tmp_path, f"sleep {m} & echo done", timeout_s=10, sandbox=sandbox)
    assert data["ok"] and data["stdout"] == "done\n"
    assert data["duration_s"] < 5
    assert gone_within(m, time.monotonic() + 2.0)


class Listener:
    """A real TCP server on 127.0.0.1 that counts the connections it accepted."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(5)
        self.sock.settimeout(0.1)
        self.port, self.accepted, self._stop = self.sock.getsockname()[1], 0, threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def connect_command(port: int) -> str:
    return (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); "
            f"print('CONNECTED')\"")


@needs_bwrap
def test_network_use_fails_inside_the_sandbox(tmp_path: Path) -> None:
    server = Listener()
    try:
        inside = run(tmp_path, connect_command(server.port))
        assert not inside["ok"] and "CONNECTED" not in inside["stdout"]
        assert "refused" in inside["stderr"].lower() or "unreachable" in inside["stderr"].lower()
        if shutil.which("curl"):
            curl = run(tmp_path, f"curl -sS --max-time 2 http://127.0.0.1:{server.port}/")
            assert not curl["ok"] and curl["exit_code"] != 0
        assert server.accepted == 0
        outside = run(tmp_path, connect_command(server.port), sandbox=False)  # the control
        assert outside["ok"] and "CONNECTED" in outside["stdout"]
        assert server.accepted == 1
    finally:
        server.close()


@needs_bwrap
def test_writing_outside_the_workspace_fails_inside_the_sandbox(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    name = f"loopfence-test-{os.getpid()}-{random.randrange(10**9)}"
    data = run(ws, f"echo x > {outside}/w.txt; echo x > /etc/{name}; echo x > /usr/{name}; "
                   f"echo x > /{name}; echo x > {tmp_path}/{name}; echo x > inside.txt; cat inside.txt")
    assert data["stdout"] == "x\n"  # the workspace itself is writable
    assert (ws / "inside.txt").read_text() == "x\n"
    assert data["stderr"].count("Read-only file system") >= 3
    assert not (outside / "w.txt").exists()
    assert not Path(f"/etc/{name}").exists() and not Path(f"/usr/{name}").exists()
    assert not Path(f"/{name}").exists() and not (tmp_path / name).exists()
    control = run(ws, f"echo x > {outside}/w.txt", sandbox=False)
    assert control["ok"] and (outside / "w.txt").exists()


@needs_bwrap
def test_the_sandbox_sees_the_workspace_and_not_the_rest_of_the_host(tmp_path: Path) -> None:
    (tmp_path / "here.txt").write_text("visible")
    data = run(tmp_path, f"cat here.txt; pwd; ls /work /root /home 2>&1 | head -3; echo $HOME")
    assert data["stdout"].startswith(f"visible{tmp_path}\n")
    assert "No such file" in data["stdout"]
    assert data["sandbox"] == "bubblewrap"


def test_the_sandbox_fails_closed_when_bubblewrap_is_missing(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    data = run(tmp_path, "echo ran > proof.txt")
    assert data["ok"] is False and data["error"] == "sandbox_unavailable"
    assert "not installed" in data["message"] and "--unsandboxed" in data["hint"]
    assert not (tmp_path / "proof.txt").exists()


def test_the_sandbox_fails_closed_when_bubblewrap_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              request: pytest.FixtureRequest) -> None:
    fake = Path(tempfile.mkdtemp(prefix="fake-bwrap-"))  # traversable by the sandbox's unprivileged uid
    fake.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(fake))
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    ws = tmp_path / "ws"
    ws.mkdir()
    data = run(ws, "echo ran > proof.txt")
    assert data["error"] == "sandbox_unavailable" and "No permissions" in data["message"]
    assert not (ws / "proof.txt").exists()


@pytest.mark.parametrize("sandbox", MODES)
def test_stdout_and_stderr_are_each_capped_with_a_marker(tmp_path: Path, sandbox: bool) -> None:
    data = run(tmp_path, "head -c 50000 /dev/zero | tr '\\0' a; head -c 9000 /dev/zero | tr '\\0' b >&2",
               sandbox=sandbox)
    assert data["stdout"] == "a" * 6_000 + "\n[truncated: 50,000 characters, showing the first 6,000]"
    assert data["stderr"] == "b" * 6_000 + "\n[truncated: 9,000 characters, showing the first 6,000]"
    huge = run(tmp_path, "head -c 3000000 /dev/zero | tr '\\0' c", sandbox=sandbox)
    assert huge["stdout"].endswith("[truncated: 3,000,000 bytes of output, showing the first 6,000 characters]")


def test_the_whole_result_fits_the_executor_cap(tmp_path: Path) -> None:
    t = workspace_tools(tmp_path, names=["run_command"], sandbox=False)[0]
    cmd = "head -c 90000 /dev/zero | tr '\\0' '\"'; head -c 90000 /dev/zero | tr '\\0' '\\n' >&2"
    result = Executor().execute(t, t.validate({"command": cmd}), 30)
    assert len(result.content) <= 16_000  # the executor did not have to cut the JSON
    data = json.loads(result.content)
    assert "[truncated: 90,000 characters" in data["stdout"] and "[truncated: 90,000 characters" in data["stderr"]


@pytest.mark.parametrize("sandbox", MODES)
def test_rlimits_apply_to_the_command(tmp_path: Path, sandbox: bool) -> None:
    limits = CommandLimits(cpu_s=1, address_space_bytes=1 << 31, open_files=64, processes=300,
                           file_size_bytes=1 << 20)
    data = run(tmp_path, "cat /proc/self/limits", sandbox=sandbox, command_limits=limits)
    rows = {line[:26].strip(): line[26:].split() for line in data["stdout"].splitlines()[1:]}
    assert rows["Max cpu time"][:2] == ["1", "2"]
    assert rows["Max open files"][0] == "64"
    assert rows["Max file size"][0] == str(1 << 20)
    assert rows["Max address space"][0] == str(1 << 31)
    assert rows["Max processes"][0] == "300"
    big = run(tmp_path, "head -c 3000000 /dev/zero > big.bin", sandbox=sandbox, command_limits=limits)
    assert not big["ok"] and (tmp_path / "big.bin").stat().st_size <= 1 << 20
    start = time.monotonic()
    spin = run(tmp_path, "while :; do :; done", timeout_s=20, sandbox=sandbox, command_limits=limits)
    assert time.monotonic() - start < 6 and not spin["ok"] and spin["error"] == "nonzero_exit"


def test_exit_codes_and_bad_arguments(tmp_path: Path) -> None:
    failed = run(tmp_path, "echo oops >&2; exit 3", sandbox=False)
    assert failed == {**failed, "ok": False, "error": "nonzero_exit", "exit_code": 3, "stderr": "oops\n"}
    assert run(tmp_path, "   ", sandbox=False)["error"] == "invalid_value"
    assert run(tmp_path, "true", timeout_s=0, sandbox=False)["error"] == "invalid_value"
    capped = run(tmp_path, "true", timeout_s=99, sandbox=False, max_command_timeout_s=5)
    assert capped["ok"] and "lowered to the maximum, 5" in capped["timeout_note"]


def test_unsandboxed_is_an_explicit_opt_out_named_in_the_result_and_description(tmp_path: Path) -> None:
    t = workspace_tools(tmp_path, names=["run_command"], sandbox=False)[0]
    assert "WITHOUT a sandbox" in t.description
    assert run(tmp_path, "true", sandbox=False)["sandbox"].startswith("none")
    assert "no network" in workspace_tools(tmp_path, names=["run_command"])[0].description



def test_a_refused_prctl_is_warned_once_naming_the_errno(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the kernel to refuse PR_SET_DUMPABLE, the parent's environment would stay readable: say so."""
    import ctypes
    import errno

    from loopfence.tools import _shell

    class Refusing:  # the C library, as a kernel that refuses the call answers
        calls = 0

        def prctl(self, *args: int) -> int:
            assert args == (4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
            Refusing.calls += 1
            ctypes.set_errno(errno.EPERM)
            return -1

    monkeypatch.setattr(_shell, "_libc", Refusing, raising=False)
    monkeypatch.setattr(_shell, "_WARNED", [], raising=False)
    with pytest.warns(RuntimeWarning) as said:
        results = [run(tmp_path, "echo hi", sandbox=False) for _ in range(2)]
    assert [r["stdout"] for r in results] == ["hi\n", "hi\n"] and Refusing.calls == 2
    assert len(said) == 1 and "PR_SET_DUMPABLE" in str(said[0].message), [str(w.message) for w in said]
    assert "EPERM, errno 1" in str(said[0].message) and "environ" in str(said[0].message)


_AS_A_USER = """
import ctypes, os, sys
from pathlib import Path
from loopfence.tools._shell import Shell
ws, *pythons = sys.argv[1:]
if os.geteuid() == 0:  # a user's own process, as it starts (root's commands read every process's memory)
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE 1: a change of uid had cleared it
    usable = [p for p in pythons if os.access(p, os.X_OK)]
    if not usable:
        sys.exit("SKIP: no Python this user can run, for the launcher (standard library only)")
    sys.executable = usable[0]
    from loopfence.tools._shell import _LAUNCH
    if not os.access(_LAUNCH, os.R_OK):
        sys.exit(f"SKIP: uid 65534 cannot read the checkout (the launcher {_LAUNCH})")
"""


def as_a_user(body: str, ws: Path, env: dict[str, str] | None = None) -> str:
    """`body` run by a process of an unprivileged user (uid 65534 when the tests run as root), with
    `Shell` imported and `ws` its workspace; its standard output."""
    import subprocess
    import sys
    if os.geteuid() == 0:
        os.chown(ws, 65534, 65534)
    done = subprocess.run([sys.executable, "-c", _AS_A_USER + body, str(ws), "/usr/bin/python3",
                           "/usr/local/bin/python3", "/bin/python3"], env={**os.environ, **(env or {})},
                          cwd="/", timeout=120, capture_output=True, text=True, check=False)
    if done.stderr.startswith("SKIP: "):
        pytest.skip(done.stderr[6:])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_unsandboxed_command_cannot_read_the_key_from_loopfences_own_environment() -> None:
    """/proc/PID/environ keeps the environment a process started with (the key, even after it was
    unset) and is open to every process of the same user, unless the process is non-dumpable."""
    tag = f"probe-{random.randrange(10**9)}"
    command = ("tr '\\0\\n' '  ' < /proc/$PPID/cmdline; echo; "
               "tr '\\0' '\\n' < /proc/$PPID/environ | grep -c '^OPENAI_API_KEY='; "
               f"PYTHON -c {shlex.quote(_READ_MEMORY)} $PPID")
    body = (f"print(Shell(Path(ws), sandbox=False).run({command!r}.replace('PYTHON', sys.executable), 10)"
            f"['stdout'], end='')  # {tag}")
    with tempfile.TemporaryDirectory() as ws:  # under /tmp: reachable for the unprivileged user
        out = as_a_user(body, Path(ws), {"OPENAI_API_KEY": "sk-test-in-the-parent-0123456789"})
    lines = out.splitlines()
    assert len(lines) == 3, out
    cmdline, count, memory = lines
    assert tag in cmdline  # $PPID is the process that holds the key
    assert count == "0" and memory.startswith("memory closed"), out


# a few bytes at the start of the first readable mapping of a process (/proc/PID/mem at offset 0 is
# never mapped: reading there fails even where reading is allowed)
_READ_MEMORY = """
import sys
pid = sys.argv[1]
try:
    with open(f"/proc/{pid}/maps") as maps:
        start = next(int(m.split("-")[0], 16) for m in maps if m.split()[1].startswith("r"))
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(start)
        print("memory read", len(mem.read(8)))
except OSError as exc:
    print("memory closed:", exc.strerror)
"""


@needs_bwrap
@pytest.mark.parametrize("mode", [0o000, 0o644])  # not listed; listed, but not looked into (no x)
def test_a_folder_the_user_cannot_list_is_read_only_in_the_sandbox(mode: int) -> None:
    """What a folder holds cannot be checked for setuid files when it cannot be listed or its files'
    modes cannot be read; its owner could open it from inside (chmod), so it is bound read-only
    whole (as root every folder is listed)."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        (ws / "shut").mkdir()
        (ws / "shut" / "tool").write_bytes(b"#!/bin/sh\n" + b"x" * 200)
        os.chmod(ws / "shut" / "tool", 0o4755)
        for path in (ws / "shut", ws / "shut" / "tool"):
            if os.geteuid() == 0:
                os.chown(path, 65534, 65534)
        os.chmod(ws / "shut", mode)
        body = ("r = Shell(Path(ws)).run(\"chmod 755 shut && python3 -c \\\"import mmap,os; "
                "fd=os.open('shut/tool',os.O_RDWR); m=mmap.mmap(fd,0); m[100:104]=b'ABCD'\\\"\", 20)\n"
                "print(r['ok'], r['stderr'])")
        out = as_a_user(body, ws)
        os.chmod(ws / "shut", 0o755)
        assert out.startswith("False") and "Read-only file system" in out, out
        assert (ws / "shut" / "tool").read_bytes() == b"#!/bin/sh\n" + b"x" * 200
        assert (ws / "shut").stat().st_mode & 0o777 == 0o755  # put back here, not from inside
