"""Server-sent events: `text/event-stream` lines -> events (the WHATWG rules, with two tolerances).

An event is the `data:` lines (joined with newlines), `event:` and `id:` fields up to a blank line.
Lines starting with `:` are comments (OpenRouter sends `: OPENROUTER PROCESSING`); `retry:` and
unknown fields are ignored. Tolerances: leading spaces before a field name are dropped (one capture
starts with ` data:`), and an event still pending when the input ends is dispatched, because a cut
inside a JSON payload is caught when the payload is parsed, and a well-formed last event without
its trailing blank line is common.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

__all__ = ["SSEEvent", "EventParser", "LineSplitter", "iter_events", "iter_lines", "aiter_events", "parse_events",
           "DONE"]

DONE = "[DONE]"
_EOL = re.compile(r"\r\n|\r|\n")
_EOL_B = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


class EventParser:
    """Push-style SSE parsing: `feed(line)` returns the event a blank line completes, `close()`
    the one still pending when the input ends. `iter_events` and the async reader share it."""

    __slots__ = ("_data", "_event", "_id", "_seen")

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None  # the last id seen (it carries over to later events)
        self._seen = False  # any field of the pending event

    def feed(self, raw: str) -> SSEEvent | None:
        line = raw.rstrip("\r\n")
        if not line:
            out = SSEEvent("\n".join(self._data), self._event or "message", self._id) if self._data else None
            self._data, self._event, self._seen = [], "", False
            return out
        if line[0] == ":":
            return None
        if line[0] == " ":
            line = line.lstrip(" ")
            if not line or line[0] == ":":
                return None
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        self._seen = True
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None

    def close(self) -> SSEEvent | None:
        if self._seen and self._data:
            return SSEEvent("\n".join(self._data), self._event or "message", self._id)
        return None


class LineSplitter:
    """Push-style line splitting of raw body bytes: `feed(chunk)` returns the lines it completes,
    `close()` the unterminated rest. Only CR, LF and CRLF end a line (not the other
    `str.splitlines` breaks, which may sit inside a JSON string); a line is decoded once complete,
    so a UTF-8 character split across network reads is fine. A long line costs its length once: the
    pieces of a line not yet ended are kept, and joined when it ends (not on every read)."""

    __slots__ = ("_pending", "_cr")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the unterminated line so far, in pieces
        self._cr = False  # the pending line ends with CR (maybe the first half of CRLF)

    def feed(self, chunk: bytes) -> list[str]:
        if not chunk:
            return []
        if not self._cr and b"\n" not in chunk and b"\r" not in chunk:
            self._pending.append(chunk)  # no line ends here: nothing to split yet
            return []
        buf = b"".join(self._pending) + chunk
        hold = buf.endswith(b"\r")
        parts = _EOL_B.split(buf[:-1] if hold else buf)
        rest = parts.pop() + (b"\r" if hold else b"")
        self._pending, self._cr = [rest] if rest else [], hold
        return [part.decode("utf-8", "replace") for part in parts]

    def close(self) -> list[str]:
        buf, self._pending, self._cr = b"".join(self._pending), [], False
        return [part.decode("utf-8", "replace") for part in _EOL_B.split(buf)] if buf else []


def iter_events(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Events from lines (no line terminators needed; a trailing `\\r` or `\\n` is stripped)."""
    parser = EventParser()
    for raw in lines:
        ev = parser.feed(raw)
        if ev is not None:
            yield ev
    last = parser.close()
    if last is not None:
        yield last


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Lines from raw body bytes as they arrive (see LineSplitter); the unterminated rest comes last."""
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.close()


async def aiter_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[SSEEvent]:
    """Events from raw body bytes as they arrive over an async stream (the same rules)."""
    splitter, parser = LineSplitter(), EventParser()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            ev = parser.feed(line)
            if ev is not None:
                yield ev
    for line in splitter.close():
        ev = parser.feed(line)
        if ev is not None:
            yield ev
    last = parser.close()
    if last is not None:
        yield last


def parse_events(text: str) -> list[SSEEvent]:
    """All events of a whole body (CRLF, LF or CR line endings)."""
    return list(iter_events(_EOL.split(text)))
