"""`mcp_tools(...)`: the tools of MCP servers as loopfence tools, under the same fence.

    with mcp_tools("python server.py", McpServer.http(url, headers={...})) as tools:
        run(task, model=model, tools=[*workspace_tools("."), *tools], header=tools.header())
    async with mcp_tools(...) as tools:
        await arun(task, model=model, tools=tools, header=tools.header())

Each tool is an `async def` tool (awaited, cancelled at `tool_timeout_s`: the SDK then sends the
MCP cancellation notification) whose call hops to the group's host loop (see _host). Names: a
server's tool keeps its name unless another server (or a name in `reserved`, e.g. the built-in
tools') has it too; then every holder is named `SERVER__TOOL`. Each tool's `info` (the header's
`tool_info`) says which server and tool the name maps to, its kind and why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import re
import threading
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from .._keywords import keywords_checked
from ..tools._registry import Tool, ToolKind
from ._content import output_model, result_text, success_text
from ._host import Connection, Host, LoopHost, open_all
from ._kinds import Classified, classify, parse_override
from ._spec import McpServer, as_server

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "McpTools", "McpUnavailable", "mcp_tools"]

DEFAULT_CONNECT_TIMEOUT_S = 30.0
STALL_S = 10.0  # a call hopping to an `async with` group's loop that does not take it within this is refused
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64  # what OpenAI-compatible endpoints accept for a function name


@keywords_checked
def mcp_tools(*servers: McpServer | str | Sequence[str], trust_annotations: bool | Collection[str] = False,
              kinds: Mapping[str, Any] | None = None, reserved: Collection[str] = (),
              connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S) -> McpTools:
    """The tools of these MCP servers, live inside `with` / `async with` (or between `open()` and
    `close()`).

    servers: `McpServer`s, or strings: `[NAME=]COMMAND ARGS` (stdio) or `[NAME=]http(s)://URL`.
    trust_annotations: True trusts every server's tool annotations, a collection trusts the servers
        so named (a name that matches no server is an error); `McpServer(trust_annotations=)` wins.
        Untrusted, every tool is side_effect, privileged, with untrusted output (see _kinds).
    kinds: per tool (its model-visible or its server's name): a kind name, or a dict with any of
        `kind`, `privileged`, `untrusted`; a name that matches no tool is an error.
    reserved: names other tools of the run already use (an MCP tool with one is namespaced).
    connect_timeout_s: how long a server may take to start, initialize and list its tools.
    """
    if not servers:
        raise ValueError("mcp_tools() needs at least one server")
    return McpTools([as_server(s) for s in servers], trust_annotations=trust_annotations, kinds=kinds,
                    reserved=reserved, connect_timeout_s=connect_timeout_s)


class McpTools:
    """The tools of a group of MCP servers; the sessions are open between open and close. Iterating
    gives the Tools (pass it as `tools=`, or spread it into a list with other tools)."""

    def __init__(self, servers: list[McpServer], *, trust_annotations: bool | Collection[str] = False,
                 kinds: Mapping[str, Any] | None = None, reserved: Collection[str] = (),
                 connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.specs = servers
        if isinstance(trust_annotations, str):
            trust_annotations = [trust_annotations]
        self.trust_all = trust_annotations is True
        self.trust_names = frozenset() if isinstance(trust_annotations, bool) else frozenset(trust_annotations)
        self.overrides = {name: parse_override(name, value) for name, value in (kinds or {}).items()}
        self.reserved = frozenset(reserved)
        self.connect_timeout_s = connect_timeout_s
        self.tools: tuple[Tool, ...] = ()
        self.server_names: list[str] = []
        self._conns: list[Connection] = []
        self._host: Host | LoopHost | None = None
        self._life: concurrent.futures.Future[None] | None = None
        self._closing: asyncio.Event | None = None
        self._state = "new"  # new -> open -> closed

    # -- the tools ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def header(self) -> dict[str, Any]:
        """For `run(..., header=...)`: the servers (no header or env values, no URL query or
        password), their own names and versions, the protocol, how long each took to start and list
        its tools (`startup_s`), the trust, and the tool names each one serves (each tool's kind and
        why are in the header's `tool_info`). Empty without servers."""
        if not self.specs:
            return {}
        servers = []
        for name, conn in zip(self.server_names, self._conns):
            info = getattr(conn.init, "server_info", None)
            servers.append({"name": name, **conn.spec.describe(),
                            "server_info": {"name": getattr(info, "name", None),
                                            "version": getattr(info, "version", None)},
                            "protocol_version": getattr(conn.init, "protocol_version", None),
                            "startup_s": conn.startup_s,
                            "trust_annotations": self._trusted(name, conn.spec),
                            "tools": {t.name: t.info["mcp"]["tool"] for t in self.tools
                                      if t.info["mcp"]["server"] == name}})
        return {"mcp": {"servers": servers}}

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self) -> McpTools:
        """Start every server (at once), open the sessions, list and build the tools. Blocks."""
        opened = self._start()
        try:
            opened.result()
        except BaseException:
            self._shut(wait=True)
            raise
        return self._built()

    async def aopen(self) -> McpTools:
        """`open()` for a running event loop (it waits without blocking the loop). The sessions live
        on this loop: calls awaited here (`arun()`, `abatch()`) reach them without a thread hop."""
        opened = self._start(LoopHost(asyncio.get_running_loop()))
        try:
            await asyncio.wrap_future(opened)
        except BaseException:
            await _quiet(asyncio.to_thread(self._shut, True))
            raise
        return self._built()

    def close(self) -> None:
        """Close every session; stdio servers stop (the SDK kills what does not, with its process
        group). Idempotent; blocks until done (bounded)."""
        self._shut(wait=True)

    async def aclose(self) -> None:
        await asyncio.shield(asyncio.to_thread(self._shut, True))

    def __enter__(self) -> McpTools:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> McpTools:
        return await self.aopen()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _start(self, host: Host | LoopHost | None = None) -> concurrent.futures.Future[None]:
        if self._state != "new":
            raise RuntimeError(f"this mcp_tools() group is already {self._state}; make a new one")
        self._state = "open"
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.specs:  # no servers: nothing to start (the CLI without --mcp flags)
            opened.set_result(None)
            return opened
        _require_sdk()
        self._conns = [Connection(s, self.connect_timeout_s) for s in self.specs]
        self._host = host = host or Host()
        self._life = host.submit(self._lifetime(opened))
        self._life.add_done_callback(lambda _: host.stop(timeout_s=0))  # the host ends with the sessions
        return opened

    async def _lifetime(self, opened: concurrent.futures.Future[None]) -> None:
        """On the host loop: open everything, hold it until closing, close everything."""
        self._closing = closing = asyncio.Event()
        try:
            tasks = await open_all(self._conns, closing)
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if not opened.done():
            opened.set_result(None)
        await closing.wait()
        await asyncio.wait(tasks, timeout=30.0)

    def _shut(self, wait: bool) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        host, life = self._host, self._life
        if host is None or life is None:
            return
        closing = self._closing
        try:
            if closing is not None:
                host.loop.call_soon_threadsafe(closing.set)
            else:  # still opening: a cancel unwinds whatever has started
                host.loop.call_soon_threadsafe(_cancel_all, host.loop)
        except RuntimeError:  # the host loop is already closed
            return
        if wait and not host.on_own_thread():  # (a sync close() on the group's own loop: signalled only)
            try:
                life.result(timeout=45.0)
            except BaseException:  # noqa: BLE001, S110 - closing never raises; the open already reported
                pass
            host.stop()

    def _built(self) -> McpTools:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _trusted(self, server: str, spec: McpServer) -> bool:
        if spec.trust_annotations is not None:
            return spec.trust_annotations
        return self.trust_all or server in self.trust_names

    # -- building the tools ------------------------------------------------------------------------
    def _build(self) -> None:
        names = _server_names(self._conns)
        self.server_names = names
        listed = [(name, conn, t) for name, conn in zip(names, self._conns) for t in _unique(conn.listed)]
        counts = Counter(_clean(t.name) for _, _, t in listed)
        taken = set(self.reserved)
        tools: list[Tool] = []
        matched: set[str] = set()
        for server, conn, t in listed:
            base = _clean(t.name)
            visible = _fit(f"{server}__{base}" if counts[base] > 1 or base in self.reserved else base)
            while visible in taken:
                visible = _fit(visible + "_")
            taken.add(visible)
            key = next((k for k in (visible, t.name) if k in self.overrides), None)
            if key is not None:
                matched.add(key)
            decided = classify(t.annotations, self._trusted(server, conn.spec),
                               self.overrides.get(key) if key else None)
            tools.append(self._tool(server, conn, t, visible, decided))
        strangers = sorted(self.trust_names - set(names))
        if strangers:
            raise ValueError(f"trust_annotations names {', '.join(map(repr, strangers))}, which is no server here "
                             f"(servers: {', '.join(names)})")
        unknown = sorted(set(self.overrides) - matched)
        if unknown:
            raise ValueError(f"kinds= names {', '.join(map(repr, unknown))}, which no MCP server serves "
                             f"(tools: {', '.join(t.name for t in tools) or 'none'})")
        self.tools = tuple(tools)

    def _tool(self, server: str, conn: Connection, t: Any, visible: str, decided: Classified) -> Tool:
        """A tool declared by the server's schema: its arguments are checked (in full, for any keyword
        beyond the subset) and bound (top-level defaults applied) as for every schema tool, so a
        replay from the log header decides exactly as the run did."""
        schema = t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"}
        out = t.output_schema if isinstance(t.output_schema, dict) else None
        side_effect = decided.kind is ToolKind.SIDE_EFFECT
        group = self

        async def call(**arguments: Any) -> Any:
            return await group._call(conn, server, t.name, arguments, side_effect)

        call.__name__ = call.__qualname__ = visible
        description = t.description or f"{t.name} (a tool of the MCP server {server})"
        info = {"mcp": {"server": server, "tool": t.name, **decided.to_json()}}
        return Tool(visible, description, schema, call, decided.kind,
                    output_model(visible, out) if out is not None else None, decided.untrusted, "async",
                    decided.privileged, info=info)

    async def _call(self, conn: Connection, server: str, name: str, arguments: dict[str, Any],
                    side_effect: bool) -> Any:
        """On the run's loop: hop to the host loop, wait (a cancel here cancels the call there),
        and turn the answer into what the model sees."""
        host = self._host
        try:
            if host is None or self._state != "open":
                raise RuntimeError("closed")
            if host.on_own_thread():  # `async with` on this loop: the session is right here
                answer = await conn.call(name, arguments)
            else:
                answer = await _hop(host, conn, name, arguments)
        except RuntimeError:
            answer = {"ok": False, "error": "server_error", "message": "the MCP session is closed: the tool was "
                      "called outside `with mcp_tools(...)` (or after close())"}
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # this run's own cancel (its timeout, its stop): go on
                raise
            # the call was cancelled on the host's side: the group was closed while it ran
            answer = {"ok": False, "error": "server_error", "message": "the MCP session was closed while the "
                      "call ran"}
        if isinstance(answer, dict):
            out = {"ok": False, "error": answer.get("error", "mcp_error"), "server": server, "tool": name,
                   **{k: v for k, v in answer.items() if k not in ("ok", "error")}}
            if side_effect and out["error"] == "server_error":
                out["side_effects"] = "may have happened: the server went away while the call ran"
            return out
        if getattr(answer, "is_error", False):
            text = result_text(answer.content) or "the tool reported an error and gave no text"
            return {"ok": False, "error": "tool_error", "server": server, "tool": name, "message": text}
        return success_text(answer)


async def _hop(host: Host | LoopHost, conn: Connection, name: str, arguments: dict[str, Any]) -> Any:
    """The call on the host loop, awaited from another loop. An `async with` group's loop that does
    not take the call within STALL_S is blocked (a sync run() inside it waits on this very call):
    the call is withdrawn and answered with an error instead of waiting out the run's timeouts."""
    taken = threading.Event()

    async def call() -> Any:
        taken.set()
        return await conn.call(name, arguments)

    waiter = asyncio.wrap_future(host.submit(call()))
    try:
        if isinstance(host, LoopHost):
            await asyncio.wait({waiter}, timeout=STALL_S)
            if not waiter.done() and not taken.is_set():
                waiter.cancel()
                return {"ok": False, "error": "mcp_error", "message": (
                    f"not sent: the event loop holding this MCP session (opened with `async with`) did not take "
                    f"the call within {STALL_S:g}s; a sync run() inside that loop blocks it: use arun() there, "
                    "or open the group with `with`")}
        return await waiter
    except asyncio.CancelledError:
        waiter.cancel()
        raise


class McpUnavailable(ImportError):
    """The MCP SDK is not installed: `pip install 'loopfence[mcp]'`."""


def _require_sdk() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise McpUnavailable(f"MCP tools need the MCP SDK: pip install 'loopfence[mcp]' ({exc})") from None


async def _quiet(aw: Any) -> None:
    try:
        await asyncio.shield(aw)
    except BaseException:  # noqa: BLE001, S110 - cleanup after a failure already being raised
        pass


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def _unique(listed: list[Any]) -> list[Any]:
    """A server that lists one name twice: the first one counts."""
    seen: set[str] = set()
    out = []
    for t in listed:
        if t.name not in seen:
            seen.add(t.name)
            out.append(t)
    return out


def _clean(name: str) -> str:
    return _fit(_NAME_OK.sub("_", name) or "tool")


def _fit(name: str) -> str:
    if len(name) <= _MAX_NAME:
        return name
    return name[:_MAX_NAME - 9] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]


def _server_names(conns: list[Connection]) -> list[str]:
    """Each server's name: the one given, else its own (from initialize), else mcp1, mcp2...; made
    unique with -2, -3."""
    names: list[str] = []
    for i, conn in enumerate(conns, 1):
        own = getattr(getattr(conn.init, "server_info", None), "name", None) or ""
        base = conn.spec.name or re.sub(r"[^A-Za-z0-9_-]+", "-", own).strip("-_")[:32] or f"mcp{i}"
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names

