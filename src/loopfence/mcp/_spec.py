"""Which MCP server to talk to: a command (stdio) or a URL (Streamable HTTP), and how far to trust it.

`McpServer.parse("fs=npx -y @modelcontextprotocol/server-filesystem .")` or
`McpServer.parse("docs=https://example.org/mcp")`: an optional `NAME=` prefix names the server (its
tools are namespaced `NAME__tool` when names collide); without it the server's own name (from its
`initialize` answer) is used. A command is split like a shell would (`shlex`), never run by one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["McpServer", "NAME_RE", "as_server"]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_PREFIX = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]{0,31})=(?=\S)")


@dataclass(frozen=True)
class McpServer:
    """One MCP server. Exactly one of `command` (stdio: the argv to start) and `url` (Streamable HTTP).

    headers: sent with every HTTP request (auth); their values never reach the log.
    env: extra environment for a stdio server (over the SDK's safe defaults: HOME, PATH, ...);
        only the names reach the log. cwd: its working folder.
    trust_annotations: None = the `mcp_tools(trust_annotations=...)` default.
    """

    command: tuple[str, ...] = ()
    url: str | None = None
    name: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    trust_annotations: bool | None = None

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError("an MCP server needs exactly one of a command (stdio) or a url (Streamable HTTP)")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"MCP server url must be http(s)://host[:port]/path, got {self.url!r}")
        if self.name is not None and not NAME_RE.match(self.name):
            raise ValueError(f"MCP server name must match {NAME_RE.pattern}, got {self.name!r}")
        object.__setattr__(self, "command", tuple(str(c) for c in self.command))
        if self.cwd is not None:
            object.__setattr__(self, "cwd", str(Path(self.cwd)))

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable_http"

    @classmethod
    def stdio(cls, command: str | Sequence[str], **options: Any) -> McpServer:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("an MCP stdio server needs a command")
        return cls(command=tuple(argv), **options)

    @classmethod
    def http(cls, url: str, *, headers: Mapping[str, str] | None = None, **options: Any) -> McpServer:
        return cls(url=url, headers=dict(headers or {}), **options)

    @classmethod
    def parse(cls, text: str, **options: Any) -> McpServer:
        """`[NAME=]COMMAND ARGS` or `[NAME=]http(s)://URL` (the CLI's --mcp / --mcp-url)."""
        text = text.strip()
        m = _PREFIX.match(text)
        if m and "name" not in options:
            options["name"], text = m.group(1), text[m.end():]
        if re.match(r"^https?://", text, re.IGNORECASE):
            return cls.http(text, **options)
        return cls.stdio(text, **options)

    def label(self) -> str:
        """How the server is named in messages: never a header value, a URL's query or its password."""
        if self.command:
            return shlex.join(self.command)
        return safe_url(self.url or "")

    def describe(self) -> dict[str, Any]:
        """For the log header (no secrets: header and env values, URL queries and passwords stay out)."""
        out: dict[str, Any] = {"transport": self.transport}
        if self.command:
            out["command"] = list(self.command)
            if self.env:
                out["env"] = sorted(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        else:
            out["url"] = safe_url(self.url or "")
            if self.headers:
                out["headers"] = sorted(self.headers)
        return out


def safe_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def as_server(item: McpServer | str | Sequence[str]) -> McpServer:
    """A server spec from what `mcp_tools()` takes: an McpServer, `[NAME=]command or URL`, or an argv."""
    if isinstance(item, McpServer):
        return item
    if isinstance(item, str):
        return McpServer.parse(item)
    if isinstance(item, Sequence) and item and all(isinstance(a, str) for a in item):
        return McpServer.stdio(list(item))
    raise TypeError(f"an MCP server is an McpServer, a command or URL string, or an argv list; got {item!r}")
