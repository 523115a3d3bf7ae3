"""Bounds for a command's whole process tree: a cgroup with a process count and a memory ceiling.

rlimits are per process (RLIMIT_AS) or per user (RLIMIT_NPROC, which root ignores), so a fork bomb
or five 3 GB allocations pass them. A cgroup bounds the tree: `pids.max` and the memory limit hold
for every process the command starts, whatever it does with sessions or its environment, and every
member can be found and killed at the end. One is made per command where this machine lets us
(cgroup v2 with the controllers delegated to our cgroup's parent, or cgroup v1 hierarchies we can
write); elsewhere `TreeCgroup.create` returns None and the caller says which bounds are in force.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TreeCgroup", "cgroup_support"]

_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """controller (or '' for v2) -> our cgroup path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctl in parts[1].split(",") if parts[1] else [""]:
                found[ctl] = parts[2]
    return found


STALE_S = 60.0  # a command's cgroup this old and empty was left by a loopfence that was killed


def _sweep(parent: Path) -> None:
    """Remove empty `loopfence-*` cgroups older than STALE_S next to a new one: a loopfence killed
    mid-command (SIGKILL) leaves its cgroup behind. rmdir refuses one that still has members, and
    the age keeps a cgroup another loopfence just made (its command not started yet) safe."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if entry.name.startswith("loopfence-"):
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
                    os.rmdir(entry.path)
            except OSError:
                continue


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class TreeCgroup:
    """The cgroup directories of one command (one per v1 hierarchy, or one v2 directory)."""

    dirs: tuple[Path, ...]
    procs_files: tuple[str, ...]  # the launcher writes its pid into each before it execs
    kind: str  # "cgroup v1" / "cgroup v2"
    processes: int | None
    memory_bytes: int | None

    @classmethod
    def create(cls, name: str, processes: int | None, memory_bytes: int | None) -> TreeCgroup | None:
        """A fresh cgroup `name` with the limits set, or None when this machine does not let us."""
        if processes is None and memory_bytes is None:
            return None
        own = _own_paths()
        if (_ROOT / "cgroup.controllers").exists() and "" in own:
            return cls._v2(_ROOT / own[""].lstrip("/") / name, processes, memory_bytes)
        return cls._v1(own, name, processes, memory_bytes)

    @classmethod
    def _v2(cls, where: Path, processes: int | None, memory_bytes: int | None) -> TreeCgroup | None:
        try:
            wanted = {c for c, v in (("pids", processes), ("memory", memory_bytes)) if v is not None}
            enabled = set((where.parent / "cgroup.subtree_control").read_text().split())
            if not wanted <= enabled:
                return None
            _sweep(where.parent)
            where.mkdir()
        except OSError:
            return None
        ok = processes is None or _write(where / "pids.max", str(processes))
        if memory_bytes is not None:
            ok = ok and _write(where / "memory.max", str(memory_bytes))
            _write(where / "memory.swap.max", "0")  # where swap is accounted
        group = cls((where,), (str(where / "cgroup.procs"),), "cgroup v2", processes, memory_bytes)
        if not ok:
            group.remove()
            return None
        return group

    @classmethod
    def _v1(cls, own: dict[str, str], name: str, processes: int | None,
            memory_bytes: int | None) -> TreeCgroup | None:
        plan = [(c, f, v) for c, f, v in (("pids", "pids.max", processes),
                                          ("memory", "memory.limit_in_bytes", memory_bytes)) if v is not None]
        made: list[Path] = []
        for ctl, knob, value in plan:
            where = _ROOT / ctl / own.get(ctl, "/").lstrip("/") / name
            _sweep(where.parent)
            try:
                where.mkdir()
            except OSError:
                break
            made.append(where)
            if not _write(where / knob, str(value)):
                break
            if ctl == "memory":  # no swap either, where the kernel accounts it
                _write(where / "memory.memsw.limit_in_bytes", str(value))
        else:
            return cls(tuple(made), tuple(str(d / "cgroup.procs") for d in made), "cgroup v1",
                       processes, memory_bytes)
        cls(tuple(made), (), "cgroup v1", None, None).remove()
        return None

    def describe(self) -> dict[str, object]:
        return {"tree_bounds": self.kind, "tree_processes": self.processes, "tree_memory_bytes": self.memory_bytes}

    def pids(self) -> list[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(p) for p in Path(procs).read_text().split())
            except (OSError, ValueError):
                continue
        found.discard(os.getpid())
        return sorted(found)

    def oom_killed(self) -> bool:
        """Did the memory ceiling kill something in this tree?"""
        for d in self.dirs:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                try:
                    for line in (d / name).read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == key and int(v) > 0:
                            return True
                except (OSError, ValueError):
                    continue
            try:
                if int((d / "memory.failcnt").read_text()) > 0:
                    return True
            except (OSError, ValueError):
                continue
        return False

    def kill_all(self, wait_s: float = 2.0) -> int:
        """SIGKILL every member until none is left (or `wait_s` passes); returns how many were hit."""
        hit: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            live = self.pids()
            if not live or time.monotonic() > deadline:
                return len(hit)
            if self.kind == "cgroup v2":
                _write(self.dirs[0] / "cgroup.kill", "1")
            for pid in live:
                hit.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # members still exiting
                    time.sleep(0.01)


def cgroup_support() -> str | None:
    """Which kind of cgroup a command would get here ('cgroup v1'/'cgroup v2'), or None."""
    probe = TreeCgroup.create(f"loopfence-probe-{os.getpid()}", 1 << 20, 1 << 40)
    if probe is None:
        return None
    probe.remove()
    return probe.kind
