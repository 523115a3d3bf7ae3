"""Where the proxy forwards: an OpenAI-compatible endpoint through the library's own client
(`OpenAIModel`: retries, Retry-After, the stream parsed to a Reply, incomplete_stream, bounded
bodies, the key never shown), or the embedded model (`LocalModel`) when no `--upstream` is given.
A request of another wire (`_anthropic`) goes to an upstream of its own wire as it was sent (`post`,
through the same client, its reply read by the wire's reader), or, with none, translated to Chat
Completions like any other (`complete`).

A streamed request relays each text delta as it is read (`ON_STREAM_EVENT`); tool-call deltas are
not relayed: the proxy releases calls only once the reply is whole and checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import httpx

from .._aio import in_thread
from .._setup import model_cap
from .._json import canonical_json
from .._tokens import TokenEstimator, text_units
from .._messages import Reply, Request
from ..models._base import ON_TEXT
from ..models._exchange import ON_STREAM_EVENT
from ..models._openai import OpenAIModel
from ..models._sse import SSEEvent
from . import _anthropic, _gemini, _responses
from ._answer import WIRE_EXTRA
from ._wire import Incoming

__all__ = ["Upstream", "upstream_key", "wire_key", "WIRES", "CLIENT_KEYS"]

DIALECTS = {_anthropic.NAME: _anthropic, _responses.NAME: _responses, _gemini.NAME: _gemini}  # the wires besides Chat Completions, each one translating module
WIRES = tuple(DIALECTS)  # the names `--upstream NAME=URL` takes
CLIENT_KEYS = ("x-api-key", "authorization", "x-goog-api-key")  # the headers a client's own key comes in

Relay = Callable[[str], None]


def upstream_key() -> str | None:
    """The upstream's key: LOOPFENCE_UPSTREAM_KEY, else OPENAI_API_KEY (sent only upstream)."""
    return os.environ.get("LOOPFENCE_UPSTREAM_KEY") or os.environ.get("OPENAI_API_KEY") or None


def wire_key(wire: str) -> str | None:
    """The key of a wire's own upstream: LOOPFENCE_ANTHROPIC_KEY, else ANTHROPIC_API_KEY (the Responses
    wire: LOOPFENCE_RESPONSES_KEY, else the Chat Completions upstream's key)."""
    if wire == "responses":
        return os.environ.get("LOOPFENCE_RESPONSES_KEY") or upstream_key()
    return os.environ.get(f"LOOPFENCE_{wire.upper()}_KEY") or os.environ.get(f"{wire.upper()}_API_KEY") or None


class Upstream:
    """One upstream for every run: `url` (an OpenAI-compatible base URL, `.../v1`) or None (the
    embedded model). One `OpenAIModel` per (model name, streamed), sharing nothing but the key."""

    def __init__(self, url: str | None, key: str | None = None, *, local: Any = None,
                 transport: httpx.AsyncBaseTransport | None = None, wires: dict[str, str] | None = None) -> None:
        self.url = url
        self._key = key
        self._transport = transport
        self._models: dict[tuple[str | None, bool], OpenAIModel] = {}
        self._local = local
        # the URL checked now (ValueError naming it), and shown without credentials or query
        self._where = OpenAIModel(url).describe()["base_url"] if url is not None else "embedded"
        # another wire's own upstream: its root, as its clients take it (ANTHROPIC_BASE_URL: no /v1)
        self.wires = {name: root.strip().rstrip("/").removesuffix("/v1").removesuffix("/v1beta")
                      for name, root in (wires or {}).items()}
        self._wire_models: dict[tuple[str, bool], OpenAIModel] = {}
        for name, root in self.wires.items():
            if name not in WIRES:
                raise ValueError(f"{name}={root}: no such wire (the wires: {', '.join(WIRES)})")
            OpenAIModel(root)  # checked now: ValueError naming it

    def describe(self, wire: str | None = None) -> str:
        """Where requests of `wire` (None: Chat Completions) go, shown without credentials."""
        if wire is not None and wire in self.wires:
            return str(OpenAIModel(self.wires[wire]).describe()["base_url"])
        return str(self._where)

    @staticmethod
    def _headers(wire: str, forward: dict[str, str]) -> dict[str, str]:
        """The headers a request of `wire` goes upstream with: the client's (its key only where the
        proxy has none for that upstream), and the proxy's key in the wire's own header."""
        key = wire_key(wire)
        if key is None:
            return forward
        return {**{k: v for k, v in forward.items() if k not in CLIENT_KEYS}, **DIALECTS[wire].auth(key)}

    def speaks(self, wire: str | None) -> bool:
        """Whether requests of `wire` go to an upstream of their own wire (else: translated)."""
        return wire is not None and wire in self.wires

    async def post(self, incoming: Incoming, note: str | None, max_tokens: int | None, relay: Relay | None) -> Reply:
        """One request of another wire to that wire's own upstream: the body as sent, with the run's
        cap and note (`outgoing`), its reply read by the wire's reader: the Reply, or StopError. The
        client's headers in `incoming.forward` go too (its version and beta flags; its own key where
        the proxy has none for that upstream)."""
        wire = str(incoming.wire)
        dialect = DIALECTS[wire]
        body = dialect.outgoing(incoming, note, max_tokens)
        tools = tuple(t["function"]["name"] for t in incoming.tools)
        headers = self._headers(wire, dict(incoming.forward))
        stream = body.get("stream") is True
        m = self._wire_models.get((wire, stream))
        if m is None:
            m = self._wire_models[(wire, stream)] = OpenAIModel(self.wires[wire], stream=stream, tool_choice=None,
                                                                transport=self._transport)
        reader = dialect.reader(incoming)
        route = dialect.path(incoming)
        reply = await m.apost(body, url=self.wires[wire] + route, headers=headers, read_json=reader.json,
                              read_event=reader.event, tools=tools,
                              text=relay if dialect.relays(body) else None)  # else the answer goes whole
        extra = reader.extra()
        if extra is not None and isinstance(reply.raw, dict):
            reply = dataclasses.replace(reply, raw={**reply.raw, WIRE_EXTRA: extra})
        return reply

    def _model(self, name: str | None, stream: bool) -> OpenAIModel:
        m = self._models.get((name, stream))
        if m is None:
            assert self.url is not None
            m = self._models[(name, stream)] = OpenAIModel(self.url, name, self._key, stream=stream,
                                                           tool_choice=None, transport=self._transport)
        return m

    def local(self) -> Any:
        if self._local is None:
            from ..models._local import LocalModel

            self._local = LocalModel()
        return self._local

    def model_name(self, asked: str | None, wire: str | None = None) -> str:
        """The model a request of `wire` gets: the embedded one's, or the one it asked for."""
        if self.url is None and not self.speaks(wire):
            return str(self.local().describe().get("model") or "embedded")
        return asked or "unknown"

    def own_cap(self, wire: str | None = None) -> int | None:
        """The embedded model's own cap on a reply (its max_tokens) for requests of `wire` that it
        answers, where a request sets none; None where an upstream answers."""
        if self.url is None and not self.speaks(wire):
            return model_cap(self.local().describe())
        return None

    async def complete(self, request: Request, model: str | None, relay: Relay | None) -> Reply:
        """One request upstream (the run's `max_tokens` already in `request`): the Reply, or StopError."""
        if self.url is None:  # the embedded model: its text relayed from its thread as it is made
            if relay is None:
                return await in_thread(self.local().complete, request)
            loop = asyncio.get_running_loop()
            token = ON_TEXT.set(lambda _step, text: loop.call_soon_threadsafe(relay, text))
            try:
                return await in_thread(self.local().complete, request)
            finally:
                ON_TEXT.reset(token)
        m = self._model(model, relay is not None)
        if relay is None:
            return await m.acomplete(request)
        token = ON_STREAM_EVENT.set(_text_deltas(relay))
        try:
            return await m.acomplete(request)
        finally:
            ON_STREAM_EVENT.reset(token)

    async def passthrough(self, wire: str, path: str, body: Any, forward: dict[str, str]) -> tuple[int, Any]:
        """A request of `wire` outside any run (Anthropic's count_tokens), to that wire's own upstream
        as it came: (status, JSON body). With none, an estimate of the tokens (its text units)."""
        if wire not in self.wires:  # an estimate (its text units), in the wire's own shape
            n = TokenEstimator().estimate(text_units(canonical_json(body)))
            return 200, DIALECTS[wire].counted(n)
        headers = self._headers(wire, forward)
        try:
            async with httpx.AsyncClient(transport=self._transport, timeout=30.0) as client:
                resp = await client.post(self.wires[wire] + path, json=body, headers=headers)
            return resp.status_code, resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            return 502, DIALECTS[wire].error(502, f"upstream {self.describe(wire)}{path}: {type(exc).__name__}")

    async def models(self) -> tuple[int, Any]:
        """GET /models upstream, passed through: (status, JSON body)."""
        if self.url is None:
            name = self.model_name(None)
            return 200, {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                     "owned_by": "loopfence (embedded)"}]}
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        try:
            async with httpx.AsyncClient(transport=self._transport, timeout=30.0) as client:
                resp = await client.get(self.url.rstrip("/") + "/models", headers=headers)
            return resp.status_code, resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            return 502, {"error": {"message": f"upstream {self.describe()}/models: {type(exc).__name__}",
                                   "type": "upstream_error", "param": None, "code": None}}

    async def aclose(self) -> None:
        for m in [*self._models.values(), *self._wire_models.values()]:
            await m.aclose()


def _text_deltas(relay: Relay) -> Callable[[SSEEvent], None]:
    """An SSE event -> its text delta relayed (nothing else: calls wait for the whole reply)."""
    def on_event(ev: SSEEvent) -> None:
        try:
            obj = json.loads(ev.data)
            text = obj["choices"][0]["delta"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return
        if isinstance(text, str) and text:
            relay(text)
    return on_event
