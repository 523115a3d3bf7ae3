"""The CLI's MCP flags, in one place for `run`, `batch` and `drill`.

    add_flags(parser)    # in add_parser: --mcp, --mcp-url, --mcp-header, --mcp-trust, --mcp-kind, --mcp-timeout
    with open_from_args(args, reserved=[t.name for t in builtins]) as mcp:   # in main()
        run(..., tools=[*builtins, *mcp], header={..., **mcp.header()})

`open_from_args` yields an open group (an empty one without --mcp/--mcp-url: no tools, header {}),
and raises McpUsageError (a ValueError: the command's usage error, exit 2) for a flag that does not
parse, a server that does not start (naming it and its stderr tail) or a missing SDK.

Server start-up counts against the run's wall clock: the servers get at most `--limit
max_wall_seconds` (its default when not given) to start and list their tools, whatever
--mcp-timeout says, and a server that takes longer is named with both numbers. (The run's own
clock starts when its log is opened, before the servers start; see the header's `mcp.startup_s`.)
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .._limits import Limits, parse_limit
from ._host import McpServerError
from ._spec import McpServer
from ._tools import DEFAULT_CONNECT_TIMEOUT_S, McpTools, McpUnavailable

__all__ = ["McpUsageError", "add_flags", "open_from_args", "parse_header", "parse_kind", "tools_from_args",
           "tools_from_flags", "wall_limit"]


class McpUsageError(ValueError):
    """The MCP flags cannot be served: a bad flag, a server that did not start, the SDK missing."""


@contextmanager
def open_from_args(args: argparse.Namespace, *, reserved: Collection[str] = ()) -> Iterator[McpTools]:
    """The servers the parsed flags name, open for the block and closed after it, whatever ends it."""
    bounded, wall = False, None
    try:
        named = tools_from_args(args, reserved=reserved)
        group = McpTools([]) if named is None else named  # (a group is falsy until it has tools)
        wall = wall_limit(args)
        bounded = wall is not None and (group.connect_timeout_s is None or wall < group.connect_timeout_s)
        if bounded:
            group.connect_timeout_s = wall
        group.open()
    except McpServerError as exc:
        if bounded and "no answer" in exc.detail:
            exc = McpServerError(exc.server, f"{exc.detail} (max_wall_seconds={wall:g}, under --mcp-timeout "
                                 f"{getattr(args, 'mcp_timeout', DEFAULT_CONNECT_TIMEOUT_S):g}s: server start-up "
                                 "counts against the run's wall clock)", exc.stderr)
        raise McpUsageError(str(exc)) from None
    except (ValueError, McpUnavailable) as exc:
        raise McpUsageError(str(exc)) from None
    try:
        yield group
    finally:
        group.close()


def wall_limit(args: argparse.Namespace) -> float | None:
    """The run's max_wall_seconds as the command's --limit flags set it (the last one wins), else
    its default; a flag that does not parse is left to the command to report."""
    wall = Limits().max_wall_seconds
    for text in getattr(args, "limit", None) or []:
        try:
            name, value = parse_limit(text)
        except ValueError:
            continue
        if name == "max_wall_seconds":
            wall = value
    return wall


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the MCP flags (`--mcp`, `--mcp-url`, `--mcp-header`, `--mcp-trust`, `--mcp-kind`) to a
    command's parser; `open_from_args` opens what they name."""
    g = parser.add_argument_group("MCP servers (needs loopfence[mcp])")
    g.add_argument("--mcp", action="append", metavar="'[NAME=]CMD ARGS'",
                   help="start an MCP server over stdio (the command as one string, split like a shell "
                        "would, never run by one); repeatable")
    g.add_argument("--mcp-url", action="append", metavar="[NAME=]URL",
                   help="an MCP server over Streamable HTTP; repeatable")
    g.add_argument("--mcp-header", action="append", metavar="'NAME: VALUE'",
                   help="an HTTP header sent to every --mcp-url server (auth); never logged")
    g.add_argument("--mcp-trust", action="append", metavar="SERVER",
                   help="trust this MCP server's tool annotations (readOnlyHint, destructiveHint, "
                        "openWorldHint); its name, or 'all'. Untrusted: every tool is side_effect, "
                        "privileged, with untrusted output")
    g.add_argument("--mcp-kind", action="append", metavar="TOOL=KIND",
                   help="override an MCP tool's kind (read_only, side_effect, poll); repeatable")
    g.add_argument("--mcp-timeout", type=_seconds, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="SECONDS",
                   help=f"how long a server may take to start and list its tools (default {DEFAULT_CONNECT_TIMEOUT_S:g}; "
                        "never more than --limit max_wall_seconds: start-up counts against the run's wall clock)")


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse names the flag when this raises)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def tools_from_args(args: argparse.Namespace, *, reserved: Collection[str] = ()) -> McpTools | None:
    """The group the parsed flags (from `add_flags`) name; None when they name no server."""
    return tools_from_flags(mcp=getattr(args, "mcp", None), mcp_url=getattr(args, "mcp_url", None),
                            headers=getattr(args, "mcp_header", None), trust=getattr(args, "mcp_trust", None),
                            kinds=getattr(args, "mcp_kind", None), reserved=reserved,
                            connect_timeout_s=getattr(args, "mcp_timeout", DEFAULT_CONNECT_TIMEOUT_S))


def tools_from_flags(mcp: Sequence[str] | None = None, mcp_url: Sequence[str] | None = None, *,
                     headers: Sequence[str] | None = None, trust: Sequence[str] | None = None,
                     kinds: Sequence[str] | None = None, reserved: Collection[str] = (),
                     connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S) -> McpTools | None:
    """An unopened `McpTools` for `--mcp CMD` / `--mcp-url URL` (repeatable), or None when there is
    neither. ValueError (one line) for a flag that does not parse."""
    if not mcp and not mcp_url:
        if headers or trust or kinds:
            raise ValueError("--mcp-header, --mcp-trust and --mcp-kind need an --mcp or --mcp-url server")
        return None
    hdrs = dict(parse_header(h) for h in headers or [])
    servers = []
    for text in mcp or []:
        if not text.strip():
            raise ValueError("--mcp needs a command")
        server = McpServer.parse(text)
        if server.url is not None:
            raise ValueError(f"--mcp {text!r} is a URL: use --mcp-url")
        servers.append(server)
    for text in mcp_url or []:
        server = McpServer.parse(text, headers=hdrs)
        if server.url is None:
            raise ValueError(f"--mcp-url {text!r}: expected http(s)://host[:port]/path")
        servers.append(server)
    trusted = list(trust or [])
    trust_annotations: bool | list[str] = True if "all" in trusted else trusted
    return McpTools(servers, trust_annotations=trust_annotations,
                    kinds=dict(parse_kind(k) for k in kinds or []), reserved=reserved,
                    connect_timeout_s=connect_timeout_s)


def parse_header(text: str) -> tuple[str, str]:
    """`Name: value` (or `Name=value`)."""
    for sep in (":", "="):
        name, found, value = text.partition(sep)
        if found and name.strip() and not any(c.isspace() for c in name.strip()):
            return name.strip(), value.strip()
    raise ValueError(f"--mcp-header expects 'NAME: VALUE', got {text.split(':')[0][:40]!r}...")


def parse_kind(text: str) -> tuple[str, Any]:
    name, found, kind = text.partition("=")
    if not found or not name.strip() or not kind.strip():
        raise ValueError(f"--mcp-kind expects TOOL=KIND (read_only, side_effect, poll), got {text!r}")
    return name.strip(), kind.strip()
