"""Where untrusted text is, judged by content, never by metadata a command can change.

Taint follows the content, not the tool: `cat page.html` through the shell, a failing patch that
quotes the page's lines, or a copy of the page under another name must taint the run just as
`read_file page.html` does. These records make that work, all taken by loopfence itself:

- **The start.** Before the first tool runs, the whole workspace is walked (every entry, however
  many; symlinks are not followed) and each regular file's head is sniffed. The untrusted ones
  (HTML, `untrusted_globs` matches, content an earlier run marked) are read whole: their sha256
  is kept, so a copy, a rename or a `touch` of one is still that content, and their text is
  fingerprinted (tools/_fingerprint: 7 words in a row, through cheap transforms) up to
  `MAX_PRINT_BYTES` in all. A source past that budget is *opaque*: from then on every
  `run_command` or `apply_patch` result is taken to carry its text (fail closed; the reason names
  the file and `--trust`). A path that held untrusted content stays untrusted until `write_file`
  replaces what it holds.
- **The run's own writes.** What `write_file` wrote is recorded (path and sha256). While the run is
  clean, each file's lstat signature is recorded before every call that may write (a command, a
  patch, a side-effect tool), so the taint's baseline is the workspace just before the call that
  tainted it: what that call wrote counts as changed too. A file counts as changed after the taint
  only when its content changed: its signature changed (ctime cannot be set back, so no change
  hides) *and* its sha256 differs from the one it had at the baseline. Digests are cached by
  signature, so a file is hashed once per change; files up to `BASELINE_BYTES` are hashed for the
  baseline (a larger one whose signature changes after the taint counts as changed: fail closed).
  So a `touch`, `chmod -R` or `make` that rewrites the same bytes distrusts nothing.
- **Marks across runs.** Content changed after the taint is recorded by sha256 and size in a record
  per workspace outside it (`$LOOPFENCE_STATE_DIR/marks/<sha256 of the workspace's real path>`,
  default state folder `$XDG_STATE_HOME/loopfence` or `~/.local/state/loopfence`; the newest
  `MAX_MARKS` entries are kept), which the sandbox cannot reach: one workspace's marks never touch
  another's. A record that would be inside the workspace (`--workspace ~`) is not used: a warning
  says so and the marks live in the run's memory only. The xattr `user.loopfence.untrusted` is
  still set and still distrusts, but removing it trusts nothing. Folders whose content is tooling's
  (`.git`, `node_modules`, `__pycache__`, `.venv`, `.pytest_cache`) are not marked. Marked content
  is fingerprinted only with what the budget has left after the start's own sources, and never
  makes the run opaque: a mark must not fail every later run closed.
- **What could not be read.** A folder the start scan cannot list, or an entry it cannot stat or
  open (a non-root user's unreadable files), is *unseen*: like an opaque source, every
  `run_command` or `apply_patch` result is then taken to carry it (`chmod` then `cat` would
  otherwise pass). `.git/objects` is not scanned: its objects are zlib-compressed, so no page
  there reads as text.

What it cannot see is in the README's list of blind spots.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ._fingerprint import MATCH, SHINGLE, Fingerprints
from ._html import html_to_text, looks_like_html

__all__ = ["Fingerprints", "Provenance", "Marks", "glob_match", "state_dir", "marks_path", "XATTR", "SHINGLE",
           "MATCH", "MAX_PRINT_BYTES", "MAX_MARKS", "BASELINE_BYTES", "STATE_ENV"]

XATTR = "user.loopfence.untrusted"
STATE_ENV = "LOOPFENCE_STATE_DIR"
MARKS_DIR = "marks"
MAX_PRINT_BYTES = 64 << 20  # untrusted sources' bytes fingerprinted, in all
MAX_MARKS = 4096  # entries kept in one workspace's cross-run record: the newest, at least (at most twice)
BASELINE_BYTES = 1 << 20  # files hashed for the taint's baseline
NOT_MARKED = frozenset({".git", "node_modules", "__pycache__", ".venv", ".pytest_cache"})
_HEAD = 65536
_READ = 1 << 20
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Sig = tuple[int, ...]


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


def marks_path(root: str | os.PathLike[str]) -> Path:
    """The cross-run record of the workspace at `root` (one per workspace, by its real path)."""
    return state_dir() / MARKS_DIR / hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()


class Marks:
    """Content written from untrusted content, across runs: one `sha256 size` line each, the newest
    MAX_MARKS kept. `path` None: this run's memory only."""

    def __init__(self, path: str | os.PathLike[str] | None, workspace: str = "") -> None:
        self.path = Path(path) if path is not None else None
        self.workspace = workspace
        self._sizes: dict[str, int] | None = None
        self._lines = 0  # entries in the file: it is rewritten with the newest MAX_MARKS at twice that

    def where(self) -> str:
        return str(self.path) if self.path is not None else "this run's memory (no record on disk)"

    def _load(self) -> dict[str, int]:
        if self._sizes is None:
            self._sizes = {}
            if self.path is None:
                return self._sizes
            try:
                with open(self.path, encoding="ascii", errors="replace") as fh:
                    for line in fh:
                        digest, _, size = line.strip().partition(" ")
                        if len(digest) == 64 and size.isascii() and size.isdigit():
                            self._sizes.pop(digest, None)  # the newest last
                            self._sizes[digest] = int(size)
                            self._lines += 1
            except OSError:
                pass
        return self._sizes

    def sizes(self) -> set[int]:
        return set(self._load().values())

    def __contains__(self, digest: object) -> bool:
        return digest in self._load()

    def add(self, digest: str, size: int) -> None:
        """Record it (OSError when the record cannot be written)."""
        sizes = self._load()
        if digest in sizes:
            return
        sizes[digest] = size
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lines += 1
        if self._lines < 2 * MAX_MARKS:
            with open(self.path, "a", encoding="ascii") as fh:
                fh.write(("" if fh.tell() else f"# content written from untrusted content in {self.workspace}\n")
                         + f"{digest} {size}\n")
            return
        for old in list(sizes)[:len(sizes) - MAX_MARKS]:  # the oldest go
            del sizes[old]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(f"# content written from untrusted content in {self.workspace}\n"
                       + "".join(f"{d} {n}\n" for d, n in sizes.items()), encoding="ascii")
        os.replace(tmp, self.path)
        self._lines = len(sizes)


def _sig(st: os.stat_result) -> Sig:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode


def _walk(root: Path, prune: Callable[[str], bool], unlisted: list[str] | None = None,
          unstat: list[str] | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file under `root`, symlinks not followed, folders for
    which `prune` is true left out; folders it cannot list and entries it cannot stat are noted."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel)))
        except OSError:
            if unlisted is not None:
                unlisted.append(rel)
            continue
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone meanwhile: nothing there to read
                continue
            except OSError:
                if unstat is not None:
                    unstat.append(path)
                continue
            if stat.S_ISDIR(st.st_mode):
                if not prune(path):
                    stack.append(path)
            elif stat.S_ISREG(st.st_mode):
                yield path, st


def _compressed(rel: str) -> bool:
    """`.git/objects`: zlib-compressed objects, where no page reads as text (the start scan skips it)."""
    return rel == ".git/objects" or rel.endswith("/.git/objects")


def _not_marked(rel: str) -> bool:
    return rel.rpartition("/")[2] in NOT_MARKED


def _under_not_marked(rel: str) -> bool:
    return any(part in NOT_MARKED for part in rel.split("/")[:-1])


def _inside(path: Path, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


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
        self.marks = marks if marks is not None else Marks(marks_path(root), os.path.realpath(root))
        if self.marks.path is not None and _inside(self.marks.path, self.root):
            warnings.warn(f"loopfence: the record of untrusted content {self.marks.path} would be inside the "
                          f"workspace {self.root}, where a command could rewrite it; this run keeps its marks in "
                          f"memory only (set {STATE_ENV} to a folder outside the workspace)", RuntimeWarning,
                          stacklevel=2)
            self.marks = Marks(None)
        self.prints = Fingerprints()
        self.files: set[str] = set()  # workspace files among the sources
        self.opaque: dict[str, str] = {}  # untrusted sources not fingerprinted whole -> why
        self.unseen: dict[str, str] = {}  # what the start scan could not read -> why
        self.scan: dict[str, Any] = {}  # what the start scan did (files, bytes, seconds)
        self._why: dict[str, str] = {}  # path -> why it was untrusted at the start
        self._digests: dict[str, str] = {}  # sha256 of untrusted start content -> its path
        self._written: dict[str, str] = {}  # path -> sha256 of what write_file wrote there
        self._unlisted: list[str] = []  # folders the start scan could not list
        self._known: dict[str, tuple[Sig, str]] = {}  # path -> (signature, sha256 it had then)
        self._before: dict[str, tuple[Sig, str | None]] | None = None  # before the call now running
        self._at_taint: dict[str, tuple[Sig, str | None]] | None = None  # the taint's baseline
        self._marked: set[tuple[str, str]] = set()
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
        if self._changed_since_taint(rel, digest):
            return f"{rel} was changed after untrusted content entered the run"
        if digest in self.marks or _marked(self.root / rel):
            return _earlier(rel, f"recorded by content in {self.marks.where()}")
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

    def blind(self) -> tuple[str, str] | None:
        """(a source, why) that no fingerprint covers (opaque, or unseen at the start), or None: a
        quoting tool's result is then taken to carry it."""
        for found in (self.opaque, self.unseen):
            if found:
                return min(found.items())
        return None

    def wrote(self, rel: str, data: bytes) -> None:
        """write_file wrote `data` at `rel`: the run's own content, trusted as the run was then."""
        self._written[rel] = hashlib.sha256(data).hexdigest()

    def _changed_since_taint(self, rel: str, digest: str) -> bool:
        if self._at_taint is None or _under_not_marked(rel):
            return False
        base = self._at_taint.get(rel)
        try:
            same = base is not None and base[0] == _sig(os.lstat(self.root / rel))
        except OSError:
            return True
        return not same and (base is None or base[1] != digest)

    # -- the start ---------------------------------------------------------------------------------
    def ensure_scanned(self) -> None:
        """Record the untrusted content that is in the workspace now (once: the run's start)."""
        if self._scanned:
            return
        with self._lock:  # held throughout: no file is judged before the start is known
            if self._scanned:
                return
            began, files, hashed = time.perf_counter(), 0, 0
            sizes, marked, unstat = self.marks.sizes(), [], []
            for rel, st in _walk(self.root, _compressed, self._unlisted, unstat):
                files += 1
                try:
                    hashed += self._scan_file(rel, st, sizes, marked)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    self._unseen(rel, rel, f"could not be read ({exc.strerror or exc})")
            for rel in unstat:
                self._unseen(rel, rel, "could not be stat'ed")
            for rel in self._unlisted:
                self._unseen(rel or ".", f"{rel}/**" if rel else "**", "is a folder that could not be listed")
            unprinted = sum(self._print_marked(rel) for rel in marked)
            self.scan = {"files": files, "hashed_bytes": hashed, "seconds": round(time.perf_counter() - began, 3)}
            if unprinted:
                self.scan["marked_unprinted"] = unprinted
            self._scanned = True

    def _unseen(self, rel: str, glob: str, what: str) -> None:
        if glob_match(rel, self.trust_globs) or glob_match(glob, self.trust_globs):
            return
        self.unseen[rel] = (f"{rel} {what} when the run started, so what it holds is unknown and every command's "
                            f"output is taken to hold its text; make it readable, or trust it with --trust {glob!r}")

    def _scan_file(self, rel: str, st: os.stat_result, mark_sizes: set[int], marked: list[str]) -> int:
        path = os.path.join(self.root, rel)
        if glob_match(rel, self.untrusted_globs):
            why = f"{rel} matches the untrusted glob {glob_match(rel, self.untrusted_globs)!r} given with --untrusted"
        elif glob_match(rel, self.trust_globs):
            return 0
        elif _marked(path):
            marked.append(rel)
            return 0
        else:
            fd = os.open(path, _FLAGS)
            try:
                raw = os.read(fd, _HEAD)
            finally:
                os.close(fd)
            if len(raw) < _HEAD and not _under_not_marked(rel):  # read whole: its digest for the baseline
                self._known[rel] = (_sig(st), hashlib.sha256(raw).hexdigest())
            why = _start_html(rel) if looks_like_html(rel, raw.decode("utf-8", errors="replace")) else None
            if why is None:
                if st.st_size in mark_sizes and self._hash(rel, st) in self.marks:
                    marked.append(rel)
                return 0
        digest, size, data = _digest(path, MAX_PRINT_BYTES - self._printed)
        self._source(rel, why, digest, size)
        if data is None:
            self.files.add(rel)
            self.opaque[rel] = (f"{why}; at {size:,} bytes it is past the {MAX_PRINT_BYTES:,}-byte fingerprint "
                                "budget, so every command's output is taken to hold its text")
        else:
            self._printed += size
            self.add_source(rel, data.decode("utf-8", errors="replace"))
        return size

    def _source(self, rel: str, why: str, digest: str, size: int) -> None:
        self._why[rel] = why
        if size:  # an empty file holds no one's text
            self._digests.setdefault(digest, rel)

    def _print_marked(self, rel: str) -> int:
        """A file an earlier run marked: untrusted by its content; fingerprinted with what the budget has
        left after the start's own sources, never opaque (1 when it could not be fingerprinted)."""
        try:
            digest, size, data = _digest(os.path.join(self.root, rel), MAX_PRINT_BYTES - self._printed)
        except OSError:
            return 1
        self._source(rel, _earlier(rel, f"recorded by content in {self.marks.where()}, or xattr {XATTR}"),
                     digest, size)
        if data is None:
            return 1
        self._printed += size
        self.add_source(rel, data.decode("utf-8", errors="replace"))
        return 0

    def add_source(self, source: str, text: str) -> None:
        """An untrusted workspace file's text: its raw form and, for HTML, its readable text too."""
        self.files.add(source)
        self.prints.add(source, text)
        if looks_like_html(source, text):
            self.prints.add(source, html_to_text(text).text)

    # -- the taint's baseline, and after it ----------------------------------------------------------
    def _hash(self, rel: str, st: os.stat_result) -> str | None:
        """The file's sha256, cached by its signature (None when it cannot be read, or changed meanwhile)."""
        sig = _sig(st)
        if (known := self._known.get(rel)) is not None and known[0] == sig:
            return known[1]
        path = os.path.join(self.root, rel)
        try:
            digest = _digest(path, 0)[0]
            if _sig(os.lstat(path)) != sig:
                return None
        except OSError:
            return None
        self._known[rel] = (sig, digest)
        return digest

    def _state(self) -> dict[str, tuple[Sig, str | None]]:
        """Each markable file's signature and, up to BASELINE_BYTES, its sha256 (hashed once per change)."""
        return {rel: (_sig(st), self._hash(rel, st) if st.st_size <= BASELINE_BYTES else None)
                for rel, st in _walk(self.root, _not_marked)}

    def before_call(self, writes: bool, builtin: bool = True) -> None:
        """A call is about to run while the run is clean: if it may write and its result may taint the
        run, record the workspace first, so that what it wrote then counts as changed after the taint.
        A built-in tool's result taints only by a source's text (or a blind spot): in a workspace with
        neither, no walk is needed."""
        if self._at_taint is None:
            may_taint = not builtin or bool(self.prints) or self.blind() is not None
            self._before = self._state() if writes and may_taint else None

    def tainted(self) -> None:
        """The run is tainted from now on: the baseline is the workspace before the call that tainted it."""
        if self._at_taint is None:
            self._at_taint = self._before if self._before is not None else self._state()
            self._before = None

    def mark_changed(self) -> list[str]:
        """Mark the content of the files whose content changed since the taint (recorded outside the
        workspace, and the xattr): later runs in this workspace distrust that content wherever it is.
        Content that a file unchanged since the taint also holds (a copy of the user's own file) and
        empty files are not marked."""
        if self._at_taint is None:
            return []
        changed: list[tuple[str, os.stat_result, str]] = []
        kept: dict[int, list[tuple[str, os.stat_result]]] = {}  # size -> files unchanged since the taint
        for rel, st in _walk(self.root, _not_marked):
            base = self._at_taint.get(rel)
            if base is not None and base[0] == _sig(st):
                kept.setdefault(st.st_size, []).append((rel, st))
            elif st.st_size and (digest := self._hash(rel, st)) is not None:
                if base is not None and base[1] == digest:  # the same bytes (touch, chmod, a rebuild)
                    kept.setdefault(st.st_size, []).append((rel, st))
                else:
                    changed.append((rel, st, digest))
        marked: list[str] = []
        for rel, st, digest in changed:
            if (rel, digest) in self._marked or \
                    digest in {self._hash(r, s) for r, s in kept.get(st.st_size, [])}:
                continue
            self._marked.add((rel, digest))
            try:
                self.marks.add(digest, st.st_size)
            except OSError:
                pass  # the xattr still says it
            self._set_xattr(rel, st, digest)
            marked.append(rel)
        return marked

    def _set_xattr(self, rel: str, st: os.stat_result, digest: str) -> None:
        path = os.path.join(self.root, rel)
        try:
            os.setxattr(path, XATTR, b"1", follow_symlinks=False)
            now = os.lstat(path)
        except OSError:
            return
        if (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns):
            self._known[rel] = (_sig(now), digest)  # only its ctime moved: not hashed again

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"untrusted_globs": list(self.untrusted_globs), "trust_globs": list(self.trust_globs),
                               "marks": self.marks.where()}
        if self.scan:
            out["scan"] = dict(self.scan)
        if self.opaque:
            out["opaque"] = sorted(self.opaque)
        if self.unseen:
            out["unseen"] = sorted(self.unseen)
        return out


def _earlier(rel: str, where: str) -> str:
    return (f"{rel} was written from untrusted content by an earlier run ({where}); if it is yours, trust it "
            f"with --trust {rel!r}")


def _start_html(rel: str) -> str:
    return (f"{rel} is HTML that was in the workspace when the run started; if it is yours, trust it with "
            f"--trust {rel!r} (trust_globs= in Python)")
