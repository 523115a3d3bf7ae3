"""The tiny launcher between loopfence and a command: run as `python -I -S _launch.py CONFIG ARGV...`.

It imports nothing from loopfence (it starts fresh for every command), and in order:
1. joins the command's cgroup (`cgroups`: procs files), so every process it starts is bounded;
2. when `idmap` is given (loopfence runs as root): builds an idmapped mount of the workspace in a
   private mount namespace, so that an unprivileged uid owns what the workspace's owner owns and
   writes files the host sees as the owner's; the mount is placed at `idmap.at` on a tmpfs over
   `idmap.scratch` (a folder bwrap itself does not need), where bwrap binds it from;
3. sets the rlimits, which hold for everything the command starts;
4. drops to `drop` (uid, gid, no supplementary groups: no capabilities are left), and
5. execs argv.
Any failure before the exec is one line on stderr and exit 126: nothing of the command ran.
"""

import ctypes
import json
import os
import resource
import sys

__all__ = ["main"]

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x4000, 1 << 18, 2, 4
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
MOVE_MOUNT_F_EMPTY_PATH, MOUNT_ATTR_IDMAP = 0x4, 0x00100000
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on x86_64 and aarch64
AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)


class _Attr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret, what):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _userns(uid_map, gid_map):
    """A user namespace holding these maps (for the idmapped mount), as an fd."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only holds the namespace open until the parent has an fd on it
        os.close(ready_r)
        os.close(done_w)
        os.write(ready_w, b"1" if _libc.unshare(CLONE_NEWUSER) == 0 else b"0")
        os.read(done_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("cannot create a user namespace for the idmapped workspace")
        with open(f"/proc/{pid}/uid_map", "w") as fh:
            fh.write(uid_map)
        with open(f"/proc/{pid}/gid_map", "w") as fh:
            fh.write(gid_map)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def _idmap(cfg):
    """Mount the workspace at cfg['at'] with disk owner -> the unprivileged uid, in a private ns."""
    nsfd = _userns(f"{cfg['owner_uid']} {cfg['uid']} 1\n", f"{cfg['owner_gid']} {cfg['gid']} 1\n")
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    tree = _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, cfg["root"].encode(),
                                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE), "open_tree(workspace)")
    attr = _Attr(MOUNT_ATTR_IDMAP, 0, 0, nsfd)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr)), "an idmapped mount of the workspace (mount_setattr)")
    # a scratch tmpfs, private to this namespace, that the unprivileged uid can traverse
    top = cfg["scratch"]
    _check(_libc.mount(b"tmpfs", top.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k"),
           f"tmpfs on {top}")
    os.mkdir(cfg["at"], 0o755)
    _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, cfg["at"].encode(), MOVE_MOUNT_F_EMPTY_PATH),
           "move_mount(workspace)")
    os.close(tree)
    os.close(nsfd)


def main():
    cfg = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    for procs in cfg.get("cgroups", ()):
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    if cfg.get("idmap"):
        _idmap(cfg["idmap"])
    for name, soft, hard in cfg.get("rlimits", ()):
        res = getattr(resource, name)
        cur = resource.getrlimit(res)[1]
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur), min(hard, cur)
        resource.setrlimit(res, (soft, hard))
    drop = cfg.get("drop")
    if drop:
        os.chdir("/")
        os.setgroups([])
        os.setresgid(drop["gid"], drop["gid"], drop["gid"])
        os.setresuid(drop["uid"], drop["uid"], drop["uid"])
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        raise OSError(exc.errno, f"{argv[0]}: {exc.strerror}") from None


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - one line, and nothing of the command ran
        sys.stderr.write(f"loopfence: cannot start the command: {exc}\n")
        os._exit(126)
