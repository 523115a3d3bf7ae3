"""The workspace jail: every file tool asks `Jail.locate` before touching the disk.

`locate` walks the path one component at a time inside the root, reading symlinks itself, and
never looks at anything outside the root. It refuses, with a structured value (never an
exception): empty paths, NUL bytes, backslashes, `..` that leaves the root, absolute paths
outside it, symlinks that lead outside it, and device/special files (FIFO, socket, /dev/*).

The I/O helpers then open the *canonical* path (no symlinks left in it) component by component
from a descriptor on the root with O_NOFOLLOW, so a symlink swapped in between the check and the
open is refused by the kernel instead of followed: the check and the use cannot disagree. A file
with more than one hard link is not read (another name for it may be outside the root) unless the
jail allows hard links; a file written never keeps a setuid, setgid or sticky bit.
"""

from __future__ import annotations

import difflib
import os
import stat
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Jail", "Located", "Refusal", "Entry", "NotRegularFile", "HardLinked", "MAX_SYMLINK_HOPS"]

MAX_SYMLINK_HOPS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SIMILAR_SCAN = 5_000  # at most this many workspace paths are compared for "similar"
_SIMILAR_DEPTH = 32  # ...from folders at most this deep
_MODE_BITS = 0o777  # what a written file keeps of the mode it replaces: never setuid/setgid/sticky


class NotRegularFile(OSError):
    """The path changed kind (to a folder, FIFO, device...) between the check and the open."""


class HardLinked(Exception):
    """A regular file with more than one hard link: another name for it may be outside the
    workspace, so it is not read unless the jail allows hard links."""

    def __init__(self, rel: str, links: int) -> None:
        super().__init__(f"{rel} has {links} hard links: the same file may also be outside the "
                         "workspace, so it is not read. To allow hard-linked files: "
                         "workspace_tools(..., allow_hardlinks=True) or `loopfence run --allow-hardlinks`")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A path the guard will not let a tool use; `to_dict()` is the model-visible result."""

    error: str  # invalid_path | path_outside_workspace | special_file | missing_file | symlink_loop
    path: str
    reason: str
    extra: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": False, "error": self.error, "path": self.path, "message": self.reason}
        body.update(self.extra)
        return body


@dataclass(frozen=True, slots=True)
class Located:
    """A path inside the root. `parts` are canonical: no symlink, `.` or `..` left in them."""

    parts: tuple[str, ...]
    kind: str  # file | dir | missing

    @property
    def rel(self) -> str:
        return "/".join(self.parts) or "."

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else "."


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    kind: str  # file | dir | symlink | special


class Jail:
    """One workspace root. All paths the model gives are interpreted relative to it."""

    def __init__(self, root: str | os.PathLike[str], *, allow_hardlinks: bool = False) -> None:
        given = os.path.abspath(os.fspath(root))
        real = os.path.realpath(given)
        if not os.path.isdir(real):
            raise ValueError(f"workspace root {given!r} is not a folder")
        self.root = Path(real)
        self._prefixes = tuple(dict.fromkeys([real, given]))  # absolute spellings of the root
        self.allow_hardlinks = allow_hardlinks

    # ---------------------------------------------------------------- the check
    def locate(self, path: Any) -> Located | Refusal:
        """Where `path` lands inside the root, or why it may not be used. Touches only the root."""
        if not isinstance(path, str):
            return Refusal("invalid_path", str(path), "the path must be a string")
        if not path.strip():
            return Refusal("invalid_path", path, "the path is empty; use \".\" for the workspace folder")
        if "\x00" in path:
            return Refusal("invalid_path", path, "the path contains a NUL byte")
        if "\\" in path:
            return Refusal("invalid_path", path, "backslashes are not path separators here; use \"/\"")
        try:
            os.fsencode(path)
        except UnicodeEncodeError as exc:
            return Refusal("invalid_path", path, f"the path is not valid text (character {exc.start} is "
                           f"a lone surrogate {path[exc.start]!r})")
        if path.startswith("/"):
            rest = self._strip_root(path)
            if rest is None:
                return _outside(path, "an absolute path outside the workspace")
            return self._walk(path, rest)
        return self._walk(path, path.split("/"))

    def _strip_root(self, path: str) -> list[str] | None:
        for prefix in self._prefixes:
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return path[len(prefix):].split("/")
        return None

    def _walk(self, path: str, parts: list[str]) -> Located | Refusal:
        todo: deque[str] = deque(parts)
        done: list[str] = []
        hops = 0
        via: str | None = None  # the last symlink followed, for the refusal message
        missing_at: int | None = None  # index in `done` of the first component that does not exist
        while todo:
            comp = todo.popleft()
            if comp in ("", "."):
                continue
            if comp == "..":
                if not done:
                    return _outside(path, f"{via} is a symlink that leads outside the workspace"
                                    if via else "\"..\" leaves the workspace")
                done.pop()
                if missing_at is not None and len(done) <= missing_at:
                    missing_at = None
                continue
            if missing_at is not None:
                done.append(comp)
                continue
            try:
                st = os.lstat(self.root.joinpath(*done, comp))
            except FileNotFoundError:
                missing_at = len(done)
                done.append(comp)
                continue
            except NotADirectoryError:
                return Refusal("invalid_path", path, f"{'/'.join(done)} is a file, not a folder")
            except OSError as exc:
                return Refusal("invalid_path", path, f"cannot inspect the path: {exc.strerror}")
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    return Refusal("symlink_loop", path, f"more than {MAX_SYMLINK_HOPS} symlinks")
                try:
                    target = os.readlink(self.root.joinpath(*done, comp))
                except OSError:  # no longer a symlink, or gone: something changed it meanwhile
                    return _changed(path)
                via = "/".join([*done, comp])
                if target.startswith("/"):
                    rest = self._strip_root(target)
                    if rest is None:
                        return _outside(path, f"{'/'.join([*done, comp])} is a symlink to {target}, "
                                              "outside the workspace")
                    done = []
                    todo.extendleft(reversed(rest))
                else:
                    todo.extendleft(reversed(target.split("/")))
                continue
            if todo and not stat.S_ISDIR(st.st_mode):
                if any(c not in ("", ".") for c in todo):
                    return Refusal("invalid_path", path, f"{'/'.join([*done, comp])} is a file, not a folder")
            done.append(comp)
        if missing_at is not None:
            return Located(tuple(done), "missing")
        try:
            mode = os.lstat(self.root.joinpath(*done)).st_mode
        except OSError:
            return _changed(path)
        if stat.S_ISDIR(mode):
            return Located(tuple(done), "dir")
        if stat.S_ISREG(mode):
            return Located(tuple(done), "file")
        return Refusal("special_file", path, f"{'/'.join(done)} is a {_kind_name(mode)}, not a regular "
                                              "file or folder", (("hint", "only regular files can be used"),))

    # ---------------------------------------------------------------- results
    def missing(self, path: str, loc: Located, want: str = "file") -> dict[str, Any]:
        """The missing-file result: where we looked and up to 3 existing paths with close names. Paths
        are relative to the workspace root ("cwd" is "."): the host's absolute path is none of the
        model's business, and a result that names it could not replay in another folder."""
        return {"ok": False, "error": "missing_file", "path": path, "cwd": ".",
                "hint": "do_not_retry_same_path", "similar": self.similar(loc.rel, want),
                "message": f"no {'folder' if want == 'dir' else 'file'} at {loc.rel} in the workspace"}

    def similar(self, rel: str, want: str = "file", n: int = 3) -> list[str]:
        candidates = [p for p, kind in self._inventory() if want == "any" or kind == want]
        base = rel.rsplit("/", 1)[-1]
        scored = []
        for cand in candidates:
            whole = difflib.SequenceMatcher(None, rel, cand).ratio()
            name = difflib.SequenceMatcher(None, base, cand.rsplit("/", 1)[-1]).ratio()
            score = max(whole, 0.9 * name)
            if score >= 0.6:
                scored.append((-score, cand))
        return [cand for _, cand in sorted(scored)[:n]]

    def _inventory(self) -> Iterator[tuple[str, str]]:
        """(relative path, dir | file) breadth first, without recursion: at most _SIMILAR_SCAN
        entries from folders at most _SIMILAR_DEPTH deep; an unreadable folder is skipped."""
        seen = 0
        todo: deque[tuple[str, ...]] = deque([()])
        while todo:
            parts = todo.popleft()
            try:
                with os.scandir(self.root.joinpath(*parts)) as it:
                    found = sorted((e.name, _entry_kind(e)) for e in it)
            except OSError:
                continue
            for name, kind in found:
                if kind not in ("dir", "file"):
                    continue
                seen += 1
                if seen > _SIMILAR_SCAN:
                    return
                yield "/".join([*parts, name]), kind
                if kind == "dir" and len(parts) + 1 < _SIMILAR_DEPTH:
                    todo.append((*parts, name))

    # ---------------------------------------------------------------- race-free I/O
    @contextmanager
    def _dir_fd(self, parts: tuple[str, ...], create: bool = False) -> Iterator[int]:
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for comp in parts:
                try:
                    nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(comp, 0o755, dir_fd=fd)
                    nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def read_bytes(self, loc: Located, limit: int) -> bytes:
        """The file's bytes; OSError if it changed kind since `locate`; ValueError past `limit`."""
        with self._dir_fd(loc.parts[:-1]) as dfd:
            fd = os.open(loc.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise NotRegularFile(f"{loc.rel} is not a regular file")
                if st.st_nlink > 1 and not self.allow_hardlinks:
                    raise HardLinked(loc.rel, st.st_nlink)
                if st.st_size > limit:
                    raise ValueError(f"{loc.rel} is {st.st_size:,} bytes, over the {limit:,}-byte limit")
                return fh.read(limit + 1)

    def write_bytes(self, loc: Located, data: bytes) -> bool:
        """Write atomically (temp file + rename), creating parent folders. True if the file is new."""
        with self._dir_fd(loc.parts[:-1], create=True) as dfd:
            created, mode = True, 0o644
            try:
                st = os.stat(loc.name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise NotRegularFile(f"{loc.rel} exists and is not a regular file")
                created, mode = False, st.st_mode & _MODE_BITS
            except FileNotFoundError:
                pass
            tmp = f".loopfence-{uuid.uuid4().hex[:12]}.tmp"  # 27 bytes, whatever the name's length
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, loc.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            return created

    def delete(self, loc: Located) -> None:
        with self._dir_fd(loc.parts[:-1]) as dfd:
            st = os.stat(loc.name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{loc.rel} is not a regular file")
            os.unlink(loc.name, dir_fd=dfd)

    def entries(self, loc: Located) -> list[Entry]:
        with self._dir_fd(loc.parts) as dfd:
            out = []
            with os.scandir(dfd) as it:
                for e in it:
                    out.append(Entry(e.name, _entry_kind(e)))
        return sorted(out, key=lambda e: e.name)


def _entry_kind(e: os.DirEntry[str]) -> str:
    try:
        mode = e.stat(follow_symlinks=False).st_mode
    except OSError:
        return "special"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else \
        "symlink" if stat.S_ISLNK(mode) else "special"


def _changed(path: str) -> Refusal:
    return Refusal("invalid_path", path, "the path changed while it was being checked (something else is "
                   "changing the workspace); try again")


def _outside(path: str, why: str) -> Refusal:
    return Refusal("path_outside_workspace", path, f"refused: {why}",
                   (("hint", "use a path relative to the workspace folder"),))


def _kind_name(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device file"
    return "special file"
