"""A chat endpoint on 127.0.0.1 that answers every request "ok" over keep-alive HTTP/1.1 and counts
the TCP connections it accepts: for the tests of connection reuse."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OK_REPLY", "CountingServer", "counting_server"]

OK_REPLY = {"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


class CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.accepted = 0  # TCP connections accepted
        self.peers: list[int] = []  # the client's port for each chat request: one per connection
        self.bodies: list[dict[str, Any]] = []  # the chat requests' JSON bodies

    def get_request(self) -> Any:
        conn = super().get_request()
        self.accepted += 1
        return conn

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: CountingServer

    def do_POST(self) -> None:  # noqa: N802
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        self.server.peers.append(self.client_address[1])
        self._send(200, OK_REPLY)

    def do_GET(self) -> None:  # noqa: N802 - a token counter's probe (GET /props): not llama.cpp, kept alive
        self._send(404, {"error": {"message": "no such route"}})

    def _send(self, status: int, reply: dict[str, Any]) -> None:
        body = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def counting_server() -> Iterator[CountingServer]:
    srv = CountingServer()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
