"""The one canonical JSON module: call keys, fingerprints and log ids, and every JSON boundary.

Reading is bounded everywhere (`loads`): nesting deeper than MAX_DEPTH levels (a log line:
MAX_LOG_DEPTH, room for the event around an input) or an integer longer than MAX_INT_DIGITS digits
is a JsonLimitError (a json.JSONDecodeError naming the limit), never a RecursionError or a traceback;
files are read through `read_bounded` (at most MAX_INPUT_BYTES; a device or a pipe too).
Writing (`dumps`) always gives text that encodes as UTF-8: a lone surrogate ("\\ud800" is valid
JSON) is written as its JSON escape, so it reads back as the same string (`loggable` joins the
surrogate pairs JSON cannot tell from the character they encode).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

try:  # the fast paths (pydantic's own serializer and parser, compiled); the stdlib's when refused or absent
    from pydantic_core import from_json as _fast_parse
    from pydantic_core import to_json as _fast_json
except ImportError:  # pragma: no cover - pydantic is a dependency
    _fast_json = _fast_parse = None

__all__ = ["canonical_json", "fingerprint", "loads", "loads_at", "loads_object", "dumps", "wire_body", "Encoded", "line", "loggable",
           "depth", "check_depth", "read_bounded", "load_json_items", "json_items", "JsonFileError", "JsonLimitError",
           "MAX_DEPTH", "MAX_LOG_DEPTH", "MAX_INT_DIGITS", "MAX_INPUT_BYTES"]

MAX_DEPTH = 200  # nesting levels of any JSON input (a script, a scenario, an HTTP body, a reply)
MAX_LOG_DEPTH = MAX_DEPTH + 16  # a log line: an input value, wrapped in the event that records it
MAX_INT_DIGITS = 1_000  # digits of one integer (Python refuses past 4,300, and slowly)
MAX_INPUT_BYTES = 32 << 20  # a script, reply-form or scenario file

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
_PLAIN = json.JSONEncoder(ensure_ascii=False, default=str)  # built once: json.dumps builds one per call
_COMPACT = json.JSONEncoder(ensure_ascii=False, default=str, separators=(",", ":"))
_WIRE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)  # as httpx's json=


def _reused(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """`encoder.encode`, with the stdlib's C encoder built once rather than on every call (half the
    time of a small message). It skips the circular-reference check; whatever it raises (a cycle
    ends in RecursionError) is encoded again by `encoder` itself, which raises as json.dumps does."""
    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        fast = make(None, encoder.default, json.encoder.encode_basestring, None, encoder.key_separator,
                    encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)
    except Exception:  # noqa: BLE001 - pragma: no cover - no C encoder, or another signature
        return encoder.encode

    def encode(value: Any) -> str:
        try:
            return "".join(fast(value, 0))
        except Exception:  # noqa: BLE001 - the full encoder raises (or writes) it as the stdlib does
            return encoder.encode(value)
    return encode


_canonical = _reused(_CANONICAL)
_plain = _reused(_PLAIN)
_SURROGATE = re.compile("[\ud800-\udfff]")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[{]|[\]}]', re.S)


class JsonLimitError(json.JSONDecodeError):
    """JSON that is over a limit (nesting depth, integer length): `msg` names the limit and value."""

    def __init__(self, msg: str, doc: str = "", pos: int = 0) -> None:
        ValueError.__init__(self, msg)  # no "line 1 column 1": the limit has no position
        self.msg, self.doc, self.pos, self.lineno, self.colno = msg, doc, pos, 1, 1


class JsonFileError(ValueError):
    """A JSON/JSONL input file that cannot be used; the message names the file and the line."""


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept as text; numbers as RFC 8785 has them: an integral
    float is its integer (`30.0` and `30` are one key: a float annotation or a server that sends
    floats must not make the same call look new)."""
    text = _canonical(value)
    # An integral float within 2**53 always prints with ".0" (repr switches to exponents at 1e16):
    # without that substring there is nothing to rewrite (the usual case: one C-speed scan).
    return text if ".0" not in text else _canonical(_numbers(value))


_EXACT = float(2 ** 53)  # beyond it a float may not equal the integer it prints as


def _numbers(value: Any) -> Any:
    """`value` with integral floats as ints; containers copied only when something changed."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and -_EXACT <= value <= _EXACT else value
    if isinstance(value, dict):
        out = {k: _numbers(v) for k, v in value.items()}
        return out if any(out[k] is not value[k] for k in out) else value
    if isinstance(value, (list, tuple)):
        items = [_numbers(v) for v in value]
        return items if any(a is not b for a, b in zip(items, value)) else value
    return value


def fingerprint(value: Any) -> str:
    """A short stable digest: strings are hashed as-is, anything else via canonical_json."""
    text = value if isinstance(value, str) else canonical_json(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """JSON text that always encodes as UTF-8: lone surrogates are written as \\uXXXX escapes."""
    text = _plain(value) if indent is None and not sort_keys else \
        json.dumps(value, ensure_ascii=False, default=str, indent=indent, sort_keys=sort_keys)
    return _escape_surrogates(text)


class Encoded(list):  # type: ignore[type-arg]
    """A JSON array that keeps its items' wire bytes: `parts[i]` is `wire_body(self[i])` once written
    (None until then) for the first `len(parts)` items, the others are written each time. An object
    holding one is written by `wire_body` joining those bytes, so a conversation sent again and again
    (a proxy's upstream gets the whole history each request) has each message written once. `parts` is
    filled in place: whoever keeps it (the proxy's reading of a conversation) has them next time."""

    def __init__(self, items: Any = (), parts: list[bytes | None] | None = None) -> None:
        super().__init__(items)
        self.parts = parts if parts is not None else []

    def written(self) -> int:
        """How many items at its start have their bytes kept (a search in C: a long conversation's every
        request has them all but its new messages)."""
        head = min(len(self.parts), len(self))
        try:
            return self.parts.index(None, 0, head)
        except ValueError:
            return head

    def pieces(self) -> list[bytes]:
        """The array's bytes in pieces (`wire_body` joins them once: a copy of a long conversation costs
        more than writing its few new messages), its items' parts written first where they are missing.
        The parts kept at its start are laid in by slicing, not item by item."""
        parts, first = self.parts, self.written()
        out: list[bytes] = [b","] * (2 * first) or [b"["]
        out[1::2] = cast("list[bytes]", parts[:first])  # [",", p0, ",", p1 ...]: the separators between them
        out[0] = b"["
        for i in range(first, len(self)):
            if i:
                out.append(b",")
            if i >= len(parts):
                out.append(wire_body(self[i]))
                continue
            part = parts[i]
            if part is None:
                part = parts[i] = wire_body(self[i])
            out.append(part)
        out.append(b"]")
        return out


def wire_body(value: Any) -> bytes:
    """An HTTP request's JSON body, as httpx's `json=` writes it (compact, UTF-8, NaN and infinities
    refused with ValueError), except that a lone surrogate (a reply or a tool result may hold one) is
    written as its JSON escape where httpx raises UnicodeEncodeError. pydantic-core's serializer writes
    it (a third of the stdlib's time: a proxy sends a whole conversation each request); what it refuses
    (a lone surrogate, a type JSON lacks), or a body where it may have written NaN or an infinity, the
    stdlib writes (or refuses) as before. An object holding an `Encoded` array joins its kept parts."""
    if type(value) is dict and any(type(v) is Encoded for v in value.values()) and all(type(k) is str for k in value):
        pieces = [b"{"]
        for k, v in value.items():
            pieces += (b"," if len(pieces) > 1 else b"", wire_body(k), b":")
            if type(v) is Encoded:
                pieces += v.pieces()
            else:
                pieces.append(wire_body(v))
        pieces.append(b"}")
        return b"".join(pieces)
    if _fast_json is not None:
        try:
            out = _fast_json(value)
        except Exception:  # noqa: BLE001, S110 - refused: the stdlib writes it, or says why not
            pass
        else:
            if b"NaN" not in out and b"Infinity" not in out:
                return out
    return _escape_surrogates(_WIRE.encode(value)).encode("utf-8")


def line(record: dict[str, Any]) -> bytes:
    """One JSONL line (a run log's event): compact JSON, a newline, UTF-8. pydantic-core's serializer
    writes it (a few µs where the stdlib takes 5-15, and the ring writes four lines a step); what it
    refuses (a lone surrogate) is written by the stdlib, escaped as `dumps` does. JSON's own types are
    written as the stdlib writes them (a float may be spelled `0.000034` for `3.4e-05`: the same
    number). Other values follow pydantic's rules where it has one (a set is an array, a datetime ISO
    8601, an enum its value, a dataclass or model an object, bytes UTF-8 text, a None key "None"),
    else their `str()`."""
    if _fast_json is not None:
        try:
            return _fast_json(record, fallback=str) + b"\n"
        except Exception:  # noqa: BLE001, S110 - refused: the stdlib writes it
            pass
    return (_escape_surrogates(_COMPACT.encode(record)) + "\n").encode("utf-8")


def _escape_surrogates(text: str) -> str:
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)  # only inside strings


def loggable(text: str) -> str:
    """`text` as the log reads it back: JSON cannot tell a high surrogate followed by a low one from
    the character they encode, so they are joined here too (lone surrogates stay as they are)."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonLimitError(f"an integer with {digits:,} digits (the limit is {MAX_INT_DIGITS:,})")
    return int(text)


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_LOOSE = json.JSONDecoder(parse_int=_bounded_int)  # built once: a decoder per call costs more
_STRICT = json.JSONDecoder(parse_int=_bounded_int, parse_constant=_bad_constant)


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH, strict: bool = False, deep: bool = True) -> Any:
    """json.loads, bounded: JsonLimitError past `max_depth` levels or MAX_INT_DIGITS digits.
    `strict` also refuses NaN/Infinity (not JSON), so a parse means a real JSON value. `deep=False`
    leaves both bounds to the caller (`check_depth` on the parts it has not checked before: it checks
    the integers' length too), and parses with pydantic-core's parser (a third of the stdlib's time:
    the proxy reads a whole conversation each request), whose own bounds hold (201 levels, 4,300
    digits); what it refuses (a lone surrogate, a byte order mark, anything not JSON) the stdlib's
    parser reads, or refuses with its own message, as before."""
    if not deep and _fast_parse is not None:
        try:
            return _fast_parse(text, allow_inf_nan=not strict)
        except (ValueError, TypeError):  # (TypeError: text it cannot encode, a lone surrogate)
            pass
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")  # a UnicodeDecodeError is a ValueError, as json.loads raises
    try:
        value = (_STRICT if strict else _LOOSE).decode(text)
    except RecursionError:
        raise JsonLimitError(_too_deep(_text_depth(text), max_depth)) from None
    except json.JSONDecodeError:
        if not text.startswith("\ufeff"):
            raise
        return loads(text[1:], max_depth=max_depth, strict=strict)  # a byte order mark (a Windows editor's)
    if deep and text.count("{") + text.count("[") > max_depth:  # else no value in it can nest deeper: each
        check_depth(value, max_depth)  # level opens with a bracket (one in a string only adds)
    return value


def loads_at(text: str, at: int) -> tuple[Any, int]:
    """The JSON value in `text` that begins at `at` (no whitespace before it), and where it ends: the
    stdlib's scanner, strict and with `loads`' bound on integers (its depth: a RecursionError)."""
    return _STRICT.raw_decode(text, at)


def loads_object(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """A bounded, strict parse (NaN/Infinity refused)."""
    return loads(text, max_depth=max_depth, strict=True)


_LEAVES = frozenset({str, int, float, bool, type(None)})


def depth(value: Any) -> int:
    """Nesting levels of a JSON-like value (a scalar is 0, `[]` is 1): level by level, without
    recursion (a few microseconds for a usual reply: it runs once per reply)."""
    return _levels(value, False)


def _levels(value: Any, ints: bool) -> int:
    """`depth`; `ints`: JsonLimitError at an integer longer than MAX_INT_DIGITS digits."""
    levels, layer = 0, [value]
    while True:
        below: list[Any] = []
        found = False
        for v in layer:
            if type(v) in _LEAVES:
                if ints and type(v) is int and not -_LONG < v < _LONG:
                    _bounded_int(str(v))
                continue
            if isinstance(v, dict):
                below.extend(v.values())
                found = True
            elif isinstance(v, (list, tuple)):
                below.extend(v)
                found = True
        if not found:
            return levels
        levels += 1
        layer = below


_LONG = 10 ** MAX_INT_DIGITS  # the least integer with one digit too many


def check_depth(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """JsonLimitError when `value` nests deeper than `max_depth` levels, or holds an integer longer
    than MAX_INT_DIGITS digits."""
    levels = _levels(value, True)
    if levels > max_depth:
        raise JsonLimitError(_too_deep(levels, max_depth))


def _too_deep(levels: int, limit: int) -> str:
    return f"nested {levels:,} levels deep (the limit is {limit:,})"


def _text_depth(text: str) -> int:
    """Deepest bracket nesting outside strings (for the message only; the parse already failed)."""
    level = deepest = 0
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "[{":
            level += 1
            deepest = max(deepest, level)
        elif tok in "]}":
            level -= 1
    return deepest


def read_bounded(path: str | Path, limit: int = MAX_INPUT_BYTES, what: str = "file") -> bytes:
    """At most `limit` bytes of a file (a pipe or a device too): JsonFileError past it, or when
    the file cannot be read. Never reads more than limit + 1 bytes."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise JsonFileError(f"{p}: {what} not found") from None
    except OSError as exc:
        raise JsonFileError(f"{p}: cannot read {what}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > limit:
        raise JsonFileError(f"{p}: {what} is over the {limit:,}-byte limit")
    return data


def load_json_items(path: str | Path, check: Callable[[Any], None], what: str = "file") -> list[Any]:
    """Items of a JSON array or a JSONL file (one value per line, blank lines skipped), each passed
    to `check` (which raises ValueError) in file order; the first problem is raised as
    JsonFileError("FILE:LINE: why"). Bounded: file size, nesting, integer length."""
    return json_items(path, read_bounded(path, MAX_INPUT_BYTES, what), check, what)


def json_items(path: str | Path, data: bytes, check: Callable[[Any], None], what: str = "file") -> list[Any]:
    """load_json_items on bytes already read from `path` (named in the errors)."""
    p = Path(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonFileError(f"{p}: cannot read {what}: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        raise JsonFileError(f"{p}: {what} is empty")
    if text.lstrip().startswith("["):
        items = _parse(p, 1, text)
        if not items:
            raise JsonFileError(f"{p}: {what} is an empty array: it needs at least one item")
        numbered: Any = enumerate(items, 1)
    else:
        numbered = ((n, _parse(p, n, line)) for n, line in enumerate(text.splitlines(), 1)
                    if line.strip())
    out = []
    for n, value in numbered:  # lazily parsed: the first problem in file order is the one reported
        try:
            check(value)
        except ValueError as exc:
            raise JsonFileError(f"{p}:{n}: {exc}") from None
        out.append(value)
    return out


def _parse(p: Path, n: int, text: str) -> Any:
    try:
        return loads(text)
    except JsonLimitError as exc:
        raise JsonFileError(f"{p}:{n}: JSON over a limit: {exc.msg}") from None
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{p}:{n + exc.lineno - 1}: not valid JSON: {exc.msg}") from None
