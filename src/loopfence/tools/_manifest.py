"""What the workspace held when a run started: a bounded manifest, and optionally a snapshot archive.

`workspace_tools()` takes the manifest once, as the tools are made for a run (the moment the
provenance rules call "the start"), and reports it in the first built-in tool's `info`, so it lands
in the log header as `tool_info.<tool>.workspace_at_start`. `replay --execute-tools` rebuilds the
starting workspace from it: from the snapshot archive when the run made one (`loopfence run
--snapshot`), else by checking a copy of the workspace against it (`compare`, `restore_known`).

The manifest lists, breadth first and sorted, every folder, regular file (size and sha256), symlink
(its target, never followed) and FIFO under the root; paths are workspace-relative, posix. It skips
what no tool can use through the path guard: sockets and device files, and names that are not valid
text (the guard refuses both). Bounded: at most `MAX_ENTRIES` entries (`truncated` says entries past
it exist and are not listed) and `MAX_HASH_BYTES` bytes hashed (a file past that budget, or one that
cannot be read, is listed with its size only and counted in `unhashed`). The snapshot archives
exactly the hashed files (plus the folders, symlinks and FIFOs), so it is bounded by the same budget.

A file entry: {"path", "size", "sha256"} plus, when they hold, "exec": true (owner-executable),
"links": n (hard links; the path guard refuses such files unless allowed), "marked": true (the
untrusted-content xattr of an earlier run). Other entries carry "kind": dir | symlink | fifo, and a
symlink its "target".
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._provenance import XATTR

__all__ = ["START_KEY", "FORMAT", "MAX_ENTRIES", "MAX_HASH_BYTES", "Entry", "Manifest", "ManifestError",
           "SnapshotError", "Difference", "workspace_manifest", "snapshot_path", "recorded_start", "compare",
           "restore_known", "restore_snapshot", "relink", "file_sha256"]

START_KEY = "workspace_at_start"  # the key in a tool's `info` (and so in the header's tool_info)
FORMAT = "loopfence.workspace/1"
MAX_ENTRIES = 5_000
MAX_HASH_BYTES = 64 << 20
SNAPSHOT_SUFFIX = ".workspace.tar.gz"
KINDS = ("file", "dir", "symlink", "fifo")
_CHUNK = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ManifestError(ValueError):
    """A recorded manifest or snapshot that cannot be used (malformed, or an archive that does not
    hold what the manifest says)."""


class SnapshotError(OSError):
    """The snapshot archive could not be written."""


@dataclass(frozen=True, slots=True)
class Entry:
    path: str  # workspace-relative, posix
    kind: str = "file"  # file | dir | symlink | fifo
    size: int | None = None  # files
    sha256: str | None = None  # files within the hash budget that could be read
    target: str | None = None  # symlinks
    exec: bool = False
    links: int = 1
    marked: bool = False

    def to_json(self) -> dict[str, Any]:
        if self.kind == "file":
            out: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
            if self.exec:
                out["exec"] = True
            if self.links > 1:
                out["links"] = self.links
            if self.marked:
                out["marked"] = True
            return out
        return {"path": self.path, "kind": self.kind, **({"target": self.target} if self.kind == "symlink" else {})}

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        if not isinstance(data, dict):
            raise ManifestError(f"an entry must be an object, got {type(data).__name__}")
        path, kind = data.get("path"), data.get("kind", "file")
        if not isinstance(path, str) or not _valid_rel(path):
            raise ManifestError(f"entry path {path!r} is not a relative path inside the workspace")
        if kind not in KINDS:
            raise ManifestError(f"entry {path}: unknown kind {kind!r}")
        if kind == "symlink":
            target = data.get("target")
            if not isinstance(target, str) or not target or "\x00" in target:
                raise ManifestError(f"entry {path}: a symlink needs a target")
            return cls(path, kind, target=target)
        if kind != "file":
            return cls(path, kind)
        size, digest, links = data.get("size"), data.get("sha256"), data.get("links", 1)
        if type(size) is not int or size < 0:
            raise ManifestError(f"entry {path}: size must be a whole number of bytes")
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64 and
                                       all(c in "0123456789abcdef" for c in digest)):
            raise ManifestError(f"entry {path}: sha256 must be 64 hex digits or null")
        if type(links) is not int or links < 1:
            raise ManifestError(f"entry {path}: links must be a positive whole number")
        return cls(path, kind, size, digest, exec=data.get("exec") is True, links=links,
                   marked=data.get("marked") is True)

    def describe(self) -> str:
        if self.kind == "file":
            return f"a file of {self.size:,} bytes" + ("" if self.sha256 else " (not hashed)")
        if self.kind == "symlink":
            return f"a symlink to {self.target}"
        return {"dir": "a folder", "fifo": "a FIFO"}[self.kind]

    @property
    def known(self) -> bool:
        """Can it be made again from the manifest alone (no content needed)?"""
        return self.kind != "file" or self.size == 0


@dataclass(frozen=True, slots=True)
class Manifest:
    entries: tuple[Entry, ...]
    truncated: bool = False  # the entry cap was hit: entries past it are not listed
    unhashed: int = 0  # files listed with their size only (past the byte cap, or unreadable)
    hashed_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # sockets/devices, names that are not text
    max_entries: int = MAX_ENTRIES
    max_hash_bytes: int = MAX_HASH_BYTES
    snapshot: dict[str, Any] | None = None  # {"file", "path", "sha256", "bytes"}

    @property
    def note(self) -> str:
        """What the caps left out, in words ('' when nothing)."""
        parts = []
        if self.truncated:
            parts.append(f"more than {self.max_entries:,} entries: only the first {self.max_entries:,} "
                         "(breadth first) are listed")
        if self.unhashed:
            parts.append(f"{self.unhashed:,} file(s) listed by size only (over the {self.max_hash_bytes:,}-byte "
                         "hash budget, or unreadable)")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "entries": [e.to_json() for e in self.entries],
                               "files": sum(e.kind == "file" for e in self.entries),
                               "hashed_bytes": self.hashed_bytes,
                               "limits": {"max_entries": self.max_entries, "max_hash_bytes": self.max_hash_bytes},
                               "truncated": self.truncated, "unhashed": self.unhashed}
        if self.note:
            out["cap"] = self.note
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        if self.snapshot is not None:
            out["snapshot"] = dict(self.snapshot)
        return out

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"not a {FORMAT} manifest")
        raw = data.get("entries")
        if not isinstance(raw, list):
            raise ManifestError("entries must be a list")
        entries = tuple(Entry.from_json(e) for e in raw)
        kinds: dict[str, str] = {}
        for e in entries:  # every parent listed first, as a folder: nothing is made through a symlink
            if e.path in kinds:
                raise ManifestError(f"entry {e.path} is listed twice")
            parent = e.path.rpartition("/")[0]
            if parent and kinds.get(parent) != "dir":
                raise ManifestError(f"entry {e.path}: its folder {parent} is not listed before it as a folder")
            kinds[e.path] = e.kind
        snap = data.get("snapshot")
        if snap is not None and not (isinstance(snap, dict) and isinstance(snap.get("sha256"), str)):
            raise ManifestError("snapshot must be an object with a sha256")
        limits = data.get("limits") if isinstance(data.get("limits"), dict) else {}
        return cls(entries, data.get("truncated") is True, _int(data.get("unhashed")), _int(data.get("hashed_bytes")),
                   {}, _int(limits.get("max_entries"), MAX_ENTRIES), _int(limits.get("max_hash_bytes"), MAX_HASH_BYTES),
                   snap)


def _int(value: Any, default: int = 0) -> int:
    return value if type(value) is int and value >= 0 else default


def _valid_rel(path: str) -> bool:
    return bool(path) and "\x00" not in path and not path.startswith("/") and \
        all(c not in ("", ".", "..") for c in path.split("/"))


def snapshot_path(log_path: str | os.PathLike[str]) -> Path:
    """Where `loopfence run --snapshot` puts the archive: next to the log, `run-x.jsonl` ->
    `run-x.workspace.tar.gz`."""
    p = Path(log_path)
    return p.with_name((p.name[:-len(p.suffix)] if p.suffix else p.name) + SNAPSHOT_SUFFIX)


def recorded_start(header: dict[str, Any]) -> Manifest | None:
    """The manifest a log header recorded (top level, or in a tool's info), None for older logs.
    ManifestError when it is there and malformed."""
    data = header.get(START_KEY)
    if data is None:
        info = header.get("tool_info")
        for value in (info.values() if isinstance(info, dict) else ()):
            if isinstance(value, dict) and START_KEY in value:
                data = value[START_KEY]
                break
    return None if data is None else Manifest.from_json(data)


# ---------------------------------------------------------------------------------------- the walk
def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    return None  # socket, device: the path guard refuses them and they cannot be archived


def _text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not valid UTF-8 (surrogate-escaped): the guard refuses it
        return False
    return True


def _walk(root: Path, skipped: dict[str, int],
          exclude: frozenset[str] = frozenset()) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry a tool could use, breadth first, sorted per folder;
    symlinks are never followed. `exclude`: relative paths left out (the snapshot being written)."""
    todo: deque[tuple[str, ...]] = deque([()])
    while todo:
        parts = todo.popleft()
        try:
            with os.scandir(root.joinpath(*parts)) as it:
                names = sorted(e.name for e in it)
        except OSError:
            if parts:
                skipped["unreadable_folders"] = skipped.get("unreadable_folders", 0) + 1
            continue
        for name in names:
            rel = "/".join((*parts, name))
            if rel in exclude:
                continue
            if not _text(name):
                skipped["names_not_text"] = skipped.get("names_not_text", 0) + 1
                continue
            try:
                st = os.lstat(root / rel)
            except OSError:
                continue
            kind = _kind(st.st_mode)
            if kind is None:
                skipped["special_files"] = skipped.get("special_files", 0) + 1
                continue
            if kind == "symlink":
                try:
                    if not _text(os.readlink(root / rel)):
                        skipped["names_not_text"] = skipped.get("names_not_text", 0) + 1
                        continue
                except OSError:
                    continue
            yield rel, st
            if kind == "dir":
                todo.append((*parts, name))


def _marked(path: Path) -> bool:
    try:
        return XATTR in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def _read(path: Path, budget: int, keep: bool) -> tuple[str | None, int, bytes | None]:
    """(sha256, bytes read, the bytes when `keep`) of a regular file, reading at most `budget`
    bytes; (None, size, None) when it is over the budget or cannot be read."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None, _size(path), None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > budget:
            return None, st.st_size, None
        h, chunks, n = hashlib.sha256(), [], 0
        while chunk := fh.read(min(_CHUNK, budget + 1 - n)):
            n += len(chunk)
            if n > budget:  # it grew while read
                return None, n, None
            h.update(chunk)
            if keep:
                chunks.append(chunk)
    return h.hexdigest(), n, b"".join(chunks) if keep else None


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def workspace_manifest(root: str | os.PathLike[str], *, snapshot: str | os.PathLike[str] | None = None,
                       max_entries: int = MAX_ENTRIES, max_hash_bytes: int = MAX_HASH_BYTES) -> Manifest:
    """The workspace as it is now. `snapshot`: also write a tar.gz of it there (written to a temporary
    name and renamed; the archive itself is left out of the walk). SnapshotError if it cannot be
    written."""
    base = Path(os.path.realpath(root))
    if snapshot is None:
        return _take(base, None, frozenset(), max_entries, max_hash_bytes)
    final = Path(os.path.realpath(snapshot))
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.tmp")
    exclude = frozenset(os.path.relpath(p, base) for p in (final, tmp) if p.is_relative_to(base))
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            made = _take(base, tar, exclude, max_entries, max_hash_bytes)
        digest, size = file_sha256(tmp), tmp.stat().st_size
        os.replace(tmp, final)
    except (OSError, tarfile.TarError) as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        why = getattr(exc, "strerror", None) or exc
        raise SnapshotError(f"cannot write the workspace snapshot {final}: {why}") from None
    files = sum(e.kind == "file" and e.sha256 is not None for e in made.entries)
    return Manifest(made.entries, made.truncated, made.unhashed, made.hashed_bytes, made.skipped,
                    made.max_entries, made.max_hash_bytes,
                    {"file": final.name, "path": str(final), "sha256": digest, "bytes": size, "files": files})


def _take(root: Path, tar: tarfile.TarFile | None, exclude: frozenset[str], max_entries: int,
          max_hash_bytes: int) -> Manifest:
    entries: list[Entry] = []
    skipped: dict[str, int] = {}
    hashed = unhashed = 0
    truncated = False
    for rel, st in _walk(root, skipped, exclude):
        if len(entries) >= max_entries:
            truncated = True
            break
        try:
            entry, data, info = _entry(root, rel, st, max_hash_bytes - hashed, tar is not None)
        except OSError:  # it went away while we looked
            continue
        if entry.kind == "file":
            if entry.sha256 is None:
                unhashed += 1
            else:
                hashed += entry.size or 0
        entries.append(entry)
        if tar is not None and (entry.kind != "file" or data is not None):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return Manifest(tuple(entries), truncated, unhashed, hashed, skipped, max_entries, max_hash_bytes)


def _entry(root: Path, rel: str, st: os.stat_result, budget: int,
           keep: bool) -> tuple[Entry, bytes | None, tarfile.TarInfo]:
    kind = _kind(st.st_mode)
    path = root / rel
    info = tarfile.TarInfo(rel)
    info.mtime, info.mode = int(st.st_mtime), stat.S_IMODE(st.st_mode)
    data: bytes | None = None
    if kind == "file":
        digest, size, data = _read(path, budget, keep)
        entry = Entry(rel, "file", size, digest, exec=bool(st.st_mode & stat.S_IXUSR), links=st.st_nlink,
                      marked=_marked(path))
        info.type, info.size = tarfile.REGTYPE, size
    elif kind == "symlink":
        entry = Entry(rel, "symlink", target=os.readlink(path))
        info.type, info.linkname = tarfile.SYMTYPE, entry.target or ""
    else:
        entry = Entry(rel, str(kind))
        info.type = tarfile.DIRTYPE if kind == "dir" else tarfile.FIFOTYPE
    return entry, data, info


# ------------------------------------------------------------------------------------- the check
@dataclass(frozen=True, slots=True)
class Difference:
    """One way a folder differs from a manifest."""

    path: str
    change: str  # created | changed | missing
    detail: str
    restorable: bool  # can be put back as recorded without the file's content

    def describe(self) -> str:
        return f"{self.change} {self.path} ({self.detail})"


def compare(manifest: Manifest, root: str | os.PathLike[str]) -> list[Difference]:
    """How `root` differs from the manifest: recorded entries missing or changed (in the manifest's
    order), then entries it does not list (`created`; only when the manifest is complete, since past
    its cap an unlisted entry may have been there)."""
    base = Path(root)
    out: list[Difference] = []
    for e in manifest.entries:
        d = _differs(e, base / e.path)
        if d is not None:
            out.append(d)
    if not manifest.truncated:
        listed = {e.path for e in manifest.entries}
        inside: set[str] = set()  # what is under a created folder goes with it
        for rel, st in _walk(base, {}):
            if rel in listed:
                continue
            if rel.rpartition("/")[0] in inside:
                inside.add(rel)
                continue
            inside.add(rel)
            out.append(Difference(rel, "created", f"{_describe_now(base / rel, st)}, not in the manifest", True))
    return out


def _describe_now(path: Path, st: os.stat_result) -> str:
    kind = _kind(st.st_mode)
    return f"a file of {st.st_size:,} bytes" if kind == "file" else \
        {"dir": "a folder", "symlink": "a symlink", "fifo": "a FIFO"}.get(str(kind), "a special file")


def _differs(e: Entry, path: Path) -> Difference | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Difference(e.path, "missing", f"recorded {e.describe()}", e.known)
    except OSError as exc:
        return Difference(e.path, "changed", f"cannot be inspected: {exc.strerror}", False)
    kind = _kind(st.st_mode)
    if kind != e.kind:
        return Difference(e.path, "changed", f"{_describe_now(path, st)} now, recorded {e.describe()}", e.known)
    if kind == "symlink":
        target = os.readlink(path)
        return None if target == e.target else \
            Difference(e.path, "changed", f"a symlink to {target} now, recorded to {e.target}", True)
    if kind != "file":
        return None
    if st.st_size != e.size:
        return Difference(e.path, "changed", f"{st.st_size:,} bytes now, recorded {e.size:,}", e.known)
    if e.sha256 is not None:
        try:
            digest = file_sha256(path)
        except OSError as exc:
            return Difference(e.path, "changed", f"cannot be read: {exc.strerror}", False)
        if digest != e.sha256:
            return Difference(e.path, "changed", "same size, other content (sha256 differs)", False)
    if bool(st.st_mode & stat.S_IXUSR) != e.exec:
        return Difference(e.path, "changed", "executable bit " + ("lost" if e.exec else "added"), True)
    if _marked(path) != e.marked:
        return Difference(e.path, "changed", f"xattr {XATTR} " + ("lost" if e.marked else "added"), True)
    return None


def restore_known(manifest: Manifest, root: str | os.PathLike[str], differences: list[Difference]) -> None:
    """Put back what the manifest alone can: remove created entries, make folders, symlinks, FIFOs
    and empty files again, fix the executable bit and the mark. For a private copy (replay)."""
    base = Path(os.path.realpath(root))
    recorded = {e.path: e for e in manifest.entries}
    for d in differences:
        if d.change == "created":
            _remove(base / d.path)
    for d in differences:
        e = recorded.get(d.path)
        if d.change == "created" or e is None or not d.restorable:
            continue
        path = base / e.path
        if not Path(os.path.realpath(path.parent)).is_relative_to(base):
            raise ManifestError(f"{e.path}: its folder leads outside the workspace copy")
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and _kind(st.st_mode) != e.kind or e.kind == "symlink" or \
                (e.kind == "file" and st is not None and st.st_size != e.size):
            _remove(path)
            st = None
        if st is None:
            _make(e, path, b"")
        _finish(e, path)


def _remove(path: Path) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _make(e: Entry, path: Path, data: bytes) -> None:
    if e.kind == "dir":
        os.mkdir(path, 0o755)
    elif e.kind == "fifo":
        os.mkfifo(path, 0o644)
    elif e.kind == "symlink":
        os.symlink(str(e.target), path)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


def _copy_checked(src: Any, path: Path) -> str:
    """Stream `src` into a new file at `path`; its sha256."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as out:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


def _finish(e: Entry, path: Path) -> None:
    """The executable bit and the untrusted mark, as recorded (files only)."""
    if e.kind != "file":
        return
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    os.chmod(path, (mode | 0o111) if e.exec else (mode & ~0o111), follow_symlinks=False)
    if e.marked != _marked(path):
        try:
            if e.marked:
                os.setxattr(path, XATTR, b"1", follow_symlinks=False)
            else:
                os.removexattr(path, XATTR, follow_symlinks=False)
        except OSError:
            pass  # a filesystem without user xattrs: the replay shows it if it matters


def relink(manifest: Manifest, root: str | os.PathLike[str], spare: str | os.PathLike[str]) -> int:
    """Files recorded with more than one hard link get one again, in `spare` (outside the copy), so
    the path guard refuses them as it did. Returns how many."""
    made = 0
    for e in manifest.entries:
        path = Path(root) / e.path
        if e.kind != "file" or e.links < 2:
            continue
        try:
            if os.lstat(path).st_nlink > 1:
                continue
            Path(spare).mkdir(exist_ok=True)
            os.link(path, Path(spare) / str(made), follow_symlinks=False)
            made += 1
        except OSError:
            continue
    return made


def restore_snapshot(manifest: Manifest, archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> list[str]:
    """Rebuild the recorded workspace in `dest` (a new folder) from the run's archive, checked against
    the manifest (the recorded sha256 of the archive, then each file's). The manifest is the plan:
    the archive only gives contents. Returns the paths it could not restore (files the snapshot's
    byte budget left out). ManifestError when the archive is not the recorded one."""
    snap = manifest.snapshot or {}
    if file_sha256(archive) != snap.get("sha256"):
        raise ManifestError(f"the snapshot {archive} is not the one the run recorded (its sha256 differs)")
    base = Path(dest)
    base.mkdir()
    for e in manifest.entries:
        if e.kind == "dir":
            _make(e, base / e.path, b"")
    wanted = {e.path: e for e in manifest.entries if e.kind == "file" and e.sha256 is not None}
    done: set[str] = set()
    seen = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                seen += 1
                if seen > len(manifest.entries):
                    raise ManifestError(f"the snapshot {archive} holds more than the manifest lists")
                e = wanted.get(member.name)
                if e is None or member.name in done or not member.isreg():
                    continue
                fh = tar.extractfile(member)
                if fh is None or member.size != e.size or _copy_checked(fh, base / e.path) != e.sha256:
                    raise ManifestError(f"the snapshot's {e.path} is not the recorded file")
                done.add(e.path)
                if len(done) == len(wanted):
                    break
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ManifestError(f"the snapshot {archive} cannot be read: {exc}") from None
    if lost := sorted(set(wanted) - done):
        raise ManifestError(f"the snapshot {archive} lacks {lost[0]}" + (f" and {len(lost) - 1} more file(s)"
                                                                          if len(lost) > 1 else ""))
    unrestored = []
    for e in manifest.entries:
        path = base / e.path
        if e.kind in ("fifo", "symlink"):
            _make(e, path, b"")
        elif e.kind == "file" and e.sha256 is None:
            unrestored.append(e.path)
            continue
        _finish(e, path)
    return unrestored
