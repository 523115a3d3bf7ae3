"""The bubblewrap sandbox for run_command: how it is built, whoever starts loopfence.

Inside: no network, no capabilities, no new user namespaces, its own PID namespace (killed with its
parent), the system folders read-only, only the files of /etc a command needs (no shadow, gshadow,
sudoers or ssh keys), /proc with its writable knobs (`/proc/sys`, `sysrq-trigger`, ...) read-only,
a private scratch /tmp discarded at exit, the workspace as the only writable host folder, mounted at
its own path (so the paths the file tools report stay valid), and a seccomp filter that refuses any
setuid/setgid bit.

A setuid or setgid file already in the workspace (a rootfs tree, an extracted package) is bound
read-only over itself: the kernel clears the bit on write(), truncate() and chmod() but not on a
write through a shared mapping, which would leave model-written code in a setuid binary on the host.
`setuid_files` finds them before every command, by a walk of the whole tree (one lstat per file and
folder, no symlink followed); every hard link of such a file carries the bit and is found too, and a
new link cannot be made to a read-only bind (EXDEV). A folder the walk may not list, or may list but
not look into (read but no search permission), is bound read-only whole (not as root: root looks
into every folder). A file made setuid on the host while a command runs is guarded from the next
command on.

The command never runs as root on the host. Started by an unprivileged user, bwrap maps that user;
started by root, the launcher first makes an idmapped mount of the workspace (its owner's files
appear owned by a fresh unprivileged uid) and drops to that uid before bwrap starts, so uid 0
inside is never uid 0 outside: `/proc/sys`, `/etc/shadow` and other root-owned files are closed to
it by the kernel, not only by what we bind, and RLIMIT_NPROC is real.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SandboxPlan", "plan", "setuid_files", "SetuidScanError", "ETC_KEEP", "MAX_SETUID_FILES"]

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
MAX_SETUID_FILES = 1_000  # each is one read-only bind (a mount) in the sandbox
_SUID_BITS = stat.S_ISUID | stat.S_ISGID


class SetuidScanError(Exception):
    """The workspace could not be checked for setuid files, or holds too many: no command runs."""


@dataclass(frozen=True, slots=True)
class SandboxPlan:
    """How one command is sandboxed: bwrap's argv (up to `--`), and what the launcher must do first."""

    argv: list[str]
    launch: dict[str, Any] = field(default_factory=dict)  # idmap / drop, for the launcher
    user: str = ""  # who the command runs as on the host, in words

    def describe(self) -> dict[str, Any]:
        return {"sandbox": "bubblewrap", "host_user": self.user}


def setuid_files(root: Path, limit: int = MAX_SETUID_FILES) -> list[str]:
    """Every setuid or setgid regular file under `root` (each hard link), relative to it, and every
    folder this user may not list or look into (its owner could chmod it inside). Another error or
    more than `limit`: SetuidScanError naming it (fail closed)."""
    found: list[str] = []
    folders = [""]
    while folders:
        rel = folders.pop()
        try:
            listing = os.scandir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone since it was listed
        except PermissionError:  # (not as root) what it holds cannot be checked: read-only, whole
            if not rel:
                raise SetuidScanError("cannot list the workspace to look for setuid files in it") from None
            _add(found, rel, limit)
            continue
        except OSError as exc:
            raise SetuidScanError(f"cannot list the folder {rel or '.'} to look for setuid files in it: "
                                  f"{exc.strerror or exc}") from None
        try:
            inner, suid = _entries(listing, rel)
        except PermissionError:  # listed but not searchable (r, no x): its files cannot be checked
            if not rel:
                raise SetuidScanError("cannot look into the workspace's files (no search permission) to "
                                      "look for setuid files in it") from None
            _add(found, rel, limit)  # read-only, whole (nothing under it is bound on its own)
            continue
        except OSError as exc:
            raise SetuidScanError(f"cannot read the folder {rel or '.'} to look for setuid files in it: "
                                  f"{exc.strerror or exc}") from None
        folders += inner
        for path in suid:
            _add(found, path, limit)
    return sorted(found)


def _entries(listing: Any, rel: str) -> tuple[list[str], list[str]]:
    """One listed folder: its subfolders and its setuid/setgid files, relative to the workspace.
    PermissionError where an entry's mode cannot be read."""
    inner: list[str] = []
    suid: list[str] = []
    with listing:
        for entry in listing:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    entry.stat(follow_symlinks=False)  # PermissionError: this folder cannot be looked into
                    inner.append(path)
                elif entry.is_file(follow_symlinks=False) and \
                        entry.stat(follow_symlinks=False).st_mode & _SUID_BITS:
                    suid.append(path)
            except FileNotFoundError:
                continue
    return inner, suid


def _add(found: list[str], path: str, limit: int) -> None:
    found.append(path)
    if len(found) > limit:
        raise SetuidScanError(f"the workspace holds more than {limit:,} setuid/setgid files or unlistable "
                              f"folders (the sandbox's limit, each bound read-only), e.g. {found[0]}, {path}")


def plan(bwrap: str, root: Path, seccomp_fd: int | None, read_only: tuple[str, ...] = ()) -> SandboxPlan:
    """The sandbox for a command in `root`, with the workspace files `read_only` (relative paths:
    `setuid_files`) bound read-only. As root: a fresh unprivileged uid owns an idmapped view."""
    if os.geteuid() != 0:
        return SandboxPlan(_bwrap(bwrap, root, str(root), seccomp_fd, (), read_only),
                           user=f"uid {os.geteuid()} (yours)")
    st = os.stat(root)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)  # per command: its own RLIMIT_NPROC count
    scratch = next((d for d in SCRATCH if os.path.isdir(d) and not os.path.islink(d)), "/tmp")
    at = f"{scratch}/.loopfence-workspace"
    launch = {"idmap": {"root": str(root), "owner_uid": st.st_uid, "owner_gid": st.st_gid, "uid": uid,
                        "gid": uid, "scratch": scratch, "at": at},
              "drop": {"uid": uid, "gid": uid}}
    ids = ("--uid", str(_INSIDE_ID), "--gid", str(_INSIDE_ID))
    return SandboxPlan(_bwrap(bwrap, root, at, seccomp_fd, ids, read_only), launch,
                       user=f"unprivileged uid {uid} (idmapped workspace; loopfence runs as root)")


def _bwrap(bwrap: str, root: Path, source: str, seccomp_fd: int | None, ids: tuple[str, ...],
           read_only: tuple[str, ...]) -> list[str]:
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
             "--bind", source, str(root)]
    for rel in read_only:
        args += ["--ro-bind", f"{source}/{rel}", f"{root}/{rel}"]
    args += ["--remount-ro", "/", "--chdir", str(root),
             "--hostname", "sandbox", "--clearenv",
             "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", str(root),
             "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args
