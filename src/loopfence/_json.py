"""The one canonical JSON function: call keys, fingerprints and log ids all go through it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "fingerprint", "loads_object"]


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept as text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


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
