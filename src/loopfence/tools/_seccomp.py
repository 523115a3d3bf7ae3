"""A seccomp filter (classic BPF) for the sandbox: no setuid or setgid bit can be set on any file.

Files a command writes in the workspace belong to the workspace's owner on the host (root, when
loopfence runs as root), so a `chmod u+s` there would leave the host a setuid binary with
model-chosen contents. The filter answers EPERM to every call that could set S_ISUID or S_ISGID:
chmod and its variants, and open/creat/mknod whose mode asks for either bit. `openat2` (its mode is
behind a pointer the filter cannot read) and io_uring (which can open files itself) answer ENOSYS,
so libraries fall back to the calls the filter can see. Other architectures than x86_64 and
aarch64 get no filter (`program()` returns None, and the log header says so).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["program", "SUID_BITS"]

SUID_BITS = 0o6000

# classic BPF opcodes
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# syscall -> index of its mode argument
_MODE_ARG = {
    "x86_64": {2: 2, 85: 1, 90: 1, 91: 1, 133: 1, 257: 3, 259: 2, 268: 2, 452: 2},
    "aarch64": {56: 3, 52: 1, 53: 2, 33: 2, 452: 2},
}
_NOSYS = (437, 425, 426, 427)  # openat2, io_uring_setup/enter/register: same number on both


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture, as bytes for bwrap's `--seccomp FD`."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        return None
    allow, eperm, enosys = _ins(_RET_K, _ALLOW), _ins(_RET_K, _ERRNO | errno.EPERM), \
        _ins(_RET_K, _ERRNO | errno.ENOSYS)
    checks = sorted(_MODE_ARG[machine].items())
    out = [_ins(_LD_W_ABS, 4), _ins(_JEQ_K, _ARCH[machine], 1, 0), enosys, _ins(_LD_W_ABS, 0)]
    if machine == "x86_64":  # x32 syscall numbers have bit 30 set: not ours to allow
        out += [_ins(0x35, 0x40000000, 0, 1), enosys]  # jge -> ENOSYS
    for nr in _NOSYS:
        out += [_ins(_JEQ_K, nr, 0, 1), enosys]
    # one block per mode-taking call: jeq nr -> load the mode, jset bits -> EPERM, else allow
    for nr, arg in checks:
        out += [_ins(_JEQ_K, nr, 0, 4), _ins(_LD_W_ABS, 16 + 8 * arg), _ins(_JSET_K, SUID_BITS, 0, 1),
                eperm, allow]
    out.append(allow)
    return b"".join(out)
