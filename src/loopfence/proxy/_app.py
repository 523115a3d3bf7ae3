"""The HTTP side: a Starlette app (`create_app`) serving the OpenAI routes and the proxy's own.

    POST /v1/chat/completions   streamed or not; every answer carries X-Loopfence-Run
    GET  /v1/models             passed through from the upstream
    /run/NAME/v1/...            the same, under the run name NAME (a base URL names the run)
    GET  /loopfence/runs        this client's runs, oldest first: ledger and stop (?limit=N&after=ID pages)
    GET  /loopfence/runs/{id}   one of them, by id or by this client's run name
    POST /loopfence/runs/{id}/reset   end it (its log gets its stop line) and free its name
    anything else               404 as JSON in the shape of the wire its path belongs to

The run name is the `X-Loopfence-Run` header; else the first session header an agent sends
(`SESSION_HEADERS`, then `Settings.session_headers`) names a session, whose conversations are runs of
their own (`Runs.answer`); each scoped to the client's key.

Client keys, hosts, browsers and the body's type are `_access.Access`'s: with keys, every route wants
one of them, and a client sees only the runs opened with its own key. The body is read within
`max_body` bytes.
Each request's work runs in a task of its own, so a client that goes away mid-request leaves the run's
accounting whole (its retry gets the answer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._json import loads
from . import _anthropic, _gemini, _responses
from ._access import Access, Refused
from ._load import Load
from ._prefix import parsed
from ._answer import RUN_HEADER, Answer, sse
from ._runs import RUN_ID, Runs
from ._upstream import CLIENT_KEYS
from ._view import known_before
from ._wire import BadRequest, Incoming, parse

__all__ = ["create_app", "MAX_BODY", "SESSION_HEADERS", "run_name", "SERVED"]

# the client headers a request of another wire takes upstream: its version and beta flags, and its key
# (sent only where the proxy has no key of its own for that upstream, and takes no client keys)
FORWARDED = ("anthropic-version", "anthropic-beta", *CLIENT_KEYS)

MAX_BODY = 16 << 20  # bytes of one request body, at most
BODY_TIMEOUT_S = 60.0  # a request body must arrive whole within this long
LIST_LIMIT, MAX_LIST_LIMIT = 100, 1000  # GET /loopfence/runs: runs a page holds by default, and at most
# The session ids real agents send, each naming a session (docs/proxy.md, "Which run a request belongs
# to"): opencode's, LiteLLM's (OpenHands, LiteLLM clients), Claude Code's, Codex's (session-id, then thread-id).
SESSION_HEADERS = ("x-session-id", "x-litellm-session-id", "x-claude-code-session-id", "session-id", "thread-id")


def run_name(headers: Any, session_headers: Iterable[str] = SESSION_HEADERS) -> tuple[str | None, str | None]:
    """(the run name, the session) a request gives: its `X-Loopfence-Run` header (as sent: a bad one
    is refused by name) names one run; else its first session header names a session, a scope of
    conversations (one that is not a run id goes by its digest)."""
    named = headers.get(RUN_HEADER)
    if named is not None:
        return str(named), None
    for h in session_headers:
        sid = headers.get(h)
        if sid:
            return None, sid if RUN_ID.fullmatch(sid[:120]) and len(sid) <= 120 else \
                f"s-{hashlib.sha256(sid.encode()).hexdigest()[:24]}"
    return None, None


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status,
                        headers=headers)


def create_app(runs: Runs, *, keys: Iterable[str] = (), max_body: int = MAX_BODY,
               access: Access | None = None, load: Load | None = None) -> Any:
    """The proxy's ASGI app over `runs` (see the module doc), behind `access` (default: `keys`, the
    local hosts, no browser origins), taking on at most what `load` allows (`_load`)."""
    access = access or Access(keys)
    load = load or Load()
    allowed = access.keys
    owner = access.owner
    sessions = (*SESSION_HEADERS, *(h.lower() for h in runs.settings.session_headers))
    tasks: set[asyncio.Task[Any]] = set()  # requests at work (kept from the garbage collector)

    async def body_of(request: Request, deep: bool = True) -> tuple[Any, Any]:
        """The request's JSON body, weighed before it is parsed, and its messages' reading begun if read
        from its bytes (else None). `deep=False` (Chat Completions): its nesting is checked by its wire's
        parse (the messages it has not seen before only), and the body is read from its bytes: from
        where the known conversation whose bytes it begins with stopped, if any (`_prefix`)."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body:
            raise BadRequest(f"the request body is {int(length)} bytes, over the proxy's limit of {max_body}",
                             None, 413)
        parts, size = [], 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):  # a body sent a byte at a time holds a request slot
                async for part in request.stream():
                    parts.append(part)
                    size += len(part)
                    if size > max_body:
                        raise BadRequest(f"the request body is over the proxy's limit of {max_body} bytes", None,
                                         413)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {BODY_TIMEOUT_S:g}s", None, 408) from None
        raw = b"".join(parts)  # copied once (a bytearray grown piece by piece copies it as it grows, then again)
        del parts
        known = None if deep else known_before(raw)
        load.take(request.scope, raw, known.counts if known is not None else None)  # its weight once parsed,
        got = None if deep else parsed(raw, known)  # before it is parsed (413, 429)
        if got is not None:
            return got
        try:
            return loads(raw, strict=True, deep=deep), None
        except ValueError as exc:
            raise BadRequest(f"the request body is not valid JSON: {str(exc)[:200]}") from None

    def refused(dialect: Any, status: int, message: str, param: str | None = None, code: str | None = None,
                headers: dict[str, str] | None = None) -> JSONResponse:
        """An error in the shape of the request's wire (Chat Completions: OpenAI's)."""
        if dialect is not None:
            return JSONResponse(dialect.error(status, message), status, headers=headers)
        return _error(status, message, param=param, code=code, headers=headers)

    async def completions(request: Request) -> Response:
        return await serve_wire(request, None)

    async def messages(request: Request) -> Response:
        return await serve_wire(request, _anthropic)

    async def responses(request: Request) -> Response:
        return await serve_wire(request, _responses)

    async def serve_wire(request: Request, dialect: Any, read: Any = None) -> Response:
        """One request of a wire (`dialect`: its translating module, `read` its parse for this route;
        None: Chat Completions)."""
        try:
            who = owner(request)
            body, started = await body_of(request, deep=dialect is not None)
            incoming = (read or dialect.parse)(body) if dialect is not None else parse(body, started)
        except Refused as no:
            return refused(dialect, no.status, no.message, code=no.code,
                           headers={"Retry-After": "1"} if no.status == 429 else None)
        except BadRequest as exc:
            return refused(dialect, exc.status, exc.message, exc.param) if dialect is not None else \
                JSONResponse(exc.body(), exc.status)
        if dialect is not None:
            incoming = dataclasses.replace(incoming, forward=tuple(forwarded(request).items()))
        named, session = run_name(request.headers, sessions)
        in_path = request.path_params.get("name")
        if in_path is not None:  # the name in the base URL (`/run/NAME/v1`): a run name, as the header
            if not RUN_ID.fullmatch(in_path):
                return refused(dialect, 400, "the run name in the base URL (/run/NAME/v1) must be 1-128 "
                               "characters of A-Z a-z 0-9 . _ - (starting with a letter or digit)", "path")
            if named is not None and named != in_path:
                return refused(dialect, 400, f"the run is named twice: {in_path!r} in the path and "
                               f"{named[:128]!r} in X-Loopfence-Run; send one", RUN_HEADER)
            named, session = in_path, None
        ua = request.headers.get("user-agent", "")
        if session is not None and named is None:  # its digests scoped to its session, once (`Runs.answer` takes them)
            incoming = incoming.scoped(session)
        whole = incoming.whole  # the request's digest as its run keeps it: delivery marks it
        if incoming.stream:
            return await _streamed(incoming, named, ua, who, session, dialect, whole, request.scope)
        task = _spawn(runs.answer(incoming, named=named, user_agent=ua, owner=who, session=session), request.scope)
        watch = asyncio.ensure_future(request.receive())  # the client's next message: http.disconnect if it goes
        try:
            answer, _ = await asyncio.shield(task)
        except BadRequest as exc:
            return refused(dialect, exc.status, exc.message, exc.param) if dialect is not None else \
                JSONResponse(exc.body(), exc.status)
        finally:
            gone = _left(watch)
        status, out = dialect.render(answer) if dialect is not None else (answer.status, answer.body())
        return JSONResponse(out, status, headers=answer.headers(),
                            background=None if gone else _delivered(answer, whole, [True]))

    def _delivered(answer: Answer, whole: str, sent: list[bool]) -> BackgroundTask:
        """Run once the response is over (`Runs.delivered`), if it reached its end (`sent[0]`: a stream
        the client left is cut before it): the same request again is then a new one. A client gone
        before its answer is its retry's within RETRY_S."""
        async def mark() -> None:
            if sent[0]:
                await runs.delivered(answer.run_id, whole)
        return BackgroundTask(mark)

    async def _streamed(incoming: Incoming, named: str | None, ua: str, who: str | None, session: str | None,
                        dialect: Any, whole: str, scope: dict[str, Any]) -> Response:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        rid: list[str] = []
        task = _spawn(runs.answer(incoming, named=named, user_agent=ua, owner=who, relay=queue.put_nowait,
                                  on_run=rid.append, session=session), scope)
        task.add_done_callback(lambda _: queue.put_nowait(None))
        first = await queue.get()
        if first is None:  # nothing streamed: the whole answer is known, headers included
            try:
                answer, _ = task.result()
            except BadRequest as exc:
                return refused(dialect, exc.status, exc.message, exc.param) if dialect is not None else \
                    JSONResponse(exc.body(), exc.status)
            if answer.status != 200:
                status, out = dialect.render(answer) if dialect is not None else (answer.status, answer.body())
                return JSONResponse(out, status, headers=answer.headers())
            parts = [*dialect.stream_head(answer), *dialect.stream_tail(answer, "")] if dialect is not None \
                else answer.stream_tail("", incoming.include_usage)
            sent = [False]
            return StreamingResponse(_iterate(parts, sent), media_type="text/event-stream", headers=answer.headers(),
                                     background=_delivered(answer, whole, sent))
        head = Answer("", f"chatcmpl-lf-{uuid.uuid4().hex[:24]}", incoming.model or "", {}, "stop",
                      created=int(time.time()))
        sent = [False]
        return StreamingResponse(_iterate(_relayed(first, queue, task, head, incoming.include_usage, dialect), sent),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", RUN_HEADER: rid[-1] if rid else ""},
                                 background=BackgroundTask(_relay_delivered, task, whole, sent))

    async def _relay_delivered(task: asyncio.Task[Any], whole: str, sent: list[bool]) -> None:
        if sent[0] and task.done() and not task.cancelled() and task.exception() is None:
            await runs.delivered(task.result()[0].run_id, whole)

    def _spawn(coro: Any, scope: dict[str, Any]) -> asyncio.Task[Any]:
        """The request's work in a task of its own, counted as the request's (`Load.hold`) until it ends."""
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        load.hold(scope)
        task.add_done_callback(lambda t: (tasks.discard(t), load.release(scope)))
        return task

    async def count_tokens(request: Request) -> Response:
        """POST /v1/messages/count_tokens: passed through to the Anthropic upstream, outside any run."""
        return await passed(request, _anthropic, "/v1/messages/count_tokens")

    async def passed(request: Request, dialect: Any, path: str) -> Response:
        """A request of `dialect` passed through to its upstream's `path`, outside any run."""
        try:
            owner(request)
            body, _ = await body_of(request)
        except Refused as no:
            return refused(dialect, no.status, no.message, code=no.code,
                           headers={"Retry-After": "1"} if no.status == 429 else None)
        except BadRequest as exc:
            return refused(dialect, exc.status, exc.message)
        status, out = await runs.upstream.passthrough(dialect.NAME, path, body, forwarded(request))
        return JSONResponse(out, status)

    def forwarded(request: Request) -> dict[str, str]:
        """The client headers a request of another wire takes upstream (its key only where the proxy
        takes no client keys: then it is the proxy's, never the upstream's)."""
        forward = {h: v for h in FORWARDED if (v := request.headers.get(h))}
        if request.query_params.get("key") and "x-goog-api-key" not in forward:
            forward["x-goog-api-key"] = request.query_params["key"]  # Google's clients may send it in the URL
        return {h: v for h, v in forward.items() if not (allowed and h in CLIENT_KEYS)}

    async def gemini(request: Request) -> Response:
        """POST /v1beta/models/MODEL:METHOD: generateContent and streamGenerateContent fenced,
        countTokens passed through outside any run, any other method a 404 in Google's shape."""
        model, _, method = request.path_params["target"].rpartition(":")
        if method == "countTokens":
            return await passed(request, _gemini, f"/v1beta/models/{model}:countTokens")
        if method not in ("generateContent", "streamGenerateContent") or not model:
            return _unknown_route(request.method, request.url.path)
        stream = method == "streamGenerateContent"
        return await serve_wire(request, _gemini, lambda body: _gemini.parse(body, model, stream))

    async def models(request: Request) -> Response:
        try:
            owner(request)
        except Refused as no:
            return _error(no.status, no.message, code=no.code)
        status, body = await runs.upstream.models()
        return JSONResponse(body, status)

    async def list_runs(request: Request) -> Response:
        try:
            who = owner(request)
        except Refused as no:
            return _error(no.status, no.message, code=no.code)
        limit = request.query_params.get("limit", str(LIST_LIMIT))
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIST_LIMIT:
            return _error(400, f"limit= is a number of runs from 1 to {MAX_LIST_LIMIT}, got {limit[:20]!r}", param="limit")
        try:
            data, more = await runs.listing(who, request.query_params.get("after") or None, int(limit))
        except BadRequest as exc:
            return JSONResponse(exc.body(), exc.status)
        return JSONResponse({"object": "list", "data": data, "has_more": more,
                             "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})

    def run_route(act: Any) -> Any:
        """A route on one of this client's runs (by id or run name): `act(rid, who)`, 404 if none."""
        async def route(request: Request) -> Response:
            try:
                who = owner(request)
            except Refused as no:
                return _error(no.status, no.message, code=no.code)
            rid = request.path_params["run_id"]
            try:
                run = await act(rid, who)
            except BadRequest as exc:
                return JSONResponse(exc.body(), exc.status)
            if run is None:
                return _error(404, f"no run {rid!r} for this client", code="run_not_found")
            return JSONResponse(run, headers={RUN_HEADER: run["id"]})
        return route

    async def not_served(request: Request) -> Response:
        return _unknown_route(request.method, request.url.path)

    return access.middleware(load.middleware(Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/run/{name}/v1/chat/completions", completions, methods=["POST"]),
        Route("/run/{name}/v1/models", models, methods=["GET"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1beta/models/{target}", gemini, methods=["POST"]),
        Route("/run/{name}/v1beta/models/{target}", gemini, methods=["POST"]),
        Route("/run/{name}/v1/responses", responses, methods=["POST"]),
        Route("/run/{name}/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/run/{name}/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/loopfence/runs", list_runs, methods=["GET"]),
        Route("/loopfence/runs/{run_id}", run_route(runs.one), methods=["GET"]),
        Route("/loopfence/runs/{run_id}/reset", run_route(runs.reset), methods=["POST"]),
        Route("/{path:path}", not_served, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
    ]), shaped), shaped)


SERVED = ("POST /v1/chat/completions, GET /v1/models, POST /v1/responses, POST /v1/messages (Anthropic), "
          "POST /v1beta/models/MODEL:generateContent and :streamGenerateContent (Gemini), "
          "POST /v1/messages/count_tokens (each also under /run/NAME, naming the run), "
          "GET /loopfence/runs, GET /loopfence/runs/{id}, POST /loopfence/runs/{id}/reset")


def _unknown_route(method: str, path: str) -> JSONResponse:
    """A route the proxy does not serve: 404 as JSON in the shape of the wire the path belongs to
    (Anthropic Messages, Gemini, else OpenAI's), naming what it serves; never a plain-text 404."""
    what = f"loopfence proxy does not serve {method} {path[:200]}: it serves {SERVED}"
    if "/v1/v1/" in path:
        what += ("; the base URL has /v1 twice: an Anthropic client (ANTHROPIC_BASE_URL) takes the proxy's root, "
                 "http://HOST:PORT, with no /v1")
    return shaped(path, 404, what, "unknown_route")


def shaped(path: str, status: int, message: str, code: str) -> JSONResponse:
    """An error as JSON in the shape of the wire `path` belongs to (Anthropic Messages, Gemini, else OpenAI's)."""
    if "/messages" in path:
        return JSONResponse(_anthropic.error(status, message), status)
    if path.startswith(("/v1beta/", "/v1alpha/")) or "/v1beta/" in path:
        return JSONResponse({"error": {"code": status, "message": message, "status": _GOOGLE.get(status, "UNKNOWN")}},
                            status)
    return _error(status, message, code=code)


_GOOGLE = {403: "PERMISSION_DENIED", 404: "NOT_FOUND", 415: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED"}


def _left(watch: asyncio.Task[Any]) -> bool:
    """Whether the client left while its answer was made: `watch` awaits its next ASGI message from
    when its body was read, which is `http.disconnect` once it goes (asked before the response: after
    it, always so); cancelled here if it has not come. (Starlette's `Request.is_disconnected` asks
    through an anyio cancel scope, which writes out the task's repr each time: 60 µs a request.)"""
    if not watch.done():
        watch.cancel()
        return False
    return not watch.cancelled() and watch.exception() is None and watch.result().get("type") == "http.disconnect"


async def _iterate(parts: Any, sent: list[bool]) -> AsyncIterator[bytes]:
    """`parts` (a list, or an async iterator) as a response body; `sent[0]` once the last was given."""
    if isinstance(parts, list):
        for p in parts:
            yield p
    else:
        async for p in parts:
            yield p
    sent[0] = True


async def _relayed(first: str, queue: asyncio.Queue[str | None], task: asyncio.Task[Any], head: Answer,
                   include_usage: bool, dialect: Any = None) -> AsyncIterator[bytes]:
    """Text deltas as they arrive, then the rest once the reply is whole and checked: every chunk
    with the id, model and time of the first (`head`); in the shape of the request's wire."""
    sent = ""
    item: str | None = first
    if dialect is not None:
        for part in dialect.stream_head(head):
            yield part
    while item is not None:
        if dialect is not None:
            for part in dialect.stream_text(item, not sent, head):
                yield part
        else:
            yield sse(head.chunk({"role": "assistant", "content": item} if not sent else {"content": item}))
        sent += item
        item = await queue.get()
    try:
        answer, _ = task.result()
    except Exception as exc:  # noqa: BLE001 - the stream is under way: the error as its last event
        message = f"{type(exc).__name__}: {exc}"[:500]
        if dialect is not None:
            yield b"event: error\n" + sse(dialect.error(500, message))
            return
        yield sse({"error": {"message": message, "type": "server_error"}})
        yield b"data: [DONE]\n\n"
        return
    answer = dataclasses.replace(answer, ident=head.ident, model=head.model or answer.model, created=head.created)
    if dialect is not None:
        parts = dialect.stream_tail(answer, sent)
    else:
        parts = answer.stream_tail(sent, include_usage) if answer.status == 200 else answer.error_stream()
    for p in parts:
        yield p
