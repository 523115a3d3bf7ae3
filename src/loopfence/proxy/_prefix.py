"""A Chat Completions body read from its bytes, from where the known conversation it extends stopped.

An agent's every request carries its whole conversation again, as the same bytes: the history it
sent before, then what is new. The bytes of a body through its last message parse to the same
values whatever follows them, so a body that begins with a known conversation's bytes
(`_view.known_before`) has only the rest parsed: its new messages, one by one (the stdlib's scanner,
which says where each ends, for the next request), and the fields after them. A body that begins
with none is read from the start the same way, when it is small (FRESH_BYTES: the stdlib's scanner
takes about five times pydantic-core's parse; a conversation begins small, and is read this way from
its first request on); a larger one is parsed whole, as before, and not kept by its bytes. Nothing is
guessed: a body this reading cannot follow (not an object, a `messages` field twice, no messages,
bytes that are not UTF-8 or JSON, nesting past the scanner's depth) gives None, and the caller parses
it whole, as before, with its own errors.

Only the parse is saved; every check after it (the wire's, the depth and integer bounds on what is
new, the weighing before it, the run identity) reads the same values as a whole parse would give.
The known part's values are the objects read before (its messages, and the fields before them), shared
by every body read from them: nothing after the parse changes a body's values in place.
"""

from __future__ import annotations

import re
from typing import Any

from .._json import loads, loads_at
from ._load import counts, plus
from ._view import PARSED, reading

__all__ = ["parsed", "FRESH_BYTES"]

FRESH_BYTES = 256 << 10  # a body that begins with no known conversation is read from its bytes up to this size

_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


def _skip(s: str, i: int) -> int:
    return _SPACE.match(s, i).end()  # type: ignore[union-attr]  (matches the empty string)


def _elements(s: str, i: int, out: list[Any], first: bool) -> tuple[int, int]:
    """The array elements in `s` from `i` (`first`: just after its `[`; else just after an element)
    appended to `out`: (where the last one read ends, 0 if none; where the array ends, after `]`)."""
    last, i = 0, _skip(s, i)
    if first:
        if s.startswith("]", i):
            raise ValueError("no messages")  # (the wire's own check says so)
        value, last = loads_at(s, i)
        out.append(value)
        i = _skip(s, last)
    while s.startswith(",", i):
        value, last = loads_at(s, _skip(s, i + 1))
        out.append(value)
        i = _skip(s, last)
    if not s.startswith("]", i):
        raise ValueError("not an array")
    return last, i + 1


def _head(s: str) -> tuple[dict[str, Any], int]:
    """The fields before `messages` in the body `s`, parsed, and where its array's elements begin."""
    head: dict[str, Any] = {}
    i = _skip(s, 0)
    if not s.startswith("{", i):
        raise ValueError("not an object")
    i = _skip(s, i + 1)
    while s.startswith('"', i):
        key, i = loads_at(s, i)
        i = _skip(s, i)
        if not s.startswith(":", i):
            raise ValueError("no colon")
        i = _skip(s, i + 1)
        if key == "messages":
            if not s.startswith("[", i):
                raise ValueError("messages is not an array")  # (the wire's own check says so)
            return head, i + 1
        head[key], i = loads_at(s, i)
        i = _skip(s, i)
        if not s.startswith(",", i):
            raise ValueError("no messages")
        i = _skip(s, i + 1)
    raise ValueError("no messages")


def _tail(s: str, i: int) -> dict[str, Any]:
    """The fields after the messages array (`s` from just after its `]`), the object closed."""
    i = _skip(s, i)
    if s.startswith("}", i):
        if _skip(s, i + 1) != len(s):
            raise ValueError("text after the body")
        return {}
    if not s.startswith(",", i) or not s.startswith('"', _skip(s, i + 1)):
        raise ValueError("not an object")
    rest = loads("{" + s[i + 1:], strict=True, deep=False)  # (its bounds: the wire's depth check)
    if not isinstance(rest, dict) or "messages" in rest:
        raise ValueError("messages twice")
    return rest


def parsed(data: bytes, known: Any) -> tuple[dict[str, Any], Any] | None:
    """The body `data` parsed, and its reading begun (`_view.reading`'s pair, for the wire's parse),
    from `known` (`_view.known_before(data)`; None: from the start); None when this reading cannot
    follow it (parse it whole)."""
    if known is None and len(data) > FRESH_BYTES:
        return None
    try:
        if known is not None:
            at = len(known.raw)
            s = data[at:].decode("utf-8")
            head, start, messages = known.head, 0, known.messages
        else:
            at, s = 0, data.decode("utf-8")
            head, start = _head(s)
            messages = []
        new: list[Any] = []
        last, close = _elements(s, start, new, known is None)
        body = {**head, "messages": messages + new, **_tail(s, close)}
    except (ValueError, RecursionError):  # (UnicodeDecodeError and the scanner's errors are ValueErrors)
        return None
    end = at + (last if s.isascii() else len(s[:last].encode("utf-8"))) if last else at
    started = reading(body["messages"], known) if known is not None else reading(body["messages"])
    going = started[1]
    if known is None:  # one found by value may hold its messages' fields in another order: these bytes' are kept
        going.messages[:] = body["messages"][:len(going.messages)]
    going.raw = data[:end]
    going.head = head
    going.counts = plus(known.counts, counts(data[at:end])) if known is not None else counts(going.raw)
    going.head_size = known.head_size if known is not None else PARSED * start
    return body, started
