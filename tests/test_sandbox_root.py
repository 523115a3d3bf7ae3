"""The sandbox holds against the host when loopfence runs as root (as in CI and most containers).

Each attack runs as the model would ask for it, through run_command, and the host is checked from
outside afterwards. Where an attack could change the host if the sandbox failed, the test restores
what it changed before it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, ScriptedModel, run
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import workspace_tools
from loopfence.tools._shell import Shell

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="these attacks are about loopfence running as root")


def sh(ws: Path, command: str, timeout_s: float = 20, **options: Any) -> dict[str, Any]:
    return Shell(ws, **options).run(command, timeout_s)


def _restore(path: str, before: str) -> bool:
    """Put a host knob back if the sandbox failed to protect it; True when it had changed."""
    now = Path(path).read_text()
    if now != before:
        Path(path).write_text(before)
        return True
    return False


@as_root
def test_core_pattern_cannot_be_set_to_run_a_workspace_script_as_host_root(tmp_path: Path) -> None:
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    proof = tmp_path.parent / f"pwned-{tmp_path.name}"
    try:
        data = sh(tmp_path, f"printf '#!/bin/sh\\nid > {proof}\\n' > pwn.sh; chmod +x pwn.sh; "
                            "echo \"|$PWD/pwn.sh\" > /proc/sys/kernel/core_pattern; echo rc=$?; "
                            "sh -c 'kill -SEGV $$'; sleep 0.5")
    finally:
        changed = _restore("/proc/sys/kernel/core_pattern", before)
    assert not changed, "core_pattern was changed from inside the sandbox"
    assert "rc=0" not in data["stdout"] and "core_pattern" in data["stderr"]
    assert not proof.exists()


@as_root
def test_a_sysctl_write_fails_and_the_host_value_is_unchanged(tmp_path: Path) -> None:
    knob = "/proc/sys/vm/swappiness"
    before = Path(knob).read_text()
    other = "17" if before.strip() != "17" else "18"
    try:
        data = sh(tmp_path, f"echo {other} > {knob}; echo rc=$?; sysctl -w vm.swappiness={other} 2>&1; "
                            f"cat {knob}")
    finally:
        changed = _restore(knob, before)
    assert not changed and "rc=0" not in data["stdout"]


@as_root
def test_secrets_in_etc_are_absent_and_root_owned_files_closed(tmp_path: Path) -> None:
    data = sh(tmp_path, "cat /etc/shadow; cat /etc/gshadow; ls /etc; id -u; cat /proc/1/root/etc/shadow")
    shadow_head = Path("/etc/shadow").read_text().split(":", 1)[0] + ":"
    listing = data["stdout"].split()
    for name in ("shadow", "gshadow", "sudoers", "ssh", "sudoers.d"):
        assert name not in listing
    assert "passwd" in listing  # what commands need is there
    assert shadow_head + "*" not in data["stdout"] and shadow_head + "$" not in data["stdout"]
    assert "No such file" in data["stderr"]
    assert "0" not in listing[-1:]  # id -u: not root inside either


@as_root
def test_the_command_runs_as_an_unprivileged_uid_on_the_host(tmp_path: Path) -> None:
    """Seen from outside: the processes of a sandboxed command belong to a non-zero uid."""
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x0041.5\x00":
                        status = Path(f"/proc/{pid}/status").read_text()
                        seen.append(int(status.split("Uid:")[1].split()[0]))
                except (OSError, IndexError):
                    continue
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        data = sh(tmp_path, "echo made > made.txt; sleep 41.5", timeout_s=1.5)
    finally:
        done.set()
        watcher.join()
    assert data["error"] == "timeout" and seen and all(uid >= 1000 for uid in seen), seen
    # what it wrote belongs to the workspace's owner, as if the owner had written it
    assert (tmp_path / "made.txt").stat().st_uid == tmp_path.stat().st_uid


@pytest.mark.parametrize("attempt", [
    "cp /bin/true t && chmod u+s t",
    "cp /bin/true t && chmod g+s t",
    "cp /bin/true t && chmod 6755 t",
    "install -m 4755 /bin/true t",
    "python3 -c \"import os; os.close(os.open('t', os.O_CREAT | os.O_WRONLY, 0o4755))\"",
    "python3 -c \"import os; open('t', 'w').close(); os.chmod('t', 0o2755)\"",
])
def test_no_setuid_or_setgid_file_can_be_made(tmp_path: Path, attempt: str) -> None:
    data = sh(tmp_path, attempt)
    assert data["ok"] is False and ("not permitted" in data["stderr"] or "PermissionError" in data["stderr"])
    for path in tmp_path.rglob("*"):
        assert not path.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID), oct(path.lstat().st_mode)


def _mmap_write(path: str) -> str:
    """A write through a shared mapping: the one write the kernel does not clear the setuid bit on."""
    return (f"python3 -c \"import mmap,os; fd=os.open('{path}',os.O_RDWR); m=mmap.mmap(fd,0); "
            "m[100:104]=b'ABCD'; m.flush()\"")


def _setuid_state(ws: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(ws)): (p.lstat().st_mode, p.read_bytes()) for p in ws.rglob("*")
            if p.is_file() and not p.is_symlink() and p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)}


def test_a_setuid_file_in_the_workspace_cannot_be_rewritten_through_a_mapping(tmp_path: Path) -> None:
    """Setuid and setgid files (hard links and subfolders too) are read-only inside: not mapped for
    writing, linked to a writable name, truncated, replaced or stripped of their bit."""
    ws = tmp_path / "ws"
    (ws / "sub" / "deep").mkdir(parents=True)
    shutil.copy("/bin/true", ws / "tool")
    os.chmod(ws / "tool", 0o4755)
    os.link(ws / "tool", ws / "sub" / "link")
    shutil.copy("/bin/true", ws / "sub" / "deep" / "sg")
    os.chmod(ws / "sub" / "deep" / "sg", 0o2755)
    before = _setuid_state(ws)
    assert len(before) == 3
    shell = Shell(ws)
    for path in ("tool", "sub/link", "sub/deep/sg"):
        data = shell.run(_mmap_write(path), 20)
        assert data["ok"] is False and "Read-only file system" in data["stderr"], data
    tries = shell.run("ln tool t2; ln sub/deep/sg sub/t3; " + _mmap_write("t2") + "; " + _mmap_write("sub/t3")
                      + "; truncate -s 0 tool; mv sub/link moved; chmod u-s tool", 20)
    assert tries["ok"] is False
    writable = shell.run("find . -type f -perm /6000 -writable", 20)
    assert writable["ok"] and writable["stdout"] == "", writable
    assert _setuid_state(ws) == before  # same files, same modes, same bytes


def test_a_file_made_setuid_on_the_host_between_commands_is_read_only_in_the_next(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    assert shell.run("cp /bin/true made", 20)["ok"]
    os.chmod(tmp_path / "made", 0o4755)  # not by the sandbox: the host (its user, another program)
    original = (tmp_path / "made").read_bytes()
    data = shell.run(_mmap_write("made"), 20)
    assert data["ok"] is False and "Read-only file system" in data["stderr"], data
    assert (tmp_path / "made").read_bytes() == original


def test_the_setuid_scan_fails_closed_past_its_limit(tmp_path: Path) -> None:
    from loopfence.tools._sandbox import SetuidScanError, setuid_files

    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(b"x")
        os.chmod(tmp_path / name, 0o4644)
    (tmp_path / "plain").write_bytes(b"x")
    os.symlink("/usr/bin/su", tmp_path / "to-su")  # a link is not followed (su lies outside)
    assert setuid_files(tmp_path) == ["a", "b", "c"]
    with pytest.raises(SetuidScanError, match="more than 2 setuid/setgid files"):
        setuid_files(tmp_path, limit=2)


_SPAWN = ("python3 -c \"import subprocess\nps=[]\ntry:\n    for i in range(1500): "
          "ps.append(subprocess.Popen(['sleep','5']))\nexcept OSError: pass\nprint('started', len(ps))\"")


def test_a_fork_bomb_is_bounded_for_the_whole_tree(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    tree = shell.bounds()["tree_bounds"].startswith("cgroup")
    bound = shell.limits.tree_processes if tree else shell.limits.processes
    data = shell.run(_SPAWN, 20)
    started = int(data["stdout"].split("started")[1].split()[0])
    assert started < (bound or 0) <= 512, data
    before = len(os.listdir("/proc"))
    bomb = shell.run(":(){ :|:& };:", 2)  # the classic, under a short timeout
    assert bomb["ok"] is False
    assert len(os.listdir("/proc")) < before + 50  # nothing of it is left on the host


@as_root
def test_five_3gb_allocations_are_bounded_for_the_whole_tree(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    if not shell.bounds()["tree_bounds"].startswith("cgroup"):
        pytest.skip("no cgroup can be made on this machine: memory is bounded per process only")
    alloc = "python3 -c \"b = bytearray(3 << 30); print('alloc ok', flush=True); import time; time.sleep(2)\""
    data = shell.run(f"for i in 1 2 3 4 5; do {alloc} & done; wait", 120)
    assert data["stdout"].count("alloc ok") <= 1, data["stdout"]
    assert "memory ceiling" in data.get("memory_note", ""), data


@as_root
def test_an_unsandboxed_escapee_is_killed_at_the_timeout(tmp_path: Path) -> None:
    """`setsid env -i` leaves the process group and the marker: the cgroup still holds it."""
    data = sh(tmp_path, "setsid env -i sh -c 'sleep 52.5' & sleep 30", timeout_s=1, sandbox=False)
    assert data["error"] == "timeout" and "cgroup" in data["message"]
    time.sleep(0.2)
    alive = [p for p in filter(str.isdigit, os.listdir("/proc"))
             if _cmdline(p) == b"sleep\x0052.5\x00"]
    assert alive == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_unsandboxed_commands_get_no_keys_and_the_log_holds_none(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"OPENAI_API_KEY": "sk-test-openai-0123456789", "LOOPFENCE_API_KEY": "lf-test-key-98765",
               "MY_DB_PASSWORD": "hunter2-db-password"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    ws = tmp_path / "ws"
    ws.mkdir()
    log = tmp_path / "run.jsonl"
    (ws / "leak.txt").write_text(f"found {secrets['OPENAI_API_KEY']} somewhere")  # a value reached another way
    command = "env | grep -E 'KEY|PASSWORD|^PATH='; echo $OPENAI_API_KEY; cat leak.txt"
    model = ScriptedModel([calls_reply(tool_call("run_command", command=command)), text_reply("done")])
    result = run("t", model=model, tools=workspace_tools(ws, sandbox=False, hide_env=["MY_DB_PASSWORD"]),
                 limits=Limits(max_steps=3), log=log)
    assert result.stop.reason == "final_answer"
    text = log.read_text()
    assert "PATH=" in text  # the command did print its environment
    for value in secrets.values():
        assert value not in text
    assert "[OPENAI_API_KEY withheld]" in text


def test_the_log_header_says_which_bounds_were_in_force(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    run("t", model=ScriptedModel([text_reply("done")]), tools=workspace_tools(tmp_path, ["run_command"]),
        log=log)
    header = json.loads(log.read_text().splitlines()[0])
    info = header["tool_info"]["run_command"]
    assert info["rlimits"]["RLIMIT_NPROC"] == 512 and info["setuid_filter"] == "seccomp"
    assert info["tree_bounds"] in ("cgroup v1", "cgroup v2") or info["tree_bounds"].startswith("none")
    if os.geteuid() == 0:
        assert "unprivileged uid" in info["command_user"]


def test_the_default_timeout_is_not_reported_as_lowered(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    model = ScriptedModel([calls_reply(tool_call("run_command", command="true")), text_reply("done")])
    run("t", model=model, tools=workspace_tools(tmp_path, ["run_command"]), log=log)
    results = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "result"]
    assert results and all("lowered" not in r["content"] for r in results)


def test_cgroups_left_by_a_killed_loopfence_are_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopfence.tools import _cgroup

    left = _cgroup.TreeCgroup.create("loopfence-left-by-a-kill", 8, None)
    if left is None:
        pytest.skip("no cgroup can be made on this machine")
    try:
        monkeypatch.setattr(_cgroup, "STALE_S", 3600.0)  # a fresh one is kept (its command may not have started)
        _cgroup.TreeCgroup.create("loopfence-next-1", 8, None).remove()  # type: ignore[union-attr]
        assert all(d.exists() for d in left.dirs)
        monkeypatch.setattr(_cgroup, "STALE_S", -1.0)  # now it counts as old: empty, so it goes
        _cgroup.TreeCgroup.create("loopfence-next-2", 8, None).remove()  # type: ignore[union-attr]
        assert not any(d.exists() for d in left.dirs)
    finally:
        left.remove()


_AS_INIT = """
import subprocess, sys
from loopfence import Limits, ScriptedModel, run, workspace_tools
from loopfence.testing import calls_reply, text_reply, tool_call
n = 6
model = ScriptedModel([calls_reply(tool_call("run_command", command=f"echo {i}")) for i in range(n)] + [text_reply("done")])
r = run("t", model=model, tools=workspace_tools(sys.argv[1]), limits=Limits(max_steps=n + 2))
rows = [line.split() for line in subprocess.run(["ps", "-eo", "stat,comm"], capture_output=True, text=True).stdout.splitlines()]
print(r.stop.reason, r.ledger.tool_executions, sum(1 for row in rows if row[-1] == "bwrap" and row[0].startswith("Z")))
"""


@as_root
def test_as_a_containers_pid_1_no_sandbox_process_is_left_a_zombie(tmp_path: Path) -> None:
    """`docker run IMAGE loopfence ...` without --init: loopfence is PID 1, and the sandbox's inner
    bwrap, orphaned when the outer one exits, is its child to reap (one per command otherwise)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    ws = tmp_path / "ws"
    ws.mkdir()
    out = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", _AS_INIT, str(ws)],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"no PID namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    reason, executions, zombies = out.stdout.split()
    assert (reason, executions) == ("final_answer", "6")
    assert int(zombies) <= 1  # at most the last command's, reaped by the next one

