"""The bubblewrap sandbox for run_command: how it is built, whoever starts loopfence.

Inside: no network, no capabilities, no new user namespaces, its own PID namespace (killed with its
parent), the system folders read-only, only the files of /etc a command needs (no shadow, gshadow,
sudoers or ssh keys), /proc with its writable knobs (`/proc/sys`, `sysrq-trigger`, ...) read-only,
a private scratch /tmp discarded at exit, the workspace as the only writable host folder, mounted at
its own path (so the paths the file tools report stay valid), and a seccomp filter that refuses any
setuid/setgid bit.

The command never runs as root on the host. Started by an unprivileged user, bwrap maps that user;
started by root, the launcher first makes an idmapped mount of the workspace (its owner's files
appear owned by a fresh unprivileged uid) and drops to that uid before bwrap starts, so uid 0
inside is never uid 0 outside: `/proc/sys`, `/etc/shadow` and other root-owned files are closed to
it by the kernel, not only by what we bind, and RLIMIT_NPROC is real.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SandboxPlan", "plan", "ETC_KEEP"]

# what a command may need from /etc; everything else there is absent in the sandbox
ETC_KEEP = ("passwd", "group", "hosts", "hostname", "host.conf", "nsswitch.conf", "resolv.conf", "gai.conf",
            "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives",
            "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "mime.types",
            "protocols", "services", "os-release", "debian_version", "lsb-release", "profile",
            "bash.bashrc", "inputrc", "environment", "locale.alias", "locale.conf", "magic", "mailcap",
            "terminfo", "fonts", "python3", "perl", "gitconfig", "pip.conf", "npmrc", "java-17-openjdk",
            "java-21-openjdk", "R", "papersize", "shells", "login.defs", "subuid", "subgid", "xdg",
            "emacs", "vim", "mke2fs.conf", "default")
# where the launcher puts the idmapped workspace in its private mount namespace: on a tmpfs over a
# folder bwrap itself does not need (only bwrap, /usr and the /etc files above are read there)
SCRATCH = ("/mnt", "/media", "/srv", "/tmp")
_UID_BASE, _UID_SPAN = 1_000_000, 1_000_000
_INSIDE_ID = 1000


@dataclass(frozen=True, slots=True)
class SandboxPlan:
    """How one command is sandboxed: bwrap's argv (up to `--`), and what the launcher must do first."""

    argv: list[str]
    launch: dict[str, Any] = field(default_factory=dict)  # idmap / drop, for the launcher
    user: str = ""  # who the command runs as on the host, in words

    def describe(self) -> dict[str, Any]:
        return {"sandbox": "bubblewrap", "host_user": self.user}


def plan(bwrap: str, root: Path, seccomp_fd: int | None) -> SandboxPlan:
    """The sandbox for a command in `root`. As root: a fresh unprivileged uid owns an idmapped view."""
    if os.geteuid() != 0:
        return SandboxPlan(_bwrap(bwrap, root, str(root), seccomp_fd, ()), user=f"uid {os.geteuid()} (yours)")
    st = os.stat(root)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)  # per command: its own RLIMIT_NPROC count
    scratch = next((d for d in SCRATCH if os.path.isdir(d) and not os.path.islink(d)), "/tmp")
    at = f"{scratch}/.loopfence-workspace"
    launch = {"idmap": {"root": str(root), "owner_uid": st.st_uid, "owner_gid": st.st_gid, "uid": uid,
                        "gid": uid, "scratch": scratch, "at": at},
              "drop": {"uid": uid, "gid": uid}}
    ids = ("--uid", str(_INSIDE_ID), "--gid", str(_INSIDE_ID))
    return SandboxPlan(_bwrap(bwrap, root, at, seccomp_fd, ids), launch,
                       user=f"unprivileged uid {uid} (idmapped workspace; loopfence runs as root)")


def _bwrap(bwrap: str, root: Path, source: str, seccomp_fd: int | None, ids: tuple[str, ...]) -> list[str]:
    args = [bwrap, "--unshare-all", "--unshare-user", *ids, "--disable-userns", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--dir", "/etc"]
    for name in ETC_KEEP:
        path = f"/etc/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    # bwrap binds /proc's writable knobs (sys, sysrq-trigger, irq, bus) read-only over its own /proc
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--bind", source, str(root), "--remount-ro", "/", "--chdir", str(root),
             "--hostname", "sandbox", "--clearenv",
             "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", str(root),
             "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args
