"""`Proxy`: the upstream, the runs and the app, put together; `serve` runs it under uvicorn on a
bound socket until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import sys
import time
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..tools._registry import ToolKind
from ._access import Access
from ._app import MAX_BODY, create_app
from ._load import BUDGET, MAX_CONCURRENT, Load
from ._restore import restore
from ._redis import RedisRuns
from ._runs import Runs, Settings
from ._upstream import Upstream, upstream_key

__all__ = ["Proxy", "load_kinds", "serve", "Connections"]

KEEP_ALIVE_S = 75  # an idle client connection is kept this long (nginx's default)
HEADER_TIMEOUT_S = 10.0  # a connection must send a whole request head within this long (slowloris)
MAX_CONNECTIONS = 1024  # client connections at once, at most (fewer under a low descriptor limit)
NOTICE_S = 10.0  # at most one line on stderr this often about refused connections or exhausted descriptors
# descriptors kept for the proxy's own: open run logs and notes (2 x Runs.max_open_logs), upstream connections for the
# requests at work, Redis, stdio
SPARE_FDS = 256 + 2 * 64 + 32


def load_kinds(path: str | Path) -> dict[str, ToolKind]:
    """A TOML file of `tool_name = "kind"` (top level, or under a `[kinds]` table): side_effect,
    poll, or read_only (taken as side_effect: the proxy cannot answer from a cache, see
    docs/proxy.md). ValueError naming the file, the tool and the value."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--kinds {path}: {exc}") from None
    table = data.get("kinds", data) if isinstance(data.get("kinds"), dict) else data
    out = {}
    for name, kind in table.items():
        if kind not in ("side_effect", "poll", "read_only"):
            raise ValueError(f"--kinds {path}: tool {name!r} has kind {kind!r}; "
                             "a kind is \"side_effect\", \"poll\" or \"read_only\"")
        out[str(name)] = ToolKind.POLL if kind == "poll" else ToolKind.SIDE_EFFECT
    return out


class Proxy:
    """The fence on the wire. `upstream`: an OpenAI-compatible base URL (`.../v1`), or None for the
    embedded model; its key from `key`, else LOOPFENCE_UPSTREAM_KEY, else OPENAI_API_KEY. `wires`:
    another wire's own upstream by name (`{"anthropic": ROOT}`); its requests are translated to the
    Chat Completions one without. `keys`: the client keys (none: any client; an empty one is a
    ValueError). `hosts`: the names a request's Host may give besides IP literals and localhost (None:
    any); `origins`: the browser origins allowed (`_access`). `max_concurrent`, `max_memory` (bytes):
    what it takes on at once (`_load`). `app`: the ASGI app."""

    def __init__(self, upstream: str | None = None, settings: Settings | None = None, *,
                 keys: Iterable[str] = (), key: str | None = None, max_body: int = MAX_BODY,
                 transport: httpx.AsyncBaseTransport | None = None, local: Any = None,
                 state: str | None = None, lease: float = 30.0, wires: dict[str, str] | None = None,
                 hosts: Iterable[str] | None = (), origins: Iterable[str] = (),
                 max_concurrent: int = MAX_CONCURRENT, max_memory: int = BUDGET) -> None:
        access = Access(keys, hosts, origins)  # first: an empty key is refused before anything is made
        load = Load(max_concurrent, max_memory)
        self.settings = settings or Settings()
        if self.settings.logs is not None:
            self.settings.logs.mkdir(parents=True, exist_ok=True)
        self.upstream = Upstream(upstream, key or upstream_key(), local=local, transport=transport, wires=wires)
        self.runs = Runs(self.upstream, self.settings) if state is None else \
            RedisRuns(self.upstream, self.settings, state, lease=lease)
        self.app = create_app(self.runs, max_body=max_body, access=access, load=load)

    async def restore(self) -> int:
        """Fold back the runs logged in the log folder (a restart): how many continue. On Redis the
        state is the store's: the replica joins it (a warning on stderr while it cannot be reached)."""
        if isinstance(self.runs, RedisRuns):
            problem = await self.runs.connect()
            if problem is not None:
                print(f"loopfence proxy: warning: the run state store ({self.runs.describe_store()}) cannot be "
                      f"reached ({problem}); requests get 503 until it can", file=sys.stderr, flush=True)
            return 0
        return await restore(self.runs)

    async def aclose(self) -> None:
        await self.upstream.aclose()
        await self.runs.aclose()


class Connections:
    """What the server takes of its clients' connections: `limit` at once, each sending a whole request
    head within `header_timeout` seconds; a connection over the limit closes the oldest that is not
    at work on a request (a half-sent head, an idle keep-alive), else itself. What is closed is said
    on stderr at most every NOTICE_S seconds, in one line, as is running out of descriptors."""

    def __init__(self, limit: int = MAX_CONNECTIONS, header_timeout: float = HEADER_TIMEOUT_S) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:  # all the descriptors the process may have: clients, logs and upstreams share them
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
        spare = SPARE_FDS  # what the proxy itself holds open besides its clients
        self.limit = limit if soft == resource.RLIM_INFINITY else max(8, min(limit, soft - spare))
        self.header_timeout = header_timeout
        self.closed = {"slow": 0, "over": 0, "emfile": 0}
        self._said = 0.0

    def notice(self, what: str) -> None:
        self.closed[what] += 1
        now = time.monotonic()
        if now - self._said >= NOTICE_S:
            self._said = now
            parts = {"slow": f"sent no whole request head within {self.header_timeout:g}s",
                     "over": f"were over --max-connections {self.limit}",
                     "emfile": "could not be accepted (no file descriptors left)"}
            said = "; ".join(f"{n} {parts[k]}" for k, n in self.closed.items() if n)
            print(f"loopfence proxy: connections closed: {said}", file=sys.stderr, flush=True)
            self.closed = dict.fromkeys(self.closed, 0)

    def protocol(self) -> type[H11Protocol]:
        """uvicorn's HTTP/1.1 protocol under these bounds."""
        limits = self

        class Guarded(H11Protocol):
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                self.opened = time.monotonic()
                self.head_timer: asyncio.TimerHandle | None = None
                self._arm()
                if len(self.connections) > limits.limit:
                    idle = [c for c in self.connections if c is not self and isinstance(c, Guarded) and _idle(c)
                            and not c.transport.is_closing()]
                    victim = min(idle, key=lambda c: c.opened, default=self)  # type: ignore[attr-defined]
                    limits.notice("over")
                    victim.transport.abort()

            def _arm(self) -> None:
                if self.head_timer is not None:
                    self.head_timer.cancel()
                self.head_timer = self.loop.call_later(limits.header_timeout, self._head_late)

            def _head_late(self) -> None:
                self.head_timer = None
                if _idle(self) and not self.transport.is_closing():
                    limits.notice("slow")
                    self.transport.abort()

            def data_received(self, data: bytes) -> None:
                if self.head_timer is None and _idle(self):  # the first bytes of the next request's head: timed
                    self._arm()  # (an idle keep-alive connection is uvicorn's, closed after KEEP_ALIVE_S)
                super().data_received(data)

            def handle_events(self) -> None:
                super().handle_events()
                if not _idle(self) and self.head_timer is not None:  # a head came: the request is at work
                    self.head_timer.cancel()
                    self.head_timer = None

            def connection_lost(self, exc: Exception | None) -> None:
                if self.head_timer is not None:
                    self.head_timer.cancel()
                super().connection_lost(exc)

        return Guarded

    def on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's error handler: running out of descriptors while accepting is one line per
        NOTICE_S (the default logs a traceback per attempt); anything else as the default does."""
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            self.notice("emfile")
            return
        loop.default_exception_handler(context)


def _idle(c: H11Protocol) -> bool:
    """Not at work on a request: no request head yet, or its response sent."""
    return c.cycle is None or c.cycle.response_complete


class _Server(uvicorn.Server):
    """uvicorn, ending on SIGTERM or Ctrl-C with exit 0 (it would raise the signal again after its
    graceful shutdown)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit = True


async def serve(proxy: Proxy, host: str, port: int, announce: Callable[[str], None],
                connections: Connections | None = None) -> None:
    """Listen on host:port (0: any free port), call `announce(url)` once listening, serve until a signal,
    holding its clients' connections to `connections`."""
    connections = connections or Connections()
    asyncio.get_running_loop().set_exception_handler(connections.on_loop_error)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for a TCP-proto
    # socket; without it each reply (head and body written apart) waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    # Keep-alive past the clients' own (httpx and the OpenAI SDKs drop an idle connection after 5 s,
    # uvicorn's default too): with equal timeouts a client may send on a connection the server is
    # closing, and gets a ReadError for a request that never arrived (seen at 100 conversations at once).
    config = uvicorn.Config(proxy.app, log_level="warning", lifespan="off", access_log=False,
                            timeout_graceful_shutdown=5, timeout_keep_alive=KEEP_ALIVE_S,
                            http=connections.protocol(), ws="none")
    server = _Server(config)
    await proxy.restore()
    announce(f"http://{shown}:{bound}/v1")
    try:
        await server.serve(sockets=[sock])
    finally:
        await proxy.aclose()
        sys.stdout.flush()
