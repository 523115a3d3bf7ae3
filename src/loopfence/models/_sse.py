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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["SSEEvent", "iter_events", "iter_lines", "parse_events", "DONE"]

DONE = "[DONE]"
_EOL = re.compile(r"\r\n|\r|\n")
_EOL_B = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


def iter_events(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Events from lines (no line terminators needed; a trailing `\\r` or `\\n` is stripped)."""
    data: list[str] = []
    event = ""
    last_id: str | None = None
    seen = False  # any field of the pending event
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield SSEEvent("\n".join(data), event or "message", last_id)
            data, event, seen = [], "", False
            continue
        if line[0] == ":":
            continue
        if line[0] == " ":
            line = line.lstrip(" ")
            if not line or line[0] == ":":
                continue
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        seen = True
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            last_id = value
    if seen and data:
        yield SSEEvent("\n".join(data), event or "message", last_id)


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Lines from raw body bytes as they arrive. Only CR, LF and CRLF end a line (not the other
    `str.splitlines` breaks, which may sit inside a JSON string); a line is decoded once complete,
    so a UTF-8 character split across network reads is fine. The unterminated rest comes last."""
    buf = b""
    for chunk in chunks:
        if not chunk:
            continue
        buf += chunk
        hold = buf.endswith(b"\r")  # maybe the first half of CRLF
        parts = _EOL_B.split(buf[:-1] if hold else buf)
        buf = parts.pop() + (b"\r" if hold else b"")
        for part in parts:
            yield part.decode("utf-8", "replace")
    if buf:
        for part in _EOL_B.split(buf):
            yield part.decode("utf-8", "replace")


def parse_events(text: str) -> list[SSEEvent]:
    """All events of a whole body (CRLF, LF or CR line endings)."""
    return list(iter_events(_EOL.split(text)))
