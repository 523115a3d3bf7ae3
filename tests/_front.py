"""A round-robin HTTP front for replicas of `loopfence proxy` (issue 35): each request goes to the next
backend in turn, its response streamed back as it arrives (SSE included), like a plain load balancer.

    with Front(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]) as front:
        httpx.post(front.url + "/v1/chat/completions", json=...)
        front.backends[1] = restarted.url   # settable at any time: the next turn takes the new list
        front.routed                        # the backend each request went to, in order

A backend that refuses the connection, or drops it before the response head, gets a 502 with an
OpenAI-shaped error body (`type: bad_gateway`), as nginx answers; nothing is retried (a POST may have
been acted on). A backend that drops mid-body drops the client's connection too (the client sees a
truncated reply, never a clean end). Starlette's ASGI app under uvicorn, in a thread, on 127.0.0.1
(`Served`: any ASGI app served so, e.g. a tiny backend for a test).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Sequence
from typing import Any, Self

import httpx
import uvicorn
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

__all__ = ["Front", "Served"]

START_S = 60.0  # how long the front may take to listen here: bounds a failure, not a speed
# RFC 9110 7.6.1's hop-by-hop fields, plus what the front sets itself (Host, the body's length).
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
                  "proxy-authenticate", "proxy-authorization", "host", "content-length"})


def _end_to_end(headers: Sequence[tuple[bytes, bytes]], *, keep_length: bool) -> list[tuple[bytes, bytes]]:
    """The fields a proxy passes on, repeated ones included (Set-Cookie); names lower-case (as ASGI wants)."""
    drop = _HOP - {"content-length"} if keep_length else _HOP
    return [(k.lower(), v) for k, v in headers if k.decode("latin-1").lower() not in drop]


class Served:
    """An ASGI app under uvicorn in a background thread on 127.0.0.1 (a free port): a context manager;
    `start()`/`stop()` also work. `url`: http://127.0.0.1:PORT."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the server is not running: start() it")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(2048)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app, interface="asgi3", lifespan="off", log_level="warning", access_log=False,
                                proxy_headers=False, server_header=False, date_header=False,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(sock),), name="test-asgi", daemon=True)
        self._thread.start()
        ready = threading.Event()
        for _ in range(int(START_S / 0.02)):
            if self._server.started or not self._thread.is_alive():
                break
            ready.wait(0.02)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"{type(self).__name__} did not start listening on {self.url} in {START_S:.0f} s")
        return self

    async def _serve(self, sock: socket.socket) -> None:
        assert self._server is not None
        try:
            await self._server.serve(sockets=[sock])
        finally:
            sock.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=START_S)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Front(Served):
    """Round-robin over `backends` (base URLs, scheme://host:port, no path); `url` is the front's own
    base URL. `backends` may be changed at any time (a list: replace an item or the whole list)."""

    def __init__(self, backends: Sequence[str]) -> None:
        if not backends:
            raise ValueError("Front needs at least one backend URL")
        super().__init__(self._app)
        self.backends = [b.rstrip("/") for b in backends]
        self.routed: list[str] = []  # the backend each request was sent to, in arrival order
        self._turn = 0
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None

    def _next(self) -> str:
        with self._lock:
            backend = self.backends[self._turn % len(self.backends)]
            self._turn += 1
            self.routed.append(backend)
        return backend

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            response = await self._forward(Request(scope, receive))
            await response(scope, receive, send)

    async def _forward(self, request: Request) -> Response:
        assert self._client is not None
        backend = self._next()
        query = request.scope.get("query_string", b"").decode("latin-1")
        target = backend + request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
        outgoing = self._client.build_request(
            request.method, target + (f"?{query}" if query else ""), content=await request.body(),
            headers=_end_to_end(request.headers.raw, keep_length=False))
        try:
            answer = await self._client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            message = f"{backend} gave no response to {request.method} {request.url.path}: {type(exc).__name__}: {exc}"
            return JSONResponse({"error": {"message": message, "type": "bad_gateway"}}, status_code=502)
        # The body as it arrives, bytes as sent (Content-Encoding passes through). A drop mid-body
        # raises, so uvicorn drops the client's connection instead of ending the body cleanly.
        relayed = StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                    background=BackgroundTask(answer.aclose))
        relayed.raw_headers = _end_to_end(answer.headers.raw, keep_length=True)
        return relayed

    async def _serve(self, sock: socket.socket) -> None:
        # No pool limit (a load test sends 1,000 conversations at once); no read timeout (SSE may idle).
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False,
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        try:
            await super()._serve(sock)
        finally:
            await self._client.aclose()
