"""The file tools' bodies: read_file, list_dir, write_file, apply_patch, all behind the Jail.

Every outcome is a value: text, `ToolOutput` (untrusted text) or a `{"ok": false, "error": ...}` dict
the model can act on. Nothing here raises for a bad path, a missing file or a bad page. Paths in
results are relative to the workspace root: no result names the host's absolute path.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any

from ._executor import ToolOutput
from ._html import html_to_text, looks_like_html
from ._patch import DEV_NULL, FilePatch, PatchError, apply_file_patch, parse_patch
from ._pathguard import HardLinked, Jail, Located, Refusal
from ._provenance import Provenance, glob_match

__all__ = ["FileTools", "FileOptions"]

_HARDLINK_HINT = "only the user can allow hard-linked files; do not retry"


@dataclass(frozen=True, slots=True)
class FileOptions:
    page_chars: int = 4_000
    list_cap: int = 1_000  # entries shown by list_dir
    max_read_bytes: int = 32 << 20
    max_write_bytes: int = 16 << 20
    untrusted_globs: tuple[str, ...] = ()


class FileTools:
    def __init__(self, jail: Jail, options: FileOptions, provenance: Provenance | None = None) -> None:
        if options.page_chars < 1:
            raise ValueError("page_chars must be at least 1")
        self.jail = jail
        self.opt = options
        self.provenance = provenance or Provenance(jail.root, options.untrusted_globs)

    def untrusted(self, rel: str) -> bool:
        """Workspace-relative posix path against the untrusted globs (`**` may also match nothing)."""
        return glob_match(rel, self.opt.untrusted_globs) is not None

    # ------------------------------------------------------------------ read_file
    def read_file(self, path: str, page: int, encoding: str) -> Any:
        loc = self._existing(path, "file")
        if isinstance(loc, dict):
            return loc
        try:
            codecs.lookup(encoding)
        except LookupError:
            return _fail("invalid_value", path, f"unknown encoding {encoding!r}", hint="use encoding=\"utf-8\"")
        try:
            data = self.jail.read_bytes(loc, self.opt.max_read_bytes)
        except HardLinked as exc:
            return _fail("hardlinked_file", path, str(exc), hint=_HARDLINK_HINT)
        except ValueError as exc:
            return _fail("file_too_large", path, str(exc))
        except OSError as exc:
            return _fail("io_error", path, f"cannot read {loc.rel}: {self._why(exc)}")
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as exc:
            return _fail("decode_error", path, f"{loc.rel} is not valid {encoding} (byte {exc.start})",
                         hint="if it is text, try encoding=\"latin-1\"")
        if "\x00" in text and codecs.lookup(encoding).name in ("utf-8", "ascii", "latin-1", "iso8859-1"):
            return _fail("binary_file", path, f"{loc.rel} is binary ({len(data):,} bytes), not text")
        untrusted = self._distrust(loc, data, text)
        if looks_like_html(loc.name, text):
            text = html_to_text(text).render()
        return self._page(path, loc, text, page, untrusted=untrusted)

    def _distrust(self, loc: Located, data: bytes, text: str) -> bool:
        """Is this file's content untrusted? By provenance (see _provenance); its raw text is then
        fingerprinted, so the same text through another tool taints too."""
        if self.provenance.file_untrusted(loc.rel, data) is None:
            return False
        self.provenance.add_source(loc.rel, text)
        return True

    def _page(self, path: str, loc: Located, text: str, page: int, untrusted: bool) -> Any:
        size = self.opt.page_chars
        pages = max(1, -(-len(text) // size))
        if page < 1 or page > pages:
            return _fail("page_out_of_range", path, f"page {page} does not exist: {loc.rel} has {pages} "
                         f"page{'s' if pages != 1 else ''} of up to {size:,} characters (pages 1 to {pages})",
                         page=page, pages=pages)
        chunk = text[(page - 1) * size: page * size]
        if page == pages:
            marker = f"[page {page} of {pages}: end of file]"
        else:
            marker = f"[page {page} of {pages}: call read_file with page={page + 1} for more]"
        body = f"{chunk}\n{marker}" if chunk else marker
        return ToolOutput(body, untrusted=True) if untrusted else body

    # ------------------------------------------------------------------ list_dir
    def list_dir(self, path: str) -> Any:
        loc = self._existing(path, "dir")
        if isinstance(loc, dict):
            return loc
        if loc.kind != "dir":
            return _fail("not_a_directory", path, f"{loc.rel} is a file", hint="call read_file for files")
        try:
            entries = self.jail.entries(loc)
        except OSError as exc:
            return _fail("io_error", path, f"cannot list {loc.rel}: {self._why(exc)}")
        marks = {"dir": "/", "symlink": "@", "special": " (special file)", "file": ""}
        lines = [e.name + marks[e.kind] for e in entries[: self.opt.list_cap]]
        head = f"[folder {loc.rel}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}; folders end with /]"
        if len(entries) > self.opt.list_cap:
            lines.append(f"[truncated: {len(entries):,} entries, showing the first {self.opt.list_cap:,}]")
        return "\n".join([head, *lines]) if entries else f"[folder {loc.rel}: empty]"

    # ------------------------------------------------------------------ write_file
    def write_file(self, path: str, content: str) -> dict[str, Any]:
        loc = self.jail.locate(path)
        if isinstance(loc, Refusal):
            return loc.to_dict()
        if loc.kind == "dir":
            return _fail("is_a_directory", path, f"{loc.rel} is a folder", hint="write to a file path inside it")
        data = content.encode("utf-8", errors="surrogatepass")
        if len(data) > self.opt.max_write_bytes:
            return _fail("content_too_large", path, f"{len(data):,} bytes is over the "
                         f"{self.opt.max_write_bytes:,}-byte limit")
        try:
            created = self.jail.write_bytes(loc, data)
        except OSError as exc:
            return _fail("io_error", path, f"cannot write {loc.rel}: {self._why(exc)}")
        self.provenance.wrote(loc.rel, data)
        return {"ok": True, "path": loc.rel, "bytes_written": len(data), "created": created}

    # ------------------------------------------------------------------ apply_patch
    def apply_patch(self, patch: str) -> dict[str, Any]:
        parsed = parse_patch(patch)
        if isinstance(parsed, PatchError):
            return parsed.to_dict()
        texts: dict[tuple[str, ...], tuple[Located, str | None]] = {}  # planned state by canonical path
        originals: dict[tuple[str, ...], str | None] = {}
        report = []
        for fp in parsed:
            if not fp.creates and not fp.deletes and fp.old_path != fp.new_path:
                return PatchError("invalid_patch", f"renames are not supported ({fp.old_path} -> "
                                  f"{fp.new_path}); use write_file", {"path": fp.path}).to_dict()
            loc = self.jail.locate(fp.path)
            if isinstance(loc, Refusal):
                return {**loc.to_dict(), "changed": "nothing: a patch applies all of its hunks or none"}
            if loc.kind == "dir":
                return PatchError("is_a_directory", f"{loc.rel} is a folder", {"path": fp.path}).to_dict()
            if loc.kind == "missing" and not fp.creates and loc.parts not in texts:
                return {**self.jail.missing(fp.path, loc), "changed": "nothing: a patch applies all of "
                        "its hunks or none"}
            if loc.parts not in texts:
                old = self._patch_source(fp.path, loc)
                if isinstance(old, dict):
                    return old
                texts[loc.parts] = (loc, old)
                originals[loc.parts] = old
            new = apply_file_patch(fp, texts[loc.parts][1])
            if isinstance(new, PatchError):
                return new.to_dict()
            texts[loc.parts] = (loc, new)
            report.append(_summary(fp, loc))
        problem = self._commit(texts, originals)
        return problem or {"ok": True, "files": report}

    def _patch_source(self, path: str, loc: Located) -> str | None | dict[str, Any]:
        if loc.kind == "missing":
            return None
        try:
            return self.jail.read_bytes(loc, self.opt.max_read_bytes).decode("utf-8")
        except HardLinked as exc:
            return PatchError("hardlinked_file", str(exc), {"path": path, "hint": _HARDLINK_HINT}).to_dict()
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            return PatchError("io_error", f"cannot read {loc.rel} as UTF-8 text: {self._why(exc)}",
                              {"path": path}).to_dict()

    def _commit(self, texts: dict[tuple[str, ...], tuple[Located, str | None]],
                originals: dict[tuple[str, ...], str | None]) -> dict[str, Any] | None:
        """Write every planned file; on an OS error put back the ones already written."""
        done: list[tuple[str, ...]] = []
        try:
            for key, (loc, text) in texts.items():
                if text == originals[key]:
                    continue
                self._put(loc, text)
                done.append(key)
        except OSError as exc:
            for key in reversed(done):
                try:
                    self._put(texts[key][0], originals[key])
                except OSError:
                    pass
            return {"ok": False, "error": "io_error", "message": f"writing failed ({self._why(exc)}); the files "
                    "already written were restored", "changed": "nothing (restored)"}
        return None

    def _put(self, loc: Located, text: str | None) -> None:
        if text is None:
            try:
                self.jail.delete(loc)
            except FileNotFoundError:
                pass
        else:
            self.jail.write_bytes(loc, text.encode("utf-8", "surrogatepass"))

    # ------------------------------------------------------------------ shared
    def _why(self, exc: BaseException) -> str:
        """An error in words, with no absolute host path: the OS's reason (its file name is a
        component or the root), else the message with the root spelled "."."""
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
        return str(exc).replace(str(self.jail.root), ".")

    def _existing(self, path: str, want: str) -> Located | dict[str, Any]:
        loc = self.jail.locate(path)
        if isinstance(loc, Refusal):
            return loc.to_dict()
        if loc.kind == "missing":
            return self.jail.missing(path, loc, want)
        if loc.kind == "dir" and want == "file":
            return _fail("is_a_directory", path, f"{loc.rel} is a folder", hint="call list_dir for folders")
        return loc


def _summary(fp: FilePatch, loc: Located) -> dict[str, Any]:
    added = sum(op == "+" for h in fp.hunks for op, _ in h.lines)
    removed = sum(op == "-" for h in fp.hunks for op, _ in h.lines)
    action = "created" if fp.old_path == DEV_NULL else "deleted" if fp.new_path == DEV_NULL else "modified"
    return {"path": loc.rel, "action": action, "hunks": len(fp.hunks), "added": added, "removed": removed}


def _fail(error: str, path: str, message: str, **fields: Any) -> dict[str, Any]:
    return {"ok": False, "error": error, "path": path, "message": message, **fields}
