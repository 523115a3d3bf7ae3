"""OpenAIModel: a strict client for any OpenAI-compatible `POST {base_url}/chat/completions`.

    model = OpenAIModel("http://127.0.0.1:8080/v1", "qwen", stream=True)
    model = OpenAIModel.from_env()   # LOOPFENCE_BASE_URL, LOOPFENCE_MODEL, LOOPFENCE_API_KEY / OPENAI_API_KEY

Time: every phase (connect, write, pool, read = the gap between chunks) has a timeout, capped by
what is left until the request's deadline: `request.deadline` (the run's max_wall_seconds) and
`request_timeout`, whichever is sooner. When a deadline is set, the run gets its answer at the
deadline whatever the socket does (the socket is shut down): inside a run, the ring's watchdog
answers (no thread per request); called directly, the exchange runs in a worker thread.

Retries (max_retries, exponential backoff with jitter): connection errors and timeouts before a
response, HTTP 408, 409, 429 and 5xx, and a non-streamed body cut short. `Retry-After` (or
`retry-after-ms`) is honoured when it is at most `retry_after_cap`; a longer one stops the run at
once (endpoint_error) rather than retrying early. A wait that would pass the run's deadline stops
with max_wall_seconds instead of sleeping. Never mid-stream: once a streaming 200 has begun, a
broken stream is an incomplete reply (the ring stops incomplete_stream), not a retry.

Errors map to named stops in `_errors` (context_overflow, tool_use_failed -> the contract
violation, endpoint_error). The API key is sent as `Authorization: Bearer`; it never appears in
`describe()`, in a stop's detail or data, or in the log.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from .._driver import Slot, take_slot
from .._json import loads
from .._messages import Reply, Request
from .._stops import StopError, StopReason
from ._errors import error_stop
from ._retry import Timeouts, backoff_delay, parse_retry_after, retryable_status
from ._sse import iter_events, iter_lines
from ._stream import StreamEnd, assemble_events, reply_from_response
from ._tokencount import ServerTokenCounter

__all__ = ["OpenAIModel", "Timeouts"]

_OURS = ("model", "messages", "tools", "stream", "stream_options")
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class _Retry(Exception):
    """One failed attempt that may be retried; `stop` is what the run gets if it is not."""

    def __init__(self, stop: StopError, retry_after: float | None = None) -> None:
        super().__init__(stop.stop.detail)
        self.stop = stop
        self.retry_after = retry_after


@dataclass(slots=True)
class _Exchange:
    done: threading.Event = field(default_factory=threading.Event)
    result: Reply | None = None
    error: BaseException | None = None
    response: httpx.Response | None = None
    abandoned: bool = False


class OpenAIModel:
    """The Model protocol over HTTP. `complete(request) -> Reply`; `describe()` never shows the key."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, *,
                 stream: bool = False, timeout: Timeouts | None = None, max_retries: int = 3,
                 retry_after_cap: float = 30.0, backoff_base: float = 0.5, backoff_max: float = 8.0,
                 request_timeout: float | None = None, tool_choice: Any = None,
                 extra_params: dict[str, Any] | None = None, include_usage: bool = True,
                 transport: httpx.BaseTransport | None = None, seed: int | None = None) -> None:
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port][/path], got {_safe_url(base_url)!r}")
        base = base_url.strip().rstrip("/")
        if base.endswith("/chat/completions"):
            base = base[: -len("/chat/completions")]
        self.base_url = base
        self.url = base + "/chat/completions"
        self.model = model
        self._key = api_key or None
        self.stream = stream
        self.timeout = timeout or Timeouts()
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
        self.retry_after_cap = retry_after_cap
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self.tool_choice = tool_choice
        self.extra_params = dict(extra_params or {})
        self.include_usage = include_usage
        self.retries = 0  # retries made over this model's life (attempts beyond the first)
        self._rng = random.Random(seed)
        self._client = httpx.Client(transport=transport, follow_redirects=False,
                                    trust_env=parts.hostname not in _LOOPBACK)
        self._counter: ServerTokenCounter | None = None

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 **kwargs: Any) -> OpenAIModel:
        """Arguments first, then LOOPFENCE_BASE_URL / LOOPFENCE_MODEL / LOOPFENCE_API_KEY
        (falling back to OPENAI_API_KEY)."""
        env = os.environ
        url = base_url or env.get("LOOPFENCE_BASE_URL")
        if not url:
            raise ValueError("no base URL: pass --base-url / base_url or set LOOPFENCE_BASE_URL")
        key = api_key or env.get("LOOPFENCE_API_KEY") or env.get("OPENAI_API_KEY")
        return cls(url, model or env.get("LOOPFENCE_MODEL"), key, **kwargs)

    # -- the protocol ----------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"kind": "openai", "base_url": _safe_url(self.base_url), "model": self.model,
                "stream": self.stream, "api_key": "set" if self._key else "not set",
                "timeouts": self.timeout.to_json(), "request_timeout": self.request_timeout,
                "max_retries": self.max_retries, "retry_after_cap": self.retry_after_cap,
                "tool_choice": self.tool_choice, "extra_params": self.extra_params}

    def complete(self, request: Request) -> Reply:
        try:
            return self._complete(request)
        except StopError as exc:  # one last pass: no stop leaves with the key in it
            s = exc.stop
            raise StopError(s.reason, self._redact(s.detail), **{
                k: self._redact(v) if isinstance(v, str) else v for k, v in s.data.items()}) from None

    def _complete(self, request: Request) -> Reply:
        body = self.body(request)
        tools = tuple(t.get("function", {}).get("name", "") for t in request.tools if isinstance(t, dict))
        own = None if self.request_timeout is None else time.monotonic() + self.request_timeout
        run = request.deadline
        deadline = run if own is None else own if run is None else min(run, own)
        slot = take_slot()  # inside a run: this thread is the ring's, and the watchdog keeps time
        retry = 0
        while True:
            self._check_time(deadline, run, "the model request")
            try:
                return self._attempt(body, tools, deadline, run, slot)
            except _Retry as r:
                retry += 1
                status = r.stop.stop.data.get("status")
                if retry > self.max_retries:
                    raise self._give_up(r.stop, f"; gave up after {retry} attempts") from None
                if r.retry_after is not None and r.retry_after > self.retry_after_cap:
                    raise self._give_up(r.stop, f"; the server asks to retry after {r.retry_after:g}s, "
                                        f"over retry_after_cap={self.retry_after_cap:g}s") from None
                delay = r.retry_after if r.retry_after is not None else \
                    backoff_delay(retry, self.backoff_base, self.backoff_max, self._rng)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    left = max(0.0, deadline - time.monotonic())
                    reason = StopReason.MAX_WALL_SECONDS if deadline == run else StopReason.ENDPOINT_ERROR
                    what = "max_wall_seconds" if deadline == run else f"request_timeout={self.request_timeout:g}s"
                    raise StopError(reason, f"{r.stop.stop.detail}; retry {retry} in {delay:.2f}s would pass "
                                    f"{what} ({left:.2f}s left)", status=status, attempts=retry,
                                    retry_in_s=round(delay, 3), left_s=round(left, 3)) from None
                self.retries += 1
                time.sleep(delay)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int | None:
        """The prompt's tokens as a llama.cpp server counts them, or None elsewhere (_tokencount)."""
        if self._counter is None:
            auth = {"Authorization": f"Bearer {self._key}"} if self._key else {}
            self._counter = ServerTokenCounter(self._client, self.base_url, auth)
        return self._counter.count([_outgoing(m) for m in messages], tools)

    def body(self, request: Request) -> dict[str, Any]:
        """The JSON body sent for `request` (params may not override model, messages, tools, stream).
        The run's messages are not changed; an assistant `content: null` is sent as ""."""
        body = {**self.extra_params, **request.params}
        for k in _OURS:
            body.pop(k, None)
        if self.model:
            body["model"] = self.model
        body["messages"] = [_outgoing(m) for m in request.messages]
        if request.tools:
            body["tools"] = request.tools
            if self.tool_choice is not None:
                body.setdefault("tool_choice", self.tool_choice)
        else:
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        if self.stream:
            body["stream"] = True
            if self.include_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one attempt -----------------------------------------------------------------------------
    def _attempt(self, body: dict[str, Any], tools: tuple[str, ...], deadline: float | None,
                 run: float | None, slot: Slot | None = None) -> Reply:
        ex = _Exchange()
        if slot is not None:  # on the ring's runner: the watchdog answers the ring at the deadline
            slot.on_cancel = lambda: _abandon(ex)  # and a Ctrl-C stops the exchange, not just the wait

            def expired() -> Reply:
                _abandon(ex)
                self._check_time(deadline, run, "the model request", force=True)
                raise AssertionError("unreachable: _check_time(force=True) raises")

            if deadline is not None:
                slot.arm(deadline, expired)
            try:
                return self._exchange(body, tools, deadline, ex)
            finally:
                slot.disarm()
        if deadline is None:
            return self._exchange(body, tools, None, ex)
        worker = threading.Thread(target=self._work, args=(ex, body, tools, deadline), daemon=True,
                                  name="loopfence-http")
        worker.start()
        try:
            finished = ex.done.wait(max(0.0, deadline - time.monotonic()))
        except BaseException:
            _abandon(ex)
            raise
        if not finished:
            _abandon(ex)
            self._check_time(deadline, run, "the model request", force=True)
        if ex.error is not None:
            raise ex.error
        assert ex.result is not None
        return ex.result

    def _work(self, ex: _Exchange, body: dict[str, Any], tools: tuple[str, ...], deadline: float) -> None:
        try:
            ex.result = self._exchange(body, tools, deadline, ex)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            ex.error = exc
        finally:
            ex.done.set()

    def _exchange(self, body: dict[str, Any], tools: tuple[str, ...], deadline: float | None,
                  ex: _Exchange) -> Reply:
        left = None if deadline is None else deadline - time.monotonic()
        headers = {"Accept": "text/event-stream" if self.stream else "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            with self._client.stream("POST", self.url, json=body, headers=headers,
                                     timeout=self.timeout.bounded(left)) as resp:
                ex.response = resp
                if ex.abandoned:
                    return Reply(None, (), None, None, {}, False, "abandoned at the deadline")
                return self._read(resp, tools)
        except httpx.TimeoutException as exc:
            raise _Retry(StopError(StopReason.ENDPOINT_ERROR, f"{_phase(exc)} timeout talking to "
                                   f"{_safe_url(self.url)}", error=type(exc).__name__)) from None
        except httpx.TransportError as exc:
            raise _Retry(StopError(StopReason.ENDPOINT_ERROR, f"connection error talking to "
                                   f"{_safe_url(self.url)}: {type(exc).__name__}: {self._redact(str(exc))}",
                                   error=type(exc).__name__)) from None

    def _read(self, resp: httpx.Response, tools: tuple[str, ...]) -> Reply:
        status = resp.status_code
        ctype = resp.headers.get("content-type", "").lower()
        if not 200 <= status < 300:
            try:
                raw = resp.read()
            except httpx.HTTPError:
                raw = b""
            body = _json_or_text(raw)
            stop = self._error(status, body, tools)
            if retryable_status(status) and stop.stop.reason is StopReason.ENDPOINT_ERROR:
                raise _Retry(stop, parse_retry_after(resp.headers))
            raise stop
        if "text/event-stream" in ctype:
            return self._read_stream(resp, tools)
        raw = resp.read()  # a body cut short raises a transport error: retried (nothing was used)
        try:
            obj = loads(raw)  # bounded: nesting and integers (a RecursionError would be a traceback)
        except ValueError as exc:
            raise StopError(StopReason.ENDPOINT_ERROR, f"HTTP {status}: the body is not valid JSON "
                            f"({exc}): {self._redact(raw[:120].decode('utf-8', 'replace'))!r}",
                            status=status) from None
        if isinstance(obj, dict) and obj.get("error"):
            raise self._error(status, obj, tools)
        try:
            return reply_from_response(obj)
        except StopError as exc:
            exc.stop.data.setdefault("status", status)
            raise

    def _read_stream(self, resp: httpx.Response, tools: tuple[str, ...]) -> Reply:
        end = StreamEnd(tools=tools)
        read_s = self.timeout.read

        def lines() -> Any:
            try:
                yield from iter_lines(resp.iter_bytes())
            except httpx.ReadTimeout:
                end.problem = f"no data for {read_s}s (read timeout) after {end.chunks} chunks"
            except httpx.HTTPError as exc:
                end.problem = (f"the stream broke after {end.chunks} chunks: {type(exc).__name__}: "
                               f"{self._redact(str(exc))}")

        try:
            return assemble_events(iter_events(lines()), end)
        except StopError as exc:
            exc.stop.data.setdefault("status", resp.status_code)
            exc.stop.data["in_stream"] = True
            raise

    # -- helpers ---------------------------------------------------------------------------------
    def _error(self, status: int, body: Any, tools: tuple[str, ...]) -> StopError:
        return error_stop(status, body, tools=tools, redact=self._redact)

    def _redact(self, text: str) -> str:
        if self._key and len(self._key) >= 3:
            text = text.replace(self._key, "***")
        return text

    def _give_up(self, stop: StopError, why: str) -> StopError:
        s = stop.stop
        return StopError(s.reason, s.detail + why, **s.data)

    def _check_time(self, deadline: float | None, run: float | None, what: str, force: bool = False) -> None:
        if deadline is None or (not force and time.monotonic() < deadline):
            return
        if deadline == run:
            raise StopError(StopReason.MAX_WALL_SECONDS, f"{what} was cut off at the run's deadline "
                            "(max_wall_seconds)")
        raise StopError(StopReason.ENDPOINT_ERROR, f"{what} took longer than request_timeout="
                        f"{self.request_timeout:g}s", request_timeout=self.request_timeout)


def _outgoing(message: dict[str, Any]) -> dict[str, Any]:
    """A message as sent: an assistant message's null content goes as "" (llama-cpp-python's server
    answers HTTP 500 to null, and its template fails without the key; OpenAI and vLLM take "")."""
    if message.get("role") == "assistant" and message.get("content") is None:
        return {**message, "content": ""}
    return message


def _abandon(ex: _Exchange) -> None:
    """Stop a worker's exchange: shut its socket down so a blocked read returns at once."""
    ex.abandoned = True
    resp = ex.response
    if resp is None:
        return
    stream = resp.extensions.get("network_stream")
    try:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass


def _phase(exc: httpx.TimeoutException) -> str:
    return {httpx.ConnectTimeout: "connect", httpx.ReadTimeout: "read", httpx.WriteTimeout: "write",
            httpx.PoolTimeout: "pool"}.get(type(exc), "")


def _json_or_text(raw: bytes) -> Any:
    try:
        return loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip() or "(empty body)"


def _safe_url(url: str) -> str:
    """The URL without user:password and without a query string (either could carry a secret)."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if p.port:
        host = f"{host}:{p.port}"
    return urlunsplit((p.scheme, host, p.path, "", ""))
