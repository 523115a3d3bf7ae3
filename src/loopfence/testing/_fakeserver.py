"""FakeServer: a real OpenAI-compatible HTTP server on 127.0.0.1 that serves scripted replies.

    with FakeServer([calls_reply(tool_call("read_file", path="a.txt")), text_reply("done")]) as srv:
        model = OpenAIModel(srv.base_url, "fake")      # srv.base_url == "http://127.0.0.1:PORT/v1"
        ...
        srv.requests   # the JSON bodies received, in order

`POST .../chat/completions` gets the scripted replies in order; the last one repeats. Each run gets
its own sequence: `OpenAIModel` sends the run's id (`X-Loopfence-Run-Id`, the log header's
`run_id`), and the server keeps one position in the replies per id, so two runs, or 20 concurrent
ones, each get the script from its first reply (`srv.runs`: the bodies each run sent). Clients that
send no id share one sequence, and so do all runs with `FakeServer(..., across_runs=True)` (the turns
of a conversation, each run taking the script's next replies). A reply counts as served only once it has been written whole to a
client still there: when the client went away before its last byte (a write failed, or the client
closed its end; as with most HTTP servers, a half-closed connection counts as gone), or reset the
connection with the reply unread (a process killed before it read the reply), the run's next request
gets that reply again (`srv.undelivered`: the run id and 0-based script position of each). A fault's
reply is served once the fault has played out: a client that gives up on a stall, and retries, gets
the next reply. `GET .../models` lists one model, "fake". Standard library only
(ThreadingHTTPServer in a thread).

Reply forms (JSON objects; the drill's scenario files and `loopfence fake-server` use the same):

  {"choices": [...], ...}              a chat.completions response object: HTTP 200 JSON; when the
                                       request asked for `stream: true`, it is sent as SSE chunks
                                       instead (role, content, each call with its arguments in two
                                       fragments, finish_reason, usage, [DONE])
  {"chunks": [chunk, ...], "done": true}
                                       text/event-stream: one `data:` event per chunk (a chunk that
                                       is a string is sent verbatim, e.g. broken JSON), then
                                       `data: [DONE]` unless "done" is false. Sent as SSE whether
                                       or not the request asked to stream (clients read by
                                       Content-Type, as with real servers that ignore `stream`)
  {"sse": "<raw body>"}                a raw text/event-stream body, byte for byte
  {"status": 429, "body": {...} | "text", "headers": {"Retry-After": "1"}}
                                       an HTTP error (or any status) with that body and headers

Faults ({"fault": NAME, ...}; the reply a fault disturbs is given inline as "chunks"/"sse" or as
"reply": <any form above>):

  slow_stream     "delay_s" (0.2) before every event (a read timeout shorter than it trips);
                  for a JSON body, once between the headers and the body
  stall           "delay_s" (1.0) before the response headers, then "reply" (a text reply)
  reset           sends "after" events (half, at least 1), then a TCP reset (RST) mid-stream;
                  for a JSON body, half the bytes then the reset
  truncated       Content-Length of the whole body, sends the first "at" fraction (0.5), closes
  missing_done    the chunks without the final [DONE]
  empty_stream    HTTP 200 text/event-stream with an empty body (llama-cpp-python's answer to a
                  streaming request with tool_choice "auto")
  error_event     "chunks" (may be empty) then `event: error` with "body" (a server error)
  close           closes the connection without sending a response
  rate_limit      HTTP 429 with `Retry-After: "retry_after"` (1) and an OpenAI-shaped body
  server_error    HTTP "status" (500) with an error body
  invalid_json    HTTP 200 application/json whose body ("body", default '{"choices": [') is not JSON
  overflow        HTTP 400 context overflow in "shape": "llama.cpp" | "openai" | "vllm" (wrapped)
                  | "vllm_flat", with "n_prompt_tokens" (5000) and "n_ctx" (4096)
  tool_use_failed HTTP 400 `tool_use_failed` (Groq) with "failed_generation" and "message"
  empty_choices   HTTP 200 with `choices: []` (as SSE chunks + [DONE] when the request streams)
  anonymous_call  a tool call ("name", "arguments") without id or index (streamed or not, as asked)
"""

from __future__ import annotations

import heapq
import json
import select
import socket
import struct
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .._json import loads
from ._replyforms import FAULTS, FormError, Plan, load_forms, overflow_body, render, response_to_chunks, validate_form

__all__ = ["FakeServer", "FAULTS", "FormError", "load_forms", "overflow_body", "response_to_chunks",
           "validate_form", "RUN_HEADER"]

RUN_HEADER = "x-loopfence-run-id"  # (lower case) the run a request belongs to; OpenAIModel sends it


class FakeServer:
    """Scripted replies over real HTTP on 127.0.0.1. A context manager; `start()`/`close()` also work."""

    ROUTE = "/chat/completions"  # the POST route it serves (a subclass serving another wire sets its own)

    def __init__(self, replies: Sequence[dict[str, Any]], *, port: int = 0, host: str = "127.0.0.1",
                 across_runs: bool = False) -> None:
        if not replies:
            raise FormError("FakeServer needs at least one reply form")
        for i, form in enumerate(replies, 1):
            try:
                validate_form(form)
            except FormError as exc:
                raise FormError(f"reply {i}: {exc}") from None
        self.replies = list(replies)
        self.across_runs = across_runs  # True: one sequence for all runs (a conversation's turns, in turn)
        self.requests: list[dict[str, Any]] = []  # JSON bodies received by chat/completions
        self.headers: list[dict[str, str]] = []  # their request headers (lower-case names)
        self.runs: dict[str | None, list[dict[str, Any]]] = {}  # the bodies per run id (None: sent none)
        self.undelivered: list[tuple[str | None, int]] = []  # (run id, script position) never written whole
        self._position: dict[str | None, int] = {}  # per run: the next script position not yet handed out
        self._again: dict[str | None, list[int]] = {}  # per run: positions handed out, not delivered (a heap)
        self._handed = threading.local()  # .out: (run id, position) of the reply this handler thread sends
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the fake server is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    @property
    def served(self) -> int:
        return len(self.requests)

    def start(self) -> FakeServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        httpd = _Server((self._host, self._port), handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="loopfence-fake-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """The reply form for a request: the first position of its run's own sequence not delivered
        yet (handed out to this handler thread, `_handed.out`; `_give_back` returns it)."""
        sent = headers.get(RUN_HEADER) or None
        run = None if self.across_runs else sent
        with self._lock:
            self.runs.setdefault(sent, []).append(body)
            self.requests.append(body)
            self.headers.append(headers)
            again = self._again.get(run)
            if again:
                i = heapq.heappop(again)
            else:
                i = self._position.get(run, 0)
                self._position[run] = i + 1
            self._handed.out = (run, i)
            return self.replies[min(i, len(self.replies) - 1)]

    def _give_back(self, out: tuple[str | None, int]) -> None:
        """A reply handed out never reached its client whole: the run's next request gets it."""
        with self._lock:
            heapq.heappush(self._again.setdefault(out[0], []), out[1])
            self.undelivered.append(out)


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # many concurrent runs connect at once; the default backlog is 5


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # keep-alive replies would otherwise stall ~40 ms on delayed ACKs
    fake: FakeServer  # set on the per-server subclass
    unread: tuple[str | None, int] | None = None  # the last reply, until the client shows it read it

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def do_GET(self) -> None:  # noqa: N802
        self.unread = None
        if self.path.rstrip("/").endswith("/models"):
            self._send(Plan(200, {"Content-Type": "application/json"}, [json.dumps(
                {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "loopfence"}]}).encode()]))
        else:
            self._not_found()

    def do_POST(self) -> None:  # noqa: N802
        self.unread = None  # a new request: the client read the reply before it
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self.path.split("?")[0].rstrip("/").endswith(self.fake.ROUTE):
            self._not_found()
            return
        try:
            body = loads(raw)
        except ValueError:
            body = {"_unparseable": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.fake._handed.out = None
        form = self.fake._next(body if isinstance(body, dict) else {"_body": body}, headers)
        handed = None if "fault" in form else self.fake._handed.out  # (a subclass's `_next` hands none out)
        streaming = isinstance(body, dict) and body.get("stream") is True
        if not self._send(render(form, streaming)):
            if handed is not None:
                self.fake._give_back(handed)
        elif not self.close_connection:
            self.unread = handed  # until the client sends its next request or closes without a reset

    def _not_found(self) -> None:
        self._send(Plan(404, {"Content-Type": "application/json"},
                        [json.dumps({"error": {"message": f"no route {self.path}", "code": 404}}).encode()]))

    def _wait(self, seconds: float) -> bool:
        """Sleep unless the server is stopping; False when it is."""
        return not (seconds > 0 and self.fake._stopping.wait(seconds))

    def _client_there(self) -> bool:
        """False once the client closed its end (FIN) or reset the connection."""
        sock = self.connection
        try:
            ready, _, _ = select.select([sock], [], [], 0)
            return not ready or sock.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def _last(self, data: bytes) -> bool:
        """Write the reply's last bytes; True when the client was still there for them."""
        there = self._client_there()
        self.wfile.write(data)
        self.wfile.flush()
        return there

    def _send(self, plan: Plan) -> bool:
        """Send the reply; True when it was written whole (a fault's reply as the fault shapes it)."""
        try:
            return self._deliver(plan)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError):
            self.close_connection = True  # the client went away: nothing more to do
            return False

    def _deliver(self, plan: Plan) -> bool:
        if plan.close:
            self._reset(graceful=True)
            return True
        if not self._wait(plan.stall_s):
            return False
        body = b"".join(plan.parts)
        self.send_response(plan.status)
        for k, v in plan.headers.items():
            self.send_header(k, v)
        if plan.truncate_at is not None:
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: int(len(body) * plan.truncate_at)])
            self.wfile.flush()
            self._reset(graceful=True)
            return True
        if not plan.stream:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            if not self._wait(plan.delay_s):
                return False
            if plan.reset_after is not None:  # half the body, then a reset
                self.wfile.write(body[: len(body) // 2])
                self._reset(graceful=False)
                return True
            return self._last(body)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        for n, part in enumerate(plan.parts):
            if plan.reset_after is not None and n >= plan.reset_after:
                self._reset(graceful=False)
                return True
            if not self._wait(plan.delay_s):
                return False
            chunk = b"%x\r\n%s\r\n" % (len(part), part)
            # The last part holds the stream's end ([DONE]): a client may close as soon as it reads it,
            # before the chunked terminator below, so whether it was there is judged before this part.
            if n == len(plan.parts) - 1 and plan.reset_after is None:
                there = self._last(chunk)
                try:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:  # it read the end and left: delivered all the same
                    self.close_connection = True
                return there
            self.wfile.write(chunk)
            self.wfile.flush()
        if plan.reset_after is not None and plan.reset_after >= len(plan.parts) and plan.parts:
            self._reset(graceful=False)
            return True
        return self._last(b"0\r\n\r\n")

    def _reset(self, graceful: bool) -> None:
        """Close the connection now: a FIN (graceful) or a TCP reset (RST)."""
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        sock = self.connection
        try:
            if graceful:
                sock.shutdown(socket.SHUT_RDWR)
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        for f in (self.wfile, self.rfile):  # the descriptor closes (and the RST goes) with the last one
            try:
                f.close()
            except (OSError, ValueError):
                pass
        sock.close()

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionResetError:  # closed with data unread: the last reply was never read
            if self.unread is not None:
                self.fake._give_back(self.unread)
        except (OSError, ValueError):  # a connection we reset or the client dropped
            pass

    def finish(self) -> None:
        try:
            super().finish()
        except (OSError, ValueError):
            pass
