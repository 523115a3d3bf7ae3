"""Recognising an untrusted source's text in whatever a tool returns, through cheap transforms too.

A source is cut into shingles: hashes of each run of `SHINGLE` consecutive words, less those of
licence texts and notices found everywhere (`_boilerplate.txt.gz`). A result holding at least
`MATCH` shingles of one source (`SHINGLE + MATCH - 1` = 7 words in a row) carries text from it.

Words are normalised on both sides: case-folded and split at anything that is not a letter or a
digit (so `_`, `-`, tabs and punctuation all separate words: `sed 's/ /_/g'` changes nothing). A
result is also read without its lines' leading numbers (`cat -n`, `grep -n`, `awk '{print i": "$i}'`)
and without any number (a numbering may interleave them; the sources keep theirs: dropping them everywhere cost a fifth of the 8-word excerpts caught),
and as the transforms a command could apply would leave it, each undone: lines reversed
(`rev`), ROT13 of lower case or of both cases (`tr a-z n-za-m`, `tr A-Za-z N-ZA-Mn-za-m`), and runs
of base64, of hex (`xxd`, `xxd -p`, `hexdump -C`, `od -An -tx1`) and of `od -c` output decoded.
What is still open (text reworded by the model, other encodings, fragments under 7 words) is in the
README's list of blind spots.
"""

from __future__ import annotations

import binascii
import functools
import gzip
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Fingerprints", "shingles", "views", "SHINGLE", "MATCH"]

SHINGLE = 6  # words per shingle
MATCH = 2  # shingles of one source in one result
_CHUNK = 1 << 20  # characters shingled at a time: a large source never becomes one list of words
_WORD = re.compile(r"[^\W_]+")
_NUMBER = re.compile(r"(?<![^\W_])[0-9]+(?![^\W_])")  # a word that is a number (a numbering's)
_LEADING = re.compile(r"^[ \t]*[0-9]+[:.)]?[ \t]", re.M)  # a line's number (cat -n, nl, grep -n, awk)
_ROT_LOWER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "nopqrstuvwxyzabcdefghijklm")
_ROT13 = str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                       "nopqrstuvwxyzabcdefghijklmNOPQRSTUVWXYZABCDEFGHIJKLM")
_B64 = re.compile(r"[A-Za-z0-9+/=\r\n]{24,}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_OD = re.compile(r"[0-7]{7,}(?= |$)")
_OCTAL = re.compile(r"[0-7]{3}")  # an `od -c` byte (ASCII digits only: str.isdigit also takes `²` and `9`)
_OD_ESCAPES = {"\\0": b"\0", "\\a": b"\a", "\\b": b"\b", "\\f": b"\f", "\\n": b"\n", "\\r": b"\r",
               "\\t": b"\t", "\\v": b"\v", "\\\\": b"\\", "": b" ", "**": b""}
_UNREADABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
_MIN_DECODED = 16  # bytes: shorter decoded runs cannot hold 7 words


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _chunks(text: str) -> Iterator[list[str]]:
    """The words of `text`, a chunk of about _CHUNK characters at a time, cut at whitespace."""
    i, n = 0, len(text)
    while i < n:
        j = min(n, i + _CHUNK)
        if j < n:
            cut = max(text.rfind(" ", i, j), text.rfind("\n", i, j))
            j = cut if cut > i else j
        yield _words(text[i:j])
        i = j


def shingles(text: str) -> Iterator[set[int]]:
    """The shingles of `text`, a set per chunk (the last SHINGLE - 1 words carry over)."""
    tail: list[str] = []
    for chunk in _chunks(text):
        words = tail + chunk
        if len(words) >= SHINGLE:
            yield set(map(hash, zip(*(words[k:] for k in range(SHINGLE)))))
        tail = words[-(SHINGLE - 1):]


@functools.cache
def _boilerplate() -> frozenset[int]:
    """Shingles of text found everywhere (licence texts and notices): they say nothing of a source."""
    data = gzip.decompress((Path(__file__).with_name("_boilerplate.txt.gz")).read_bytes())
    return frozenset().union(*shingles(data.decode()))


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


# -- the transforms undone -------------------------------------------------------------------------
def views(content: str) -> list[str]:
    """`content` as the model reads it, and as each cheap transform a command could have applied
    would leave it once undone (see the module's docstring)."""
    text = _strings(content)
    return [text, _LEADING.sub("", text), _NUMBER.sub(" ", text), "\n".join(line[::-1] for line in text.split("\n")),
            text.translate(_ROT_LOWER), text.translate(_ROT13), *_decoded(text)]


def _decoded(text: str) -> Iterator[str]:
    """The runs each decoder finds. `match` reads every tool result once a source exists, so no
    decoder may end the run: one that fails on a line keeps what it had decoded before it."""
    for decode in (_base64_runs, _hex_runs, _od_runs):
        try:
            yield from decode(text)
        except Exception:  # noqa: BLE001, S112 - a decoder's bug must not crash the run it guards
            continue


def _readable(data: bytes) -> str | None:
    """Decoded bytes as text, when they read as text (nine in ten characters printable)."""
    if len(data) < _MIN_DECODED:
        return None
    text = data.decode("utf-8", errors="replace")
    return text if len(_UNREADABLE.findall(text)) * 10 <= len(text) else None


def _base64_runs(text: str) -> Iterator[str]:
    for m in _B64.finditer(text):
        run = "".join(m.group().split()).rstrip("=")
        for offset in range(4):  # a run cut out of a longer one may start mid-quantum
            part = run[offset:]
            part = part[:len(part) // 4 * 4]
            try:
                decoded = _readable(binascii.a2b_base64(part))
            except binascii.Error:
                continue
            if decoded is not None:
                yield decoded
                break


def _hex_runs(text: str) -> Iterator[str]:
    """Hex dumps: each line's leading offset (`00000010:`) dropped, then its hex groups up to the first
    token that is not one (the dump's own text column); consecutive lines are one run."""
    run: list[str] = []
    for line in [*text.split("\n"), ""]:
        tokens = line.split()
        if len(tokens) > 1 and (tokens[0].endswith(":") or len(tokens[0]) >= 6):
            tokens = tokens[1:]
        got = []
        for t in tokens:
            if not _HEX.fullmatch(t):
                break
            got.append(t)
        if got:
            run.extend(got)
            continue
        if run and (decoded := _readable(bytes.fromhex("".join(run)))) is not None:
            yield decoded
        run = []


def _od_runs(text: str) -> Iterator[str]:
    """`od -c`: after the octal offset, one character per 4-column field (a space is a blank field,
    `\\n` an escape, other bytes three octal digits, `**` the rest of a multi-byte character)."""
    run = bytearray()
    for line in [*text.split("\n"), ""]:
        m = _OD.match(line)
        if m is not None and len(line) > m.end():
            body = line[m.end():]
            for i in range(0, len(body), 4):
                field = body[i:i + 4].strip()
                if field in _OD_ESCAPES:
                    run += _OD_ESCAPES[field]
                elif _OCTAL.fullmatch(field):
                    run.append(int(field, 8) & 0xFF)
                else:
                    run += field.encode(errors="replace")  # (a lone surrogate from JSON too)
            continue
        if run and (decoded := _readable(bytes(run))) is not None:
            yield decoded
        run = bytearray()


# -- the store -------------------------------------------------------------------------------------
class Fingerprints:
    """Shingles of untrusted sources, by source name. Thread-safe."""

    def __init__(self) -> None:
        self._owner: dict[int, str] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._owner)

    def add(self, source: str, text: str) -> None:
        """All of `text`, however long (a chunk at a time)."""
        for found in shingles(text):
            found = found.difference(_boilerplate())  # (not -=: that walks the other set whole)
            with self._lock:
                self._owner.update(dict.fromkeys(found.difference(self._owner), source))

    def match(self, content: str) -> str | None:
        """The source whose text `content` carries (MATCH shingles or more), read as is or with a
        cheap transform undone; None when none does."""
        if not self._owner or not content:
            return None
        counts: dict[str, int] = {}
        seen: set[int] = set()
        for view in views(content):
            for found in shingles(view):
                for h in found - seen:
                    src = self._owner.get(h)
                    if src is not None:
                        counts[src] = counts.get(src, 0) + 1
                        if counts[src] >= MATCH:
                            return src
                seen |= found
        return None
