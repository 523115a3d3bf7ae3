"""Where untrusted text is, and how to recognise it whichever tool carries it.

Taint follows the content, not the tool: `cat page.html` through the shell, a failing patch that
quotes the page's lines, or a copy of the page under another name must taint the run just as
`read_file page.html` does. Two things make that work:

- **Fingerprints.** Every untrusted source (HTML pages and `untrusted_globs` matches that were in the
  workspace when the run started, files marked untrusted by an earlier run, and every result a tool
  flagged untrusted) is cut into shingles: hashes of each run of `SHINGLE` consecutive words
  (case-folded, punctuation and markup ignored), less those of licence texts and notices that
  appear everywhere (`_boilerplate.txt.gz`). A tool result holding at least `MATCH` shingles of
  one source (`SHINGLE + MATCH - 1` = 7 words in a row) carries text from it. Measured with 291 HTML
  pages of /usr/share/doc fingerprinted (bench/taint_threshold.py, tests/data/taint-threshold.md): a random excerpt of the
  page text is caught at 8 words 84%, 10 words 93%, 15 words 99%; 1 of this repository's 142 source
  files matched some page; Python's own sources matched the Python and Node docs they are documented
  in (238 of 2,174), which is the rule working: those pages hold that text. 8-word shingles would
  halve those matches but catch a 10-word excerpt only 72% of the time: a missed taint is the worse
  error, and a refusal names the file and the `--trust` flag.
- **Provenance.** HTML that was in the workspace when the run started is untrusted unless a
  `trust_globs` pattern covers it; files the run itself created or changed carry the trust of what
  made them: those changed before the run was tainted are trusted (a docs build's HTML), those
  changed after it are untrusted, and are marked so for later runs (xattr `user.loopfence.untrusted`).

What it cannot see: text reworded by the model, fragments shorter than 7 words, files beyond the scan
budget (`MAX_SCAN_FILES`, `MAX_SCAN_BYTES`) unless a tool reads them, and content that never enters
a tool result (a command that acts on a page without printing it).
"""

from __future__ import annotations

import fnmatch
import functools
import gzip
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ._html import html_to_text, looks_like_html

__all__ = ["Fingerprints", "Provenance", "glob_match", "XATTR", "SHINGLE", "MATCH"]

SHINGLE = 6  # words per shingle
MATCH = 2  # shingles of one source in one result
XATTR = "user.loopfence.untrusted"
MAX_SCAN_FILES = 20_000
MAX_SCAN_BYTES = 64 << 20
MAX_SOURCE_BYTES = 4 << 20
_WORD = re.compile(r"\w+")
_SKIP_DIRS = {".git", ".hg", ".svn"}


def glob_match(rel: str, patterns: Iterable[str]) -> str | None:
    """The first workspace-relative posix glob matching `rel` (`**/` may also match no folder)."""
    for pat in patterns:
        if fnmatch.fnmatchcase(rel, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(rel, pat[3:])):
            return pat
    return None


def _shingles(text: str) -> set[int]:
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i:i + SHINGLE])) for i in range(len(words) - SHINGLE + 1)}


@functools.cache
def _boilerplate() -> frozenset[int]:
    """Shingles of text found everywhere (licence texts and notices): they say nothing of a source."""
    data = gzip.decompress((Path(__file__).with_name("_boilerplate.txt.gz")).read_bytes())
    return frozenset(_shingles(data.decode()))


def _strings(content: str) -> str:
    """A result's text as the model reads it: JSON results' strings, unescaped, one per line."""
    if content[:1] not in "{[":
        return content
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):
        return content
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return "\n".join(out)


class Fingerprints:
    """Shingles of untrusted sources, by source name. Thread-safe."""

    def __init__(self) -> None:
        self._owner: dict[int, str] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._owner)

    def add(self, source: str, text: str) -> None:
        found = _shingles(text) - _boilerplate()
        with self._lock:
            for h in found:
                self._owner.setdefault(h, source)

    def match(self, content: str) -> str | None:
        """The source whose text `content` carries (MATCH shingles or more), or None."""
        if not self._owner or not content:
            return None
        counts: dict[str, int] = {}
        for h in _shingles(_strings(content)):
            src = self._owner.get(h)
            if src is not None:
                counts[src] = counts.get(src, 0) + 1
                if counts[src] >= MATCH:
                    return src
        return None


class Provenance:
    """One workspace's untrusted files and fingerprints, for the file tools and the gate."""

    def __init__(self, root: str | os.PathLike[str], untrusted_globs: Iterable[str] = (),
                 trust_globs: Iterable[str] = ()) -> None:
        self.root = Path(root)
        self.untrusted_globs = tuple(untrusted_globs)
        self.trust_globs = tuple(trust_globs)
        self.start_ns = time.time_ns()
        self.tainted_ns: int | None = None
        self.prints = Fingerprints()
        self.files: set[str] = set()  # workspace files among the sources
        self.scan_note = ""
        self._scanned = False
        self._lock = threading.Lock()

    # -- what a file is ----------------------------------------------------------------------------
    def file_untrusted(self, rel: str, st: os.stat_result | None, text: str = "") -> str | None:
        """Why the file at `rel` is untrusted (a sentence naming the fix), or None when it is trusted."""
        if pat := glob_match(rel, self.untrusted_globs):
            return f"{rel} matches the untrusted glob {pat!r} given with --untrusted"
        if glob_match(rel, self.trust_globs):
            return None
        if st is not None and _marked(self.root / rel):
            return (f"{rel} was written from untrusted content by an earlier run (xattr {XATTR}); "
                    f"if it is yours, trust it with --trust {rel!r}")
        changed = st is not None and st.st_ctime_ns >= self.start_ns
        if changed:
            if self.tainted_ns is not None and st.st_ctime_ns >= self.tainted_ns:
                return f"{rel} was changed after untrusted content entered the run"
            return None  # made by this run before any taint: it has the trust of what made it
        if looks_like_html(rel, text):
            return (f"{rel} is HTML that was in the workspace when the run started; if it is yours, trust "
                    f"it with --trust {rel!r} (trust_globs= in Python)")
        return None

    def explain(self, rel: str) -> str:
        """Why a workspace file is an untrusted source, naming the flag that changes it."""
        path = self.root / rel
        try:
            st: os.stat_result | None = os.stat(path, follow_symlinks=False)
            with open(path, "rb") as fh:
                head = fh.read(65536).decode("utf-8", errors="replace")
        except OSError:
            st, head = None, ""
        return self.file_untrusted(rel, st, head) or f"{rel} is untrusted"

    # -- the scan ----------------------------------------------------------------------------------
    def ensure_scanned(self) -> None:
        """Fingerprint the untrusted files that were in the workspace at the start (once, bounded)."""
        with self._lock:
            if self._scanned:
                return
            self._scanned = True
        files = read = 0
        stack = [self.root]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                files += 1
                if files > MAX_SCAN_FILES or read > MAX_SCAN_BYTES:
                    self.scan_note = (f"scan stopped at {MAX_SCAN_FILES:,} entries / {MAX_SCAN_BYTES:,} bytes: "
                                      "files beyond it are judged when a tool reads them")
                    return
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in _SKIP_DIRS:
                            stack.append(Path(entry.path))
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    read += self._scan_file(Path(entry.path), entry.stat(follow_symlinks=False))
                except OSError:
                    continue

    def _scan_file(self, path: Path, st: os.stat_result) -> int:
        rel = path.relative_to(self.root).as_posix()
        with open(path, "rb") as fh:
            head = fh.read(65536).decode("utf-8", errors="replace")
            if self.file_untrusted(rel, st, head) is None:
                return len(head)
            data = head.encode() + fh.read(MAX_SOURCE_BYTES)
        text = data.decode("utf-8", errors="replace")
        self.add_source(rel, text)
        return len(data)

    def add_source(self, source: str, text: str) -> None:
        """An untrusted workspace file's text: its raw form and, for HTML, its readable text too."""
        self.files.add(source)
        self.prints.add(source, text)
        if looks_like_html(source, text):
            self.prints.add(source, html_to_text(text).text)

    # -- after a taint -----------------------------------------------------------------------------
    def tainted(self) -> None:
        if self.tainted_ns is None:
            self.tainted_ns = time.time_ns()

    def mark_changed(self) -> list[str]:
        """Mark (xattr) and fingerprint the files changed since the taint: later runs distrust them."""
        if self.tainted_ns is None:
            return []
        marked: list[str] = []
        seen = 0
        stack = [self.root]
        while stack and seen < MAX_SCAN_FILES:
            try:
                entries = list(os.scandir(stack.pop()))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in _SKIP_DIRS:
                            stack.append(Path(entry.path))
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode) or st.st_ctime_ns < self.tainted_ns:
                        continue
                    if not _marked(Path(entry.path)):
                        os.setxattr(entry.path, XATTR, b"1", follow_symlinks=False)
                        marked.append(Path(entry.path).relative_to(self.root).as_posix())
                except OSError:
                    continue
        return marked

    def describe(self) -> dict[str, Any]:
        return {"untrusted_globs": list(self.untrusted_globs), "trust_globs": list(self.trust_globs),
                **({"scan": self.scan_note} if self.scan_note else {})}


def _marked(path: Path) -> bool:
    try:
        return XATTR in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False
