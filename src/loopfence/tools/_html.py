"""HTML -> readable text with the standard library: scripts, styles and markup dropped; the title and
the links kept; the original size noted. Real pages are mostly inline CSS and scripts (seed 003:
144 KB of HTML, about 6 KB of text); the model should get the text, not the markup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

__all__ = ["HtmlText", "html_to_text", "looks_like_html", "HTML_SUFFIXES"]

HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")
MAX_LINKS = 200

_SKIP = {"script", "style", "noscript", "template", "svg", "math", "iframe", "object", "canvas", "head"}
_BLOCK = {"address", "article", "aside", "blockquote", "body", "br", "dd", "details", "div", "dl", "dt",
          "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
          "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "td",
          "th", "tr", "ul"}
_LINE = {"br", "dd", "dt", "li", "tr"}  # a line break before; no blank line after
_SPACE = re.compile(r"[ \t\n\r\f\v]+")  # ASCII whitespace only: a no-break space stays
_SNIFF = re.compile(r"^\s*(<\?xml[^>]*>\s*)?(<!--.*?-->\s*)*<(!doctype\s+html|html[\s>])", re.I | re.S)


@dataclass(frozen=True, slots=True)
class HtmlText:
    title: str
    text: str
    links: tuple[str, ...]
    html_chars: int

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
        head.append(f"[HTML page converted to text: {self.html_chars:,} characters of HTML -> {size:,} "
                    "characters of text; scripts, styles and markup removed]")
        return "\n".join(head) + "\n\n" + body + tail


def looks_like_html(name: str, text: str) -> bool:
    return name.lower().endswith(HTML_SUFFIXES) or bool(_SNIFF.match(text[:2048]))


def html_to_text(html: str) -> HtmlText:
    parser = _Reader()
    parser.feed(html)
    parser.close()
    return HtmlText(" ".join(parser.title.split()), _tidy("".join(parser.out)), tuple(parser.links), len(html))


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.title = ""
        self.links: list[str] = []
        self._skip: list[str] = []  # open tags whose content is dropped
        self._in_title = False
        self._pre = 0
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title" and self._skip in ([], ["head"]):
            self._in_title = True
            return
        if tag == "body":
            self._skip.clear()  # a <head> left open ends where the body starts
        if self._skip or tag in _SKIP:
            if tag in _SKIP:
                self._skip.append(tag)
            return
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
            href = dict(attrs).get("href") or ""
            keep = href and not href.startswith(("#", "javascript:", "data:"))
            self._href = href.strip() if keep else None
        elif tag == "img":
            alt = (dict(attrs).get("alt") or "").strip()
            if alt:
                self.out.append(f" [image: {alt}] ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._in_title:
            self._in_title = False
            return
        if self._skip:
            if tag in self._skip:
                while self._skip and self._skip.pop() != tag:
                    pass
            return
        if tag == "a" and self._href is not None:
            if self._href not in self.links:
                self.links.append(self._href)
            self.out.append(f" [{self.links.index(self._href) + 1}]")
            self._href = None
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _BLOCK and tag not in _LINE:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.out.append(data if self._pre else _SPACE.sub(" ", data))


def _tidy(text: str) -> str:
    lines = [line.strip() for line in text.split("\n")]
    text = "\n".join(line for line in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
