"""Where MCP sessions live: the host loop of a `mcp_tools()` group.

An MCP session (the SDK's anyio streams and task groups) belongs to the event loop that opened it,
opened and closed there by one owner task each (anyio requires that the task that enters a
transport also exits it). Which loop:

- `open()` / `with` (sync code, `run()`, the CLI): an event loop on a daemon thread of its own
  (`Host`). `run()` drives the ring on a runner thread with a loop of its own (and moves to a fresh
  one when an operation passes its deadline), so a tool call hops to the host loop with
  `run_coroutine_threadsafe`: two cross-thread wake-ups, 0.3-0.5 ms a call on small VMs.
- `aopen()` / `async with` (`arun()`, `abatch()`): the running loop itself (`LoopHost`). A call
  awaited on that loop awaits the session directly, no hop; a call from another loop hops to it
  as above (and is refused, not left waiting, when that loop does not pick it up: a sync `run()`
  called inside the loop blocks it).

Either way, cancelling the awaiting (the tool's timeout, the run's cancel) cancels the call on the
host loop, and the SDK then sends the MCP `notifications/cancelled` to the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import signal
import threading
import time
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from typing import Any

from ._spec import McpServer

__all__ = ["CONNECTION_CLOSED", "Connection", "Host", "LoopHost", "McpServerError", "StderrTail", "leaf_error",
           "open_all"]

CONNECTION_CLOSED = -32000  # the SDK's JSON-RPC code for a transport that went away
_TAIL_BYTES = 4000
_CLOSE_WAIT_S = 30.0  # the SDK bounds a stdio shutdown (stdin closed, 2 s, SIGTERM to the group, 2 s, SIGKILL)


class McpServerError(RuntimeError):
    """An MCP server that could not be started, connected to or listed: names it and its stderr tail."""

    def __init__(self, server: str, message: str, stderr: str = "") -> None:
        self.server, self.detail, self.stderr = server, message, stderr
        text = f"MCP server {server}: {message}"
        if stderr:
            text += "\n  its stderr ends with:\n    " + "\n    ".join(stderr.splitlines()[-15:])
        super().__init__(text)


class StderrTail:
    """A stdio server's stderr: a pipe drained by a daemon thread that keeps only the last bytes
    (a server that writes forever cannot fill a disk or block on a full pipe)."""

    def __init__(self, keep: int = _TAIL_BYTES) -> None:
        r, w = os.pipe()
        self.writer = os.fdopen(w, "wb", buffering=0)  # handed to the child; ours is closed after the spawn
        self._r, self._keep = r, keep
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.ended = threading.Event()  # every writer closed its end (the server and its children exited)
        threading.Thread(target=self._pump, name="loopfence-mcp-stderr", daemon=True).start()

    def _pump(self) -> None:
        try:
            while chunk := os.read(self._r, 65536):
                with self._lock:
                    self._buf += chunk
                    if len(self._buf) > 2 * self._keep:
                        del self._buf[:-self._keep]
        except OSError:
            pass
        finally:
            os.close(self._r)
            self.ended.set()

    def close_writer(self) -> None:
        if not self.writer.closed:
            self.writer.close()

    def text(self) -> str:
        with self._lock:
            data = bytes(self._buf[-self._keep:])
        return data.decode("utf-8", "replace").strip()


def leaf_error(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, as anyio task groups raise them."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


_SPAWNED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("loopfence_mcp_spawned", default=None)


def _watch_spawns() -> None:
    """Learn the pid of each stdio server the SDK starts (in a new session: its pid is its process
    group), for the sweep after close. The SDK keeps it private, so its spawn function is wrapped
    (once, for every caller; it only records into the owner task's own list). Without that function
    (another SDK version) there is no sweep: the SDK's own shutdown still stops the server."""
    try:
        import mcp.client.stdio as stdio
    except ImportError:
        return
    original = getattr(stdio, "_create_platform_compatible_process", None)
    if original is None or getattr(original, "_loopfence", False):
        return

    async def spawn(*args: Any, **kwargs: Any) -> Any:
        process = await original(*args, **kwargs)
        sink = _SPAWNED.get()
        if sink is not None:
            sink.append(process.pid)
        return process

    spawn._loopfence = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = spawn


def _sweep(pgids: list[int]) -> None:
    """Kill what is left of a stopped stdio server's process group: a server that exited on its own
    may leave children behind (the SDK kills the group only when the server itself does not stop).
    Linux never hands out a pid that is still some group's id, so a group still there is this one."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _session_class() -> type:
    from mcp import ClientSession

    class Session(ClientSession):  # type: ignore[misc]
        async def validate_tool_result(self, name: str, result: Any) -> None:
            """loopfence checks structuredContent against the outputSchema itself (a result-model
            violation, logged and named), instead of the SDK raising from inside call_tool."""
            return None

    return Session


class Connection:
    """One server's session, owned by one task on the host loop from open to close."""

    def __init__(self, spec: McpServer, timeout_s: float | None) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.session: Any = None
        self.init: Any = None  # the InitializeResult
        self.listed: list[Any] = []  # the server's tools (SDK Tool objects)
        self.tail: StderrTail | None = None
        self.lost: str | None = None  # why the connection ended early
        self.http_error: str | None = None  # the last HTTP error status a Streamable HTTP server answered
        self.startup_s: float | None = None  # from spawning (or connecting) to its tools listed

    def stderr(self) -> str:
        return self.tail.text() if self.tail is not None else ""

    async def settled_stderr(self, wait_s: float = 1.0) -> str:
        """The stderr tail once the pipe is drained (a server that just died may still have bytes in
        flight), waiting at most `wait_s` (its children may hold the pipe open)."""
        if self.tail is not None and not self.tail.ended.is_set():
            await asyncio.get_running_loop().run_in_executor(None, self.tail.ended.wait, wait_s)
        return self.stderr()

    async def serve(self, ready: asyncio.Future[None], closing: asyncio.Event) -> None:
        """Open the transport and the session, list the tools, then hold them until `closing`."""
        import anyio
        from mcp.types import Implementation

        spawned: list[int] = []
        _SPAWNED.set(spawned)  # this task's own context: only its spawns land here
        began = time.monotonic()
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                session = await stack.enter_async_context(
                    _session_class()(read, write, client_info=Implementation(name="loopfence", version=_version())))
                with anyio.fail_after(self.timeout_s):
                    self.init = await session.initialize()
                    self.listed = await _list_tools(session)
                self.startup_s = round(time.monotonic() - began, 3)
                self.session = session
                ready.set_result(None)
                await closing.wait()
                self.session = None
        except BaseException as exc:  # noqa: BLE001 - reported to the opener, or kept as why it ended
            self.session = None
            error = leaf_error(exc)
            if not ready.done():
                if isinstance(error, asyncio.CancelledError):
                    ready.cancel()
                else:
                    stderr = "" if isinstance(exc, asyncio.CancelledError) else await self.settled_stderr()
                    message = _startup_message(error, self.timeout_s, self.spec.transport)
                    if self.http_error:
                        message += f" ({self.http_error})"
                    ready.set_exception(McpServerError(f"{self.spec.label()} ({self.spec.transport})",
                                                       message, stderr))
            else:
                self.lost = f"{type(error).__name__}: {error}"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            _sweep(spawned)

    async def _transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        spec = self.spec
        if spec.command:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            _watch_spawns()
            params = StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]),
                                           env=dict(spec.env) or None, cwd=spec.cwd)
            self.tail = StderrTail()
            try:  # the child holds its own copy of the pipe's write end from here on
                streams = await stack.enter_async_context(stdio_client(params, errlog=self.tail.writer))
            finally:
                self.tail.close_writer()
            return streams[0], streams[1]
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        async def saw(response: Any) -> None:  # the SDK turns a 401 into "an error response": keep the status
            if response.status_code >= 400:
                self.http_error = f"HTTP {response.status_code} {response.reason_phrase}".strip()

        http = await stack.enter_async_context(httpx2.AsyncClient(
            headers=dict(spec.headers), timeout=httpx2.Timeout(30.0, read=300.0), follow_redirects=False,
            event_hooks={"response": [saw]}))
        streams = await stack.enter_async_context(streamable_http_client(spec.url or "", http_client=http))
        return streams[0], streams[1]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """On the host loop: the CallToolResult, or an error dict (the server is gone, or answered
        with a JSON-RPC error). A cancel propagates (the SDK tells the server first)."""
        from mcp.shared.exceptions import MCPError

        session = self.session
        if session is None:
            return {"ok": False, "error": "server_error", "message": "the MCP session is not open"
                    + (f" (it ended: {self.lost})" if self.lost else ""), **self._stderr_field(self.stderr())}
        try:
            return await session.call_tool(name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                return {"ok": False, "error": "server_error",
                        "message": f"the MCP server closed the connection: {exc.message}",
                        **self._stderr_field(await self.settled_stderr())}
            return {"ok": False, "error": "mcp_error", "code": exc.code, "message": exc.message}
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed answer, a transport failure: data for the model
            return {"ok": False, "error": "mcp_error", "message": f"{type(exc).__name__}: {exc}"}

    @staticmethod
    def _stderr_field(tail: str) -> dict[str, str]:
        return {"stderr_tail": tail[-1000:]} if tail else {}


async def _list_tools(session: Any) -> list[Any]:
    """Every page of tools/list (bounded: a server that pages forever is refused)."""
    tools: list[Any] = []
    cursor = None
    for _ in range(100):
        if cursor is None:
            page = await session.list_tools()
        else:
            from mcp.types import PaginatedRequestParams

            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
    raise RuntimeError("tools/list returned more than 100 pages")


def _startup_message(error: BaseException, timeout_s: float | None, transport: str) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer to initialize/tools/list within {timeout_s:g}s"
    if isinstance(error, FileNotFoundError):
        return f"cannot start it: {error.strerror or error}: {error.filename!r}"
    if isinstance(error, PermissionError):
        return f"cannot start it: {error.strerror or error}: {error.filename!r}"
    code = getattr(error, "code", None)
    if code == CONNECTION_CLOSED:
        return "it closed the connection before the session started" + \
            (" (did the process exit?)" if transport == "stdio" else "")
    verb = "did not start" if transport == "stdio" else "no session"
    return f"{verb}: {type(error).__name__}: {error}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopfence")
    except PackageNotFoundError:
        return "0"


class Host:
    """An event loop on a daemon thread, started here and stopped by `stop()`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._stop_lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="loopfence-mcp", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            _close_loop(self.loop)

    def on_own_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run `coro` on the host loop; RuntimeError when the host is stopped."""
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the MCP host loop is stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout_s: float = _CLOSE_WAIT_S) -> None:
        """Stop the loop (once: a second stop landing while the thread closes the loop would cut
        that short) and, from another thread, wait for the thread to end."""
        with self._stop_lock:
            first, self._stopping = not self._stopping, True
        if first and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)


class LoopHost:
    """`Host`'s interface over an event loop that is already running (the one `aopen()` ran on):
    nothing to start or stop; the sessions end with the group's close or the loop's end."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("the MCP host loop is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def on_own_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def stop(self, timeout_s: float = 0.0) -> None:
        pass


async def open_all(conns: list[Connection], closing: asyncio.Event) -> list[asyncio.Task[None]]:
    """On the host loop: start every server at once; all open (their owner tasks returned, holding the
    sessions until `closing`), or all closed again and the first error raised."""
    loop = asyncio.get_running_loop()
    readies = [loop.create_future() for _ in conns]
    tasks = [loop.create_task(c.serve(r, closing)) for c, r in zip(conns, readies)]
    try:
        outcomes = await asyncio.gather(*readies, return_exceptions=True)
    except asyncio.CancelledError:
        closing.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        closing.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise errors[0]
    return tasks


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what was left on the host's loop, then close it."""
    try:
        left = asyncio.all_tasks(loop)
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
