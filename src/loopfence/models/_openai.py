"""OpenAIModel: a strict client for any OpenAI-compatible `POST {base_url}/chat/completions`.

    model = OpenAIModel("http://127.0.0.1:8080/v1", "qwen", stream=True)
    model = OpenAIModel.from_env()   # LOOPFENCE_BASE_URL, LOOPFENCE_MODEL, LOOPFENCE_API_KEY / OPENAI_API_KEY
    reply = await model.acomplete(request)   # the adapter: async, on httpx.AsyncClient
    reply = model.complete(request)          # the same exchange from sync code (see _sync)

One pool: a model keeps one AsyncClient per running event loop (`_pool`), so any number of
concurrent runs on a loop share its connections (`limits`: 100 connections by default, all kept
alive; requests beyond them wait their turn, at most the pool timeout).

Time: each phase (connect, write, pool, read = the gap between chunks) has its configured timeout
(`Timeouts`), and the request as a whole `request_timeout`, by cancellation (`asyncio.timeout`):
the request is cancelled, its connection closed, and the stop is endpoint_error. The run's own
wall clock is not the adapter's to keep: the run cancels the awaiting task at max_wall_seconds
(as on a Ctrl-C), which closes the request in flight the same way and propagates CancelledError.

Retries (max_retries, exponential backoff with jitter): connection errors and timeouts before a
response, HTTP 408, 409, 429 and 5xx, and a non-streamed body cut short. `Retry-After` (or
`retry-after-ms`) is honoured when it is at most `retry_after_cap`; a longer one stops the run at
once (endpoint_error) rather than retrying early. A wait that would pass request_timeout stops
at once (endpoint_error) instead of sleeping. Never mid-stream: once a streaming 200 has begun, a broken
stream is an incomplete reply (the ring stops incomplete_stream), not a retry.

Size: a response body is read within `max_response_bytes` (default 32 MiB; None: unbounded), counted
as it arrives; a larger one stops the run (endpoint_error, with the size and the cap), never retried.

Errors map to named stops in `_errors` (context_overflow, tool_use_failed -> the contract
violation, endpoint_error). The API key is sent as `Authorization: Bearer`; it never appears in
`describe()`, in a stop's detail or data, or in the log.

Each request of a run carries the run's id (its log header's `run_id`; a resumed run keeps it) as
`X-Loopfence-Run-Id`, so a server can tell concurrent runs apart: `loopfence.testing.FakeServer`
serves each run its own reply sequence by it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import random
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from .._json import Encoded
from .._keywords import keywords_checked
from .._messages import Reply, Request
from .._stops import StopError, StopReason
from ._base import report_retry, text_sink
from ._exchange import Retry, Wire, attempt
from ._pool import Borrowed, LoopClients
from ._retry import Timeouts, backoff_delay
from ._sse import SSEEvent
from ._stream import StreamEnd
from ._sync import SyncLoop
from ._tokencount import ServerTokenCounter

__all__ = ["OpenAIModel", "Timeouts", "RUN_ID_HEADER", "MAX_RESPONSE_BYTES", "TOKEN_CAPS", "cap_tokens"]

RUN_ID_HEADER = "X-Loopfence-Run-Id"  # each request's run (the log header's run_id), where it has one

MAX_RESPONSE_BYTES = 32 << 20  # one response body, as read (OpenAIModel's default max_response_bytes)
_OURS = ("model", "messages", "tools", "stream", "stream_options")
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@keywords_checked
class OpenAIModel:
    """The Model protocol over HTTP: `await acomplete(request)` (or sync `complete`) -> Reply;
    `describe()` never shows the key. `transport` (an httpx.AsyncBaseTransport, e.g. MockTransport)
    is borrowed: shared by every loop's client, never closed here. `close()` / `await aclose()`
    (or `with` / `async with`) closes the connections."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, *,
                 stream: bool = False, timeout: Timeouts | None = None, max_retries: int = 3,
                 retry_after_cap: float = 30.0, backoff_base: float = 0.5, backoff_max: float = 8.0,
                 request_timeout: float | None = None, tool_choice: Any = "auto",
                 extra_params: dict[str, Any] | None = None, include_usage: bool = True,
                 transport: httpx.AsyncBaseTransport | None = None, seed: int | None = None,
                 limits: httpx.Limits | None = None,
                 max_response_bytes: int | None = MAX_RESPONSE_BYTES) -> None:
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
        if max_response_bytes is not None and (type(max_response_bytes) is not int or max_response_bytes < 1):
            raise ValueError(f"max_response_bytes must be a positive integer or None, got {max_response_bytes!r}")
        self.max_response_bytes = max_response_bytes
        self.retry_after_cap = retry_after_cap
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self.tool_choice = tool_choice
        self.extra_params = dict(extra_params or {})
        self.include_usage = include_usage
        self.retries = 0  # retries made over this model's life (attempts beyond the first)
        self._rng = random.Random(seed)
        self.limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=100)
        self._transport = None if transport is None else Borrowed(transport)
        self._trust_env = parts.hostname not in _LOOPBACK
        self._clients = LoopClients(self._new_client, self.limits.max_connections)
        self._ssl: ssl.SSLContext | None = None  # made once (~30 ms), shared by every loop's client
        self._counter: ServerTokenCounter | None = None
        self._sync = SyncLoop("loopfence-openai-sync")  # the sync calls' loop (started on first use)

    def _new_client(self) -> httpx.AsyncClient:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(trust_env=self._trust_env)
        return httpx.AsyncClient(transport=self._transport, limits=self.limits, follow_redirects=False,
                                 trust_env=self._trust_env, verify=self._ssl)

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
                "tool_choice": self.tool_choice, "extra_params": self.extra_params,
                "max_response_bytes": self.max_response_bytes}

    async def acomplete(self, request: Request) -> Reply:
        try:
            return await self._acomplete(request)
        except StopError as exc:  # one last pass: no stop leaves with the key in it
            st = exc.stop
            raise StopError(st.reason, self._redact(st.detail), **{
                k: self._redact(v) if isinstance(v, str) else v for k, v in st.data.items()}) from None

    def complete(self, request: Request) -> Reply:
        """`acomplete` from sync code, on the model's own event loop (`_sync.SyncLoop`): its client
        and connections last from one call to the next."""
        return self._sync.run(lambda: self.acomplete(request))

    async def acount_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int | None:
        """The prompt's tokens as a llama.cpp server counts them, or None elsewhere (_tokencount)."""
        if self._counter is None:
            auth = {"Authorization": f"Bearer {self._key}"} if self._key else {}
            self._counter = ServerTokenCounter(self.base_url, auth)
        return await self._counter.count(self._clients.get().client, [_outgoing(m) for m in messages], tools)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int | None:
        """`acount_tokens` from sync code (as `complete`)."""
        return self._sync.run(lambda: self.acount_tokens(messages, tools))

    async def _acomplete(self, request: Request) -> Reply:
        tools = tuple(t.get("function", {}).get("name", "") for t in request.tools if isinstance(t, dict))
        text = text_sink(request) if self.stream else None  # stream(): the answer's text as it arrives
        return await self.apost(self.body(request), tools=tools, run_id=request.run_id, text=text)

    async def apost(self, body: dict[str, Any], *, url: str | None = None, headers: dict[str, str] | None = None,
                    read_json: Callable[[Any], Reply] | None = None,
                    read_event: Callable[[SSEEvent, StreamEnd], dict[str, Any] | None] | None = None,
                    tools: tuple[str, ...] = (), run_id: str | None = None,
                    text: Callable[[str], None] | None = None) -> Reply:
        """`body` POSTed as it is, with this model's retries, timeouts and bounds, to `url` (default
        `self.url`), with `headers` in place of the Bearer key (another wire's auth), read as Chat
        Completions or by `read_json` / `read_event` (another wire translated to it): the Reply, or
        StopError. `acomplete` is this with the request's Chat Completions body."""
        wire = self._wire(run_id, text, url, headers)
        if read_json or read_event:
            wire = dataclasses.replace(wire, **({"read_json": read_json} if read_json else {}),
                                       **({"read_event": read_event} if read_event else {}))
        deadline = None if self.request_timeout is None else time.monotonic() + self.request_timeout
        retry = 0
        while True:
            self._check_time(deadline)
            try:
                return await self._bounded(lambda: attempt(self._clients.get(), wire, body, tools), deadline)
            except Retry as r:
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
                    raise StopError(StopReason.ENDPOINT_ERROR, f"{r.stop.stop.detail}; retry {retry} in "
                                    f"{delay:.2f}s would pass request_timeout={self.request_timeout:g}s "
                                    f"({left:.2f}s left)", status=status, attempts=retry,
                                    retry_in_s=round(delay, 3), left_s=round(left, 3)) from None
                self.retries += 1
                report_retry(retry, status if isinstance(status, int) else None, round(delay, 3),
                             r.stop.stop.detail)
                await asyncio.sleep(delay)

    async def _bounded(self, work: Callable[[], Coroutine[Any, Any, Reply]], deadline: float | None) -> Reply:
        """One attempt, cancelled at the deadline (its connection closed), which is then a stop."""
        if deadline is None:
            return await work()
        timer = asyncio.timeout(max(0.0, deadline - time.monotonic()))
        try:
            async with timer:
                return await work()
        except TimeoutError:
            if not timer.expired():
                raise
        self._check_time(deadline, force=True)
        raise AssertionError("unreachable: _check_time(force=True) raises")

    def _wire(self, run_id: str | None = None, text: Callable[[str], None] | None = None, url: str | None = None,
              auth: dict[str, str] | None = None) -> Wire:
        """What an attempt needs: to `url` (default `self.url`), with `auth` in place of the Bearer key."""
        headers = {"Accept": "text/event-stream" if self.stream else "application/json",
                   "Content-Type": "application/json"}  # the body: _json.wire_body
        if run_id:  # which run asks: a server may key its state by it (FakeServer: one reply sequence per run)
            headers[RUN_ID_HEADER] = run_id
        if auth is not None:
            headers.update(auth)
        elif self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        url = url or self.url
        return Wire(url, _safe_url(url), headers, self.timeout.bounded(None), self.timeout.read,
                    self._redact, self.max_response_bytes, text)

    def body(self, request: Request) -> dict[str, Any]:
        """The JSON body sent for `request` (params may not override model, messages, tools, stream).
        The run's messages are not changed; an assistant `content: null` is sent as "" (a message of an
        `Encoded` list with its bytes kept stays as it is here: those bytes, written before, are sent).

        With tools, `tool_choice` goes too: the model's (default "auto", the OpenAI default, said
        out loud: llama-cpp-python's server ignores tools sent without it), unless params (or
        extra_params) set one; a `tool_choice` of None there sends none. Without tools, neither
        goes. `request.max_tokens` (the run's bound) goes as `max_tokens`, or under the name the
        params use (`max_completion_tokens`, which OpenAI's newer models want), never above
        a value the params give. A stream asks for its usage (`stream_options.include_usage`)."""
        body = {**self.extra_params, **request.params}
        for k in _OURS:
            body.pop(k, None)
        if self.model:
            body["model"] = self.model
        messages = request.messages
        if type(messages) is Encoded:  # kept bytes stay with their messages; a message sent as them is not looked at
            kept, n, first = messages.parts, len(messages.parts), messages.written()
            sent = messages[:first]  # (those with their bytes kept from the start: copied in C, not one by one)
            sent += [m if i < n and kept[i] is not None else _outgoing(m)
                     for i, m in enumerate(messages[first:], first)]
            body["messages"] = Encoded(sent, kept)
        else:
            body["messages"] = [_outgoing(m) for m in messages]
        if request.tools:
            body["tools"] = request.tools
            if "tool_choice" not in body:
                body["tool_choice"] = self.tool_choice
            if body["tool_choice"] is None:
                del body["tool_choice"]
        else:
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        if request.max_tokens is not None:
            cap_tokens(body, request.max_tokens)
        if self.stream:
            body["stream"] = True
            if self.include_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def close(self) -> None:
        """Close every loop's client (see LoopClients.close); the sync calls' loop closes its own first."""
        self._sync.close(self._clients.release)
        self._clients.close()

    async def aclose(self) -> None:
        """Close this loop's client (awaited) and the others as close() does."""
        await self._clients.release()
        self._sync.close(self._clients.release)
        self._clients.close()

    def __enter__(self) -> OpenAIModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> OpenAIModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- helpers ---------------------------------------------------------------------------------
    def _redact(self, text: str) -> str:
        if self._key and len(self._key) >= 3:
            text = text.replace(self._key, "***")
        return text

    def _give_up(self, stop: StopError, why: str) -> StopError:
        s = stop.stop
        return StopError(s.reason, s.detail + why, **s.data)

    def _check_time(self, deadline: float | None, force: bool = False) -> None:
        if deadline is None or (not force and time.monotonic() < deadline):
            return
        raise StopError(StopReason.ENDPOINT_ERROR, f"the model request took longer than request_timeout="
                        f"{self.request_timeout:g}s", request_timeout=self.request_timeout)


# every field a known Chat Completions server reads as the reply's token count: OpenAI's two, and
# llama.cpp's n_predict (read before max_tokens there); docs/proxy.md lists each wire's
TOKEN_CAPS = ("max_tokens", "max_completion_tokens", "n_predict")


def cap_tokens(body: dict[str, Any], cap: int, names: tuple[str, ...] = TOKEN_CAPS,
               default: str = "max_tokens") -> None:
    """Every completion cap `names` in `body` at most `cap` (a value that is not a positive integer,
    llama.cpp's -1 for "no limit" among them, is replaced); `default: cap` when there is none."""
    for name in [n for n in names if n in body] or [default]:
        given = body.get(name)
        ok = isinstance(given, int) and not isinstance(given, bool) and given >= 1
        body[name] = min(given, cap) if ok else cap


def _outgoing(message: dict[str, Any]) -> dict[str, Any]:
    """A message as sent: an assistant message's null content goes as "" (llama-cpp-python's server
    answers HTTP 500 to null, and its template fails without the key; OpenAI and vLLM take "")."""
    if message.get("role") == "assistant" and message.get("content") is None:
        return {**message, "content": ""}
    return message


@functools.lru_cache(maxsize=64)  # each request's URL as shown: a model's few URLs, parsed once each
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
