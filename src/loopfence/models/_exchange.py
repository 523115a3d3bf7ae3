"""One HTTP attempt of OpenAIModel: send, read, map. Async; no retries and no deadline here (the
caller, `_openai`, owns both), only the configured HTTP timeouts.

An attempt returns a Reply, raises StopError (a named stop), or raises `Retry` (a failure before
anything was used: connection errors, timeouts before a response, a retryable status, a
non-streamed body cut short). A stream that breaks after it began is an incomplete Reply, never a
Retry. Cancelling the awaiting task closes the request's connection (httpx drops a connection
whose response was not read to the end).

Size: a body (a reply, a stream, an error) is counted as it is read, after any Content-Encoding; past
`Wire.max_bytes` the attempt stops with endpoint_error naming the size and the cap (a
Content-Length over it stops before anything is read). Never retried: the endpoint would send it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import httpx

from .._json import loads, wire_body
from .._messages import Reply
from .._stops import StopError, StopReason
from ._errors import error_stop
from ._pool import Pool
from ._retry import parse_retry_after, retryable_status
from ._sse import SSEEvent, aiter_events
from ._stream import StreamEnd, assemble, chunk_of, chunk_texts, reply_from_response

__all__ = ["Retry", "Wire", "attempt", "ON_STREAM_EVENT"]

ON_STREAM_EVENT: ContextVar[Callable[[SSEEvent], None] | None] = ContextVar("loopfence_on_stream_event", default=None)
"""Set around a request by a caller that relays a stream as it arrives (`loopfence proxy`): called with
each SSE event of a streaming 200 as it is read, before the reply is assembled."""


class Retry(Exception):
    """One failed attempt that may be retried; `stop` is what the run gets if it is not."""

    def __init__(self, stop: StopError, retry_after: float | None = None) -> None:
        super().__init__(stop.stop.detail)
        self.stop = stop
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Wire:
    """What an attempt needs from its model."""

    url: str
    where: str  # the URL as it may be shown (no credentials, no query)
    headers: dict[str, str]
    timeout: httpx.Timeout
    read_s: float | None  # the configured read timeout, for the message
    redact: Callable[[str], str]
    max_bytes: int | None = None  # a response body's size at most (None: unbounded)
    text: Callable[[str], None] | None = None  # a stream's answer text, piece by piece, as it arrives
    # how the body is read (another wire than Chat Completions translates to it): a JSON body -> Reply,
    # and an SSE event -> its chat.completion.chunk (or None), as `chunk_of`
    read_json: Callable[[Any], Reply] = reply_from_response
    read_event: Callable[[SSEEvent, StreamEnd], dict[str, Any] | None] = chunk_of


async def attempt(pool: Pool, wire: Wire, body: dict[str, Any], tools: tuple[str, ...]) -> Reply:
    try:
        async with pool.slot(wire.timeout.pool) as client, \
                client.stream("POST", _url(wire.url), content=wire_body(body), headers=wire.headers,
                              timeout=wire.timeout) as resp:
            return await _read(resp, wire, tools)
    except httpx.TimeoutException as exc:
        raise Retry(StopError(StopReason.ENDPOINT_ERROR, f"{_phase(exc)} timeout talking to {wire.where}",
                              error=type(exc).__name__)) from None
    except httpx.TransportError as exc:
        raise Retry(StopError(StopReason.ENDPOINT_ERROR, f"connection error talking to {wire.where}: "
                              f"{type(exc).__name__}: {wire.redact(str(exc))}", error=type(exc).__name__)) from None


@lru_cache(maxsize=64)  # a model's few URLs, each parsed once (httpx parses a str on every request)
def _url(url: str) -> httpx.URL:
    return httpx.URL(url)


async def _read(resp: httpx.Response, wire: Wire, tools: tuple[str, ...]) -> Reply:
    status = resp.status_code
    ctype = resp.headers.get("content-type", "").lower()
    _check_length(resp, wire)
    if not 200 <= status < 300:
        try:
            raw = await _body(resp, wire)
        except httpx.HTTPError:
            raw = b""
        stop = error_stop(status, _json_or_text(raw), tools=tools, redact=wire.redact)
        if retryable_status(status) and stop.stop.reason is StopReason.ENDPOINT_ERROR:
            raise Retry(stop, parse_retry_after(resp.headers))
        raise stop
    if "text/event-stream" in ctype:
        return await _read_stream(resp, wire, tools)
    try:
        raw = await _body(resp, wire)  # a body cut short raises a transport error: retried (nothing was used)
    except httpx.DecodingError as exc:  # e.g. "Content-Encoding: gzip" on a body that is not
        raise StopError(StopReason.ENDPOINT_ERROR, f"HTTP {status}: the body could not be decoded "
                        f"(Content-Encoding: {resp.headers.get('content-encoding', 'none')}): {exc}",
                        status=status) from None
    try:
        obj = loads(raw)  # bounded: nesting and integers (a RecursionError would be a traceback)
    except ValueError as exc:
        raise StopError(StopReason.ENDPOINT_ERROR, f"HTTP {status}: the body is not valid JSON ({exc}): "
                        f"{wire.redact(raw[:120].decode('utf-8', 'replace'))!r}", status=status) from None
    if isinstance(obj, dict) and obj.get("error"):
        raise error_stop(status, obj, tools=tools, redact=wire.redact)
    try:
        return wire.read_json(obj)
    except StopError as exc:
        exc.stop.data.setdefault("status", status)
        raise


async def _read_stream(resp: httpx.Response, wire: Wire, tools: tuple[str, ...]) -> Reply:
    """Chunks are read and parsed as they arrive until [DONE] or the end, their answer text passed
    on to `wire.text` at once; a transport failure after the first byte ends the chunks and is the
    reply's problem (never a retry: part was used)."""
    end = StreamEnd(tools=tools)
    chunks: list[dict[str, Any]] = []
    relay = ON_STREAM_EVENT.get()
    try:
        try:
            async with aclosing(aiter_events(_counted(resp, wire))) as events:
                async for ev in events:
                    if relay is not None:
                        relay(ev)
                    chunk = wire.read_event(ev, end)
                    if end.done or end.problem:
                        break
                    if chunk is not None:
                        chunks.append(chunk)
                        if wire.text is not None:
                            for text in chunk_texts(chunk):
                                wire.text(text)
        except httpx.ReadTimeout:
            end.problem = f"no data for {wire.read_s}s (read timeout) after {end.chunks} chunks"
        except httpx.HTTPError as exc:
            end.problem = f"the stream broke after {end.chunks} chunks: {type(exc).__name__}: {wire.redact(str(exc))}"
        return assemble(chunks, done=end.done, problem=end.problem)
    except StopError as exc:
        exc.stop.data.setdefault("status", resp.status_code)
        exc.stop.data["in_stream"] = True
        raise


def _too_large(resp: httpx.Response, wire: Wire, size: int, how: str) -> StopError:
    return StopError(StopReason.ENDPOINT_ERROR, f"HTTP {resp.status_code}: the response from {wire.where} {how} "
                     f"{size:,} bytes, over max_response_bytes={wire.max_bytes:,}", status=resp.status_code,
                     limit=wire.max_bytes, value=size)


def _check_length(resp: httpx.Response, wire: Wire) -> None:
    """A declared Content-Length over the cap stops before the body is read (plain bodies only: an
    encoded one is counted as it is decoded)."""
    declared = resp.headers.get("content-length", "")
    if wire.max_bytes is not None and declared.isdigit() and int(declared) > wire.max_bytes and \
            resp.headers.get("content-encoding", "identity").lower() == "identity":
        raise _too_large(resp, wire, int(declared), "declares (Content-Length)")


async def _counted(resp: httpx.Response, wire: Wire) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive (decoded), counted: past the cap a named stop, and the rest is
    never read (the connection is dropped)."""
    seen, cap = 0, wire.max_bytes
    async for chunk in resp.aiter_bytes():
        seen += len(chunk)
        if cap is not None and seen > cap:
            raise _too_large(resp, wire, seen, "is at least")
        yield chunk


async def _body(resp: httpx.Response, wire: Wire) -> bytes:
    """The whole body, read within the cap (`_counted`)."""
    return b"".join([chunk async for chunk in _counted(resp, wire)])


def _phase(exc: httpx.TimeoutException) -> str:
    return {httpx.ConnectTimeout: "connect", httpx.ReadTimeout: "read", httpx.WriteTimeout: "write",
            httpx.PoolTimeout: "pool"}.get(type(exc), "")


def _json_or_text(raw: bytes) -> Any:
    try:
        return loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip() or "(empty body)"
