"""The one canonical JSON function: call keys, fingerprints and log ids all go through it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["canonical_json", "fingerprint", "loads_object", "load_json_items", "JsonFileError"]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept as text."""
    return _CANONICAL.encode(value)


def fingerprint(value: Any) -> str:
    """A short stable digest: strings are hashed as-is, anything else via canonical_json."""
    text = value if isinstance(value, str) else canonical_json(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_STRICT = json.JSONDecoder(parse_constant=_bad_constant)  # built once: a decoder per call costs more


def loads_object(text: str) -> Any:
    """json.loads that refuses NaN/Infinity (not JSON) so a parse means a real JSON value."""
    return _STRICT.decode(text)


class JsonFileError(ValueError):
    """A JSON/JSONL input file that cannot be used; the message names the file and the line."""


def load_json_items(path: str | Path, check: Callable[[Any], None], what: str = "file") -> list[Any]:
    """Items of a JSON array or a JSONL file (one value per line, blank lines skipped), each passed
    to `check` (which raises ValueError) in file order; the first problem is raised as
    JsonFileError("FILE:LINE: why")."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JsonFileError(f"{p}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JsonFileError(f"{p}: cannot read {what}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise JsonFileError(f"{p}: {what} is empty")
    if text.lstrip().startswith("["):
        try:
            numbered = list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as exc:
            raise JsonFileError(f"{p}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    else:
        numbered = ((n, _parse_line(p, n, line)) for n, line in enumerate(text.splitlines(), 1)
                    if line.strip())
    items = []
    for n, value in numbered:  # lazily parsed: the first problem in file order is the one reported
        try:
            check(value)
        except ValueError as exc:
            raise JsonFileError(f"{p}:{n}: {exc}") from None
        items.append(value)
    return items


def _parse_line(p: Path, n: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{p}:{n}: not valid JSON: {exc.msg}") from None
