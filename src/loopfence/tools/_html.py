"""HTML -> readable text: scripts, styles and markup dropped; the title and the links kept; the
original size noted. Real pages are mostly inline CSS and scripts (seed 003: 144 KB of HTML, about
6 KB of text); the model should get the text, not the markup.

Parsing is libxml2's HTML parser (lxml): linear on hostile pages (`"<a" * 100000` takes a
millisecond; the standard library's parser took seconds, quadratically), nesting capped by libxml2,
and at most MAX_HTML_CHARS of a page are converted. The tree is walked without recursion.

`looks_like_html` sniffs pages saved under other names: a doctype, an `<html>` root, XHTML, or a
fragment that starts with a document-level tag (`<head>`, `<body>`, `<meta>`...), after any BOM,
whitespace, XML declaration and comments. Markdown or text that mentions tags is not HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lxml import etree

__all__ = ["HtmlText", "html_to_text", "looks_like_html", "HTML_SUFFIXES", "MAX_HTML_CHARS"]

HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")
MAX_LINKS = 200
MAX_HTML_CHARS = 4_000_000  # of a page converted; the rest is left out, and the note says so
_SNIFF_LEAD = 1 << 20  # BOM, whitespace, XML declaration and comments skipped before the first tag

_SKIP = {"script", "style", "noscript", "template", "svg", "math", "iframe", "object", "canvas", "head"}
_BLOCK = {"address", "article", "aside", "blockquote", "body", "br", "dd", "details", "div", "dl", "dt",
          "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
          "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "td",
          "th", "tr", "ul"}
_LINE = {"br", "dd", "dt", "li", "tr"}  # a line break before; no blank line after
_SPACE = re.compile(r"[ \t\n\r\f\v]+")  # ASCII whitespace only: a no-break space stays
_TAG = re.compile(r"<[^>]*>")
_LEAD = re.compile(r"[\s\ufeff]*(?:<\?xml[^>]*>|<!--)?", re.I)
_START = re.compile(r"<(?:!doctype\s+html|(?:html|head|body|meta|title|base|link)(?=[\s/>])|"
                    r"[a-z][^>]*\sxmlns\s*=\s*[\"']http://www\.w3\.org/1999/xhtml[\"'])", re.I)
_PARSER = etree.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True, no_network=True)


@dataclass(frozen=True, slots=True)
class HtmlText:
    title: str
    text: str
    links: tuple[str, ...]
    html_chars: int
    converted_chars: int | None = None  # set when only the first this many characters were converted

    def render(self) -> str:
        """Title, a note on what was dropped, the body text, then the numbered links."""
        head = [f"Title: {self.title}"] if self.title else []
        body = self.text
        tail = ""
        if self.links:
            shown = self.links[:MAX_LINKS]
            tail = "\n\nLinks:\n" + "\n".join(f"[{i}] {u}" for i, u in enumerate(shown, 1))
            if len(self.links) > MAX_LINKS:
                tail += f"\n[truncated: {len(self.links):,} links, showing the first {MAX_LINKS:,}]"
        size = len(body) + len(tail)
        part = f" (only the first {self.converted_chars:,} were converted)" if self.converted_chars else ""
        head.append(f"[HTML page converted to text: {self.html_chars:,} characters of HTML{part} -> "
                    f"{size:,} characters of text; scripts, styles and markup removed]")
        return "\n".join(head) + "\n\n" + body + tail


def looks_like_html(name: str, text: str) -> bool:
    return name.lower().endswith(HTML_SUFFIXES) or _sniff(text)


def _sniff(text: str) -> bool:
    pos = 0
    while pos <= _SNIFF_LEAD:
        m = _LEAD.match(text, pos)
        assert m is not None  # the pattern matches the empty string
        if m.group().endswith("<!--"):
            end = text.find("-->", m.end())
            if end < 0:
                return False
            pos = end + 3
        elif m.end() > pos:
            pos = m.end()
        else:
            return bool(_START.match(text, pos))
    return False


def html_to_text(html: str, limit: int = MAX_HTML_CHARS) -> HtmlText:
    page = html[:limit]
    data = page.replace("\x00", "").encode("utf-8", "replace")
    try:
        root = etree.fromstring(data, _PARSER)
    except (etree.LxmlError, ValueError):  # libxml2 gave up: the text without the tags
        root = None
        reader = _Reader()
        reader.data(_TAG.sub(" ", page))
    else:
        reader = _Reader()
        if root is not None:
            reader.walk(root)
    return HtmlText(" ".join(reader.title.split()), _tidy("".join(reader.out)), tuple(reader.links),
                    len(html), limit if len(html) > limit else None)


class _Reader:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.title = ""
        self.links: dict[str, int] = {}  # href -> its number (a dict: thousands of links stay linear)
        self._pre = 0
        self._href: str | None = None

    def walk(self, root: Any) -> None:
        """Depth first without recursion: (element, False) opens it, (element, True) closes it."""
        todo: list[tuple[Any, bool]] = [(root, False)]
        while todo:
            el, closing = todo.pop()
            tag = el.tag.lower() if isinstance(el.tag, str) else None
            if closing:
                self.close(tag or "")
            elif tag is not None and self.open(el, tag):
                self.data(el.text)
                todo.append((el, True))
                todo.extend((child, False) for child in reversed(el))
                continue
            self.data(el.tail)

    def open(self, el: Any, tag: str) -> bool:
        """Emit what starts `el`; False when its content is dropped (scripts, the head...)."""
        if tag == "title" or tag == "head":
            titles = [el] if tag == "title" else el.iter("title")
            self.title += "".join("".join(t.itertext()) for t in titles)
            return False
        if tag in _SKIP:
            return False
        if tag in _BLOCK:
            self.out.append("\n")
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.out.append("#" * int(tag[1]) + " ")
        elif tag == "li":
            self.out.append("- ")
        elif tag == "pre":
            self._pre += 1
        elif tag in ("td", "th"):
            self.out.append(" | ")
        elif tag == "a":
            href = el.get("href") or ""
            keep = href and not href.startswith(("#", "javascript:", "data:"))
            self._href = href.strip() if keep else None
        elif tag == "img":
            alt = (el.get("alt") or "").strip()
            if alt:
                self.out.append(f" [image: {alt}] ")
        return True

    def close(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            number = self.links.setdefault(self._href, len(self.links) + 1)
            self.out.append(f" [{number}]")
            self._href = None
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _BLOCK and tag not in _LINE:
            self.out.append("\n")

    def data(self, text: str | None) -> None:
        if text:
            self.out.append(text if self._pre else _SPACE.sub(" ", text))


def _tidy(text: str) -> str:
    lines = [line.strip() for line in text.split("\n")]
    text = "\n".join(line for line in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
