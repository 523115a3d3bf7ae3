"""Text from a model, a tool or a file, made safe to show on a terminal.

`printable(value)`: control characters (ESC and the rest of C0 and C1, DEL), bidirectional
overrides and lone surrogates become visible escapes (`\\x1b`, `\\u202e`), so nothing a model, a
tool or a file wrote can move the cursor, recolor or hide text, or fail to encode. Newlines and tabs
stay (a CRLF is a newline) unless `one_line`; `limit` clips long text and says how much was left
out. Rich markup is another matter: show the result as Rich Text (`rich_text()`), with markup off,
or through `markup()`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported by the console paths that use it, not by `import loopfence`
    from rich.text import Text

__all__ = ["printable", "markup", "rich_text"]

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: Any, limit: int | None = None, *, one_line: bool = False) -> str:
    """str(value) with nothing a terminal interprets; at most `limit` characters of it shown."""
    s = value if isinstance(value, str) else str(value)
    more = 0
    if limit is not None and len(s) > limit:
        s, more = s[:limit], len(s) - limit
    s = s.replace("\r\n", "\n")  # a line ending; a lone carriage return could overwrite a line
    if one_line:
        s = s.replace("\n", " ").replace("\t", " ")
    s = _UNSAFE.sub(_escape, s)
    return f"{s}… [{more:,} more characters]" if more else s


def markup(value: Any, limit: int | None = None, *, one_line: bool = False) -> str:
    """printable(), escaped for a Rich markup string (a `[/]` or `[link=...]` stays text)."""
    from rich.markup import escape

    return escape(printable(value, limit, one_line=one_line))


def rich_text(value: Any, limit: int | None = None, *, one_line: bool = False, style: str = "") -> Text:
    """printable() as a Rich Text: never parsed as markup or emoji codes (table cells)."""
    from rich.text import Text

    return Text(printable(value, limit, one_line=one_line), style=style)
