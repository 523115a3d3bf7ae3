"""Unified diffs: parse, then apply every hunk in memory; the caller writes only if all of them fit.

A hunk that does not match is a `PatchError` that shows where: the line it expected to start at,
the first line that differs, what the patch expected there and what the file has.
Hunk bodies are read by their lines (like `git apply --recount`), not only by the header counts,
because models often get the counts wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FilePatch", "Hunk", "PatchError", "parse_patch", "apply_file_patch", "DEV_NULL"]

DEV_NULL = "/dev/null"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_SHOW = 6  # lines of context shown in a failure


@dataclass(frozen=True, slots=True)
class PatchError:
    """Why the patch was not applied (nothing was written). `to_dict()` is the model-visible result."""

    error: str  # invalid_patch | hunk_failed | file_exists | missing_file
    message: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": False, "error": self.error, "message": self.message, **self.fields,
                "changed": "nothing: a patch applies all of its hunks or none"}


@dataclass(slots=True)
class Hunk:
    old_start: int
    new_start: int
    lines: list[tuple[str, str]]  # (" " | "-" | "+", text without line ending)
    at_line: int  # line number of the @@ header inside the patch
    old_no_eol: bool = False  # "\ No newline at end of file" after an old-side line
    new_no_eol: bool = False

    @property
    def old(self) -> list[str]:
        return [t for op, t in self.lines if op in " -"]

    @property
    def new(self) -> list[str]:
        return [t for op, t in self.lines if op in " +"]


@dataclass(slots=True)
class FilePatch:
    old_path: str
    new_path: str
    hunks: list[Hunk]

    @property
    def path(self) -> str:
        return self.old_path if self.new_path == DEV_NULL else self.new_path

    @property
    def creates(self) -> bool:
        return self.old_path == DEV_NULL

    @property
    def deletes(self) -> bool:
        return self.new_path == DEV_NULL


def parse_patch(text: str) -> list[FilePatch] | PatchError:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _path(line[4:]), _path(lines[i + 1].rstrip("\r")[4:])
            old, new = _strip_prefixes(old, new)
            files.append(FilePatch(old, new, []))
            i += 2
            continue
        if line.startswith("@@"):
            if not files:
                return _invalid(i, "a hunk (@@) before any file header ('--- a/path' then '+++ b/path')")
            hunk_or_error = _read_hunk(lines, i)
            if isinstance(hunk_or_error, PatchError):
                return hunk_or_error
            hunk, i = hunk_or_error
            files[-1].hunks.append(hunk)
            continue
        i += 1  # "diff --git", "index ...", commentary: ignored
    if not files:
        return PatchError("invalid_patch", "no file headers found: a unified diff needs '--- a/path' and "
                          "'+++ b/path' lines, then '@@ -l,n +l,n @@' hunks")
    for fp in files:
        if not fp.hunks:
            return PatchError("invalid_patch", f"no hunks for {fp.path}", {"path": fp.path})
        if fp.creates and fp.deletes:
            return PatchError("invalid_patch", "both sides are /dev/null")
    return files


def _path(raw: str) -> str:
    raw = raw.split("\t", 1)[0].strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1]
    return raw


def _strip_prefixes(old: str, new: str) -> tuple[str, str]:
    """git's a/ and b/ prefixes (when the sides use them as a pair, or against /dev/null)."""
    a_ok = old.startswith("a/") or old == DEV_NULL
    b_ok = new.startswith("b/") or new == DEV_NULL
    if a_ok and b_ok:
        return (old if old == DEV_NULL else old[2:]), (new if new == DEV_NULL else new[2:])
    return old, new


def _read_hunk(lines: list[str], i: int) -> tuple[Hunk, int] | PatchError:
    m = _HUNK.match(lines[i])
    if not m:
        return _invalid(i, f"malformed hunk header {lines[i][:80]!r}; expected '@@ -start,count +start,count @@'")
    old_count = int(m.group(2)) if m.group(2) is not None else 1
    new_count = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(int(m.group(1)), int(m.group(3)), [], i + 1)
    j = i + 1
    while j < len(lines):
        raw = lines[j].rstrip("\r")
        if raw.startswith("@@") or (raw.startswith("--- ") and j + 1 < len(lines)
                                   and lines[j + 1].startswith("+++ ")):
            break
        if raw.startswith("\\"):
            if hunk.lines and hunk.lines[-1][0] in " -":
                hunk.old_no_eol = True
            if hunk.lines and hunk.lines[-1][0] in " +":
                hunk.new_no_eol = True
        elif raw == "":
            hunk.lines.append((" ", ""))  # a context line whose trailing space was stripped
        elif raw[0] in " -+":
            hunk.lines.append((raw[0], raw[1:]))
        else:
            break
        j += 1
    # blank lines past the header's counts are separators, not context
    while hunk.lines and hunk.lines[-1] == (" ", "") and \
            (len(hunk.old) > old_count or len(hunk.new) > new_count):
        hunk.lines.pop()
    if not hunk.lines:
        return _invalid(i, "empty hunk")
    return hunk, j


def _invalid(i: int, why: str) -> PatchError:
    return PatchError("invalid_patch", f"patch line {i + 1}: {why}", {"patch_line": i + 1})


def apply_file_patch(fp: FilePatch, old_text: str | None) -> str | None | PatchError:
    """The new text (None = the file is deleted), or where a hunk fails. Pure: no disk access."""
    if fp.creates:
        if old_text is not None:
            return PatchError("file_exists", f"the patch creates {fp.path}, but it already exists",
                              {"path": fp.path})
        old_text = ""
    elif old_text is None:
        return PatchError("missing_file", f"the patch changes {fp.path}, which does not exist",
                          {"path": fp.path})
    lines = old_text.splitlines(keepends=True)
    eol = "\r\n" if sum(ln.endswith("\r\n") for ln in lines) * 2 > len(lines) else "\n"
    had_final_eol = not lines or lines[-1].endswith("\n")
    bare = [ln.rstrip("\r\n") for ln in lines]
    out: list[str] = []
    pos = 0  # next unconsumed line of the old file
    for n, hunk in enumerate(fp.hunks, 1):
        want = hunk.old
        expected = max(hunk.old_start - 1, 0) if want else min(hunk.old_start, len(bare))
        at = _find(bare, want, expected, pos)
        if at is None:
            return _hunk_failed(fp, n, hunk, bare, max(expected, pos))
        out.extend(lines[pos:at])
        if out and hunk.new and not out[-1].endswith("\n"):
            out[-1] += eol  # lines now follow what used to be the last line
        end = at + len(want)
        at_eof = end == len(bare)
        new = hunk.new
        for k, text in enumerate(new):
            last = at_eof and k == len(new) - 1
            if last and (hunk.new_no_eol or (not hunk.old_no_eol and not had_final_eol)):
                out.append(text)
            else:
                out.append(text + eol)
        pos = end
    out.extend(lines[pos:])
    if fp.deletes:
        remaining = "".join(out)
        if remaining.strip():
            return PatchError("hunk_failed", f"the patch deletes {fp.path}, but lines would remain",
                              {"path": fp.path})
        return None
    return "".join(out)


def _find(bare: list[str], want: list[str], expected: int, floor: int) -> int | None:
    """The match nearest `expected` at or after `floor`; exact first, then ignoring trailing spaces."""
    last = len(bare) - len(want)
    if last < floor:
        return None
    expected = min(max(expected, floor), last)
    for same in (lambda a, b: a == b, lambda a, b: a.rstrip() == b.rstrip()):
        for d in range(0, max(expected - floor, last - expected) + 1):
            for at in (expected - d, expected + d):
                if floor <= at <= last and all(same(bare[at + k], w) for k, w in enumerate(want)):
                    return at
    return None


def _hunk_failed(fp: FilePatch, n: int, hunk: Hunk, bare: list[str], at: int) -> PatchError:
    want = hunk.old
    first_bad = next((k for k, w in enumerate(want) if at + k >= len(bare) or bare[at + k] != w), 0)
    line = at + first_bad + 1
    lo = max(at + first_bad - 2, 0)
    found = [f"{k + 1}: {bare[k]}" for k in range(lo, min(lo + _SHOW, len(bare)))]
    message = (f"hunk {n} of {len(fp.hunks)} for {fp.path} does not match the file: at line {line} it "
               f"expected {want[first_bad]!r}" if first_bad < len(want) else f"hunk {n} does not fit")
    if first_bad < len(want):
        message += f" but found {bare[line - 1]!r}" if line - 1 < len(bare) else " but the file ends first"
    return PatchError("hunk_failed", message + " (searched the whole file; no place matches)", {
        "path": fp.path, "hunk": n, "hunks": len(fp.hunks), "hunk_header_line": hunk.at_line,
        "expected_at_line": line, "expected": want[first_bad: first_bad + _SHOW], "found": found,
        "hint": "read_file the current text, then make the patch from it"})
