"""Where untrusted text is, judged by content, never by metadata a command can change.

Taint follows the content, not the tool: `cat page.html` through the shell, a failing patch that
quotes the page's lines, or a copy of the page under another name must taint the run just as
`read_file page.html` does. Three records make that work, all taken by loopfence itself:

- **The start.** Before the first tool runs, the whole workspace is walked (every entry, however
  many; symlinks are not followed) and each regular file's head is sniffed. The untrusted ones
  (HTML, `untrusted_globs` matches, content an earlier run marked) are read whole: their sha256
  is kept, so a copy, a rename or a `touch` of one is still that content, and their text is
  fingerprinted (tools/_fingerprint: 7 words in a row, through cheap transforms) up to
  `MAX_PRINT_BYTES` in all. A source past that budget is *opaque*: from then on every
  `run_command` or `apply_patch` result is taken to carry its text (fail closed; the reason names
  the file and `--trust`). A path that held untrusted content stays untrusted until `write_file`
  replaces what it holds.
- **The run's own writes.** What `write_file` wrote is recorded (path and sha256). At the first
  taint, every file's lstat signature is recorded; a file whose signature differs later was changed
  after the taint (ctime cannot be set back, so a change cannot hide; a `touch` only distrusts).
- **Marks across runs.** Content changed after the taint is recorded by sha256 and size in a file
  outside the workspace (`$LOOPFENCE_STATE_DIR/untrusted-content`, default
  `$XDG_STATE_HOME/loopfence` or `~/.local/state/loopfence`), which the sandbox cannot reach. The
  xattr `user.loopfence.untrusted` is still set and still distrusts, but removing it trusts nothing.

What it cannot see is in the README's list of blind spots.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._fingerprint import MATCH, SHINGLE, Fingerprints
from ._html import html_to_text, looks_like_html

__all__ = ["Fingerprints", "Provenance", "Marks", "glob_match", "state_dir", "XATTR", "SHINGLE", "MATCH",
           "MAX_PRINT_BYTES", "STATE_ENV"]

XATTR = "user.loopfence.untrusted"
STATE_ENV = "LOOPFENCE_STATE_DIR"
MARKS_FILE = "untrusted-content"
MAX_PRINT_BYTES = 64 << 20  # untrusted sources' bytes fingerprinted, in all
_HEAD = 65536
_READ = 1 << 20
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def glob_match(rel: str, patterns: Iterable[str]) -> str | None:
    """The first workspace-relative posix glob matching `rel` (`**/` may also match no folder)."""
    for pat in patterns:
        if fnmatch.fnmatchcase(rel, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(rel, pat[3:])):
            return pat
    return None


def state_dir() -> Path:
    """Where loopfence keeps what must outlive a run and stay out of the sandbox's reach."""
    if env := os.environ.get(STATE_ENV):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "loopfence"


class Marks:
    """Content written from untrusted content, across runs: one `sha256 size` line each."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else state_dir() / MARKS_FILE
        self._sizes: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._sizes is None:
            self._sizes = {}
            try:
                with open(self.path, encoding="ascii", errors="replace") as fh:
                    for line in fh:
                        digest, _, size = line.strip().partition(" ")
                        if len(digest) == 64 and size.isdigit():
                            self._sizes[digest] = int(size)
            except OSError:
                pass
        return self._sizes

    def sizes(self) -> set[int]:
        return set(self._load().values())

    def __contains__(self, digest: object) -> bool:
        return digest in self._load()

    def add(self, digest: str, size: int) -> None:
        """Record it (OSError when the record cannot be written)."""
        if digest in self._load():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="ascii") as fh:
            fh.write(f"{digest} {size}\n")
        self._load()[digest] = size


def _sig(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode


def _walk(root: Path, unlisted: list[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file under `root`, symlinks not followed."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel)))
        except OSError:
            unlisted.append(rel)
            continue
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
            elif stat.S_ISREG(st.st_mode):
                yield path, st


def _marked(path: str | Path) -> bool:
    try:
        return XATTR in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def _digest(path: str | Path, keep: int) -> tuple[str, int, bytes | None]:
    """(sha256, size, the bytes when there are at most `keep` of them) of a whole file."""
    h, chunks, n = hashlib.sha256(), [], 0
    with os.fdopen(os.open(path, _FLAGS), "rb") as fh:
        while chunk := fh.read(_READ):
            h.update(chunk)
            n += len(chunk)
            if n <= keep:
                chunks.append(chunk)
            else:
                chunks = []
    return h.hexdigest(), n, b"".join(chunks) if n <= keep else None


class Provenance:
    """One workspace's untrusted content and fingerprints, for the file tools and the gate."""

    def __init__(self, root: str | os.PathLike[str], untrusted_globs: Iterable[str] = (),
                 trust_globs: Iterable[str] = (), marks: Marks | None = None) -> None:
        self.root = Path(root)
        self.untrusted_globs = tuple(untrusted_globs)
        self.trust_globs = tuple(trust_globs)
        self.marks = marks if marks is not None else Marks()
        self.prints = Fingerprints()
        self.files: set[str] = set()  # workspace files among the sources
        self.opaque: dict[str, str] = {}  # untrusted sources not fingerprinted whole -> why
        self.scan: dict[str, Any] = {}  # what the start scan did (files, bytes, seconds)
        self._why: dict[str, str] = {}  # path -> why it was untrusted at the start
        self._digests: dict[str, str] = {}  # sha256 of untrusted start content -> its path
        self._written: dict[str, str] = {}  # path -> sha256 of what write_file wrote there
        self._unlisted: list[str] = []  # folders the start scan could not list
        self._at_taint: dict[str, tuple[int, ...]] | None = None
        self._marked: set[tuple[str, str]] = set()
        self._kept: dict[str, str] = {}  # sha256 of files unchanged since the taint, as needed
        self._printed = 0
        self._scanned = False
        self._lock = threading.Lock()

    # -- what a file is ----------------------------------------------------------------------------
    def file_untrusted(self, rel: str, data: bytes) -> str | None:
        """Why the file at `rel`, holding `data`, is untrusted (a sentence naming the fix), or None."""
        self.ensure_scanned()
        if pat := glob_match(rel, self.untrusted_globs):
            return f"{rel} matches the untrusted glob {pat!r} given with --untrusted"
        if glob_match(rel, self.trust_globs):
            return None
        digest = hashlib.sha256(data).hexdigest()
        if (origin := self._digests.get(digest)) is not None:
            return self._why[origin] if origin == rel else f"{rel} holds what {origin} held: {self._why[origin]}"
        if rel in self._why and self._written.get(rel) != digest:
            return f"{self._why[rel]} (it has changed since, but not by write_file)"
        if self._changed_since_taint(rel):
            return f"{rel} was changed after untrusted content entered the run"
        if digest in self.marks or _marked(self.root / rel):
            return (f"{rel} was written from untrusted content by an earlier run (recorded by content in "
                    f"{self.marks.path}); if it is yours, trust it with --trust {rel!r}")
        if any(rel.startswith(f"{d}/") for d in self._unlisted) and \
                looks_like_html(rel, data[:_HEAD].decode("utf-8", errors="replace")):
            return _start_html(rel)  # its folder could not be listed at the start: fail closed
        return None

    def explain(self, rel: str) -> str:
        """Why a workspace file is an untrusted source, naming the flag that changes it."""
        if rel in self._why:
            return self._why[rel]
        try:
            with os.fdopen(os.open(self.root / rel, _FLAGS), "rb") as fh:
                data = fh.read(MAX_PRINT_BYTES)
        except OSError:
            data = b""
        return self.file_untrusted(rel, data) or f"{rel} is untrusted"

    def wrote(self, rel: str, data: bytes) -> None:
        """write_file wrote `data` at `rel`: the run's own content, trusted as the run was then."""
        self._written[rel] = hashlib.sha256(data).hexdigest()

    def _changed_since_taint(self, rel: str) -> bool:
        if self._at_taint is None:
            return False
        try:
            return self._at_taint.get(rel) != _sig(os.lstat(self.root / rel))
        except OSError:
            return True

    # -- the start ---------------------------------------------------------------------------------
    def ensure_scanned(self) -> None:
        """Record the untrusted content that is in the workspace now (once: the run's start)."""
        with self._lock:  # held throughout: no file is judged before the start is known
            if self._scanned:
                return
            began, files, hashed = time.perf_counter(), 0, 0
            sizes = self.marks.sizes()
            for rel, st in _walk(self.root, self._unlisted):
                files += 1
                try:
                    hashed += self._scan_file(rel, st, sizes)
                except OSError:
                    continue
            self.scan = {"files": files, "hashed_bytes": hashed, "seconds": round(time.perf_counter() - began, 3)}
            self._scanned = True

    def _scan_file(self, rel: str, st: os.stat_result, mark_sizes: set[int]) -> int:
        path = os.path.join(self.root, rel)
        if glob_match(rel, self.untrusted_globs):
            why = f"{rel} matches the untrusted glob {glob_match(rel, self.untrusted_globs)!r} given with --untrusted"
        elif glob_match(rel, self.trust_globs):
            return 0
        elif _marked(path):
            why = (f"{rel} was written from untrusted content by an earlier run (xattr {XATTR}); "
                   f"if it is yours, trust it with --trust {rel!r}")
        else:
            fd = os.open(path, _FLAGS)
            try:
                head = os.read(fd, _HEAD).decode("utf-8", errors="replace")
            finally:
                os.close(fd)
            why = _start_html(rel) if looks_like_html(rel, head) else None
            if why is None and st.st_size not in mark_sizes:
                return 0
        digest, size, data = _digest(path, MAX_PRINT_BYTES - self._printed)
        if why is None:
            if digest not in self.marks:
                return size
            why = (f"{rel} was written from untrusted content by an earlier run (recorded by content in "
                   f"{self.marks.path}); if it is yours, trust it with --trust {rel!r}")
        self._why[rel] = why
        if size:  # an empty file holds no one's text
            self._digests.setdefault(digest, rel)
        if data is None:
            self.files.add(rel)
            self.opaque[rel] = (f"{why}; at {size:,} bytes it is past the {MAX_PRINT_BYTES:,}-byte fingerprint "
                                "budget, so every command's output is taken to hold its text")
        else:
            self._printed += size
            self.add_source(rel, data.decode("utf-8", errors="replace"))
        return size

    def add_source(self, source: str, text: str) -> None:
        """An untrusted workspace file's text: its raw form and, for HTML, its readable text too."""
        self.files.add(source)
        self.prints.add(source, text)
        if looks_like_html(source, text):
            self.prints.add(source, html_to_text(text).text)

    # -- after a taint -----------------------------------------------------------------------------
    def tainted(self) -> None:
        """The run is tainted from now on: record each file's signature (once)."""
        if self._at_taint is None:
            self._at_taint = {rel: _sig(st) for rel, st in _walk(self.root, [])}

    def mark_changed(self) -> list[str]:
        """Mark the content of the files changed since the taint (recorded outside the workspace, and
        the xattr): later runs distrust that content wherever it is. Content that a file unchanged
        since the taint also holds (a copy of the user's own file) and empty files are not marked."""
        if self._at_taint is None:
            return []
        changed: list[tuple[str, os.stat_result]] = []
        kept: dict[int, list[str]] = {}  # size -> files unchanged since the taint
        for rel, st in _walk(self.root, []):
            if self._at_taint.get(rel) == _sig(st):
                kept.setdefault(st.st_size, []).append(rel)
            elif st.st_size:
                changed.append((rel, st))
        marked: list[str] = []
        for rel, st in changed:
            path = os.path.join(self.root, rel)
            try:
                digest, size, _ = _digest(path, 0)
            except OSError:
                continue
            if (rel, digest) in self._marked or digest in self._kept_digests(kept.get(size, [])):
                continue
            self._marked.add((rel, digest))
            try:
                self.marks.add(digest, size)
            except OSError:
                pass  # the xattr still says it
            try:
                os.setxattr(path, XATTR, b"1", follow_symlinks=False)
            except OSError:
                pass
            marked.append(rel)
        return marked

    def _kept_digests(self, rels: list[str]) -> set[str]:
        out = set()
        for rel in rels:
            if rel not in self._kept:
                try:
                    self._kept[rel] = _digest(os.path.join(self.root, rel), 0)[0]
                except OSError:
                    continue
            out.add(self._kept[rel])
        return out

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"untrusted_globs": list(self.untrusted_globs), "trust_globs": list(self.trust_globs),
                               "marks": str(self.marks.path)}
        if self.scan:
            out["scan"] = dict(self.scan)
        if self.opaque:
            out["opaque"] = sorted(self.opaque)
        return out


def _start_html(rel: str) -> str:
    return (f"{rel} is HTML that was in the workspace when the run started; if it is yours, trust it with "
            f"--trust {rel!r} (trust_globs= in Python)")
