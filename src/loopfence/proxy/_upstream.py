"""Where the proxy forwards: an OpenAI-compatible endpoint through the library's own client
(`OpenAIModel`: retries, Retry-After, the stream parsed to a Reply, incomplete_stream, bounded
bodies, the key never shown), or the embedded model (`LocalModel`) when no `--upstream` is given.

A streamed request relays each text delta as it is read (`ON_STREAM_EVENT`); tool-call deltas are
not relayed: the proxy releases calls only once the reply is whole and checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import httpx

from .._aio import in_thread
from .._messages import Reply, Request
from ..models._exchange import ON_STREAM_EVENT
from ..models._openai import OpenAIModel
from ..models._sse import SSEEvent

__all__ = ["Upstream", "upstream_key"]

Relay = Callable[[str], None]


def upstream_key() -> str | None:
    """The upstream's key: LOOPFENCE_UPSTREAM_KEY, else OPENAI_API_KEY (sent only upstream)."""
    return os.environ.get("LOOPFENCE_UPSTREAM_KEY") or os.environ.get("OPENAI_API_KEY") or None


class Upstream:
    """One upstream for every run: `url` (an OpenAI-compatible base URL, `.../v1`) or None (the
    embedded model). One `OpenAIModel` per (model name, streamed), sharing nothing but the key."""

    def __init__(self, url: str | None, key: str | None = None, *, local: Any = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url
        self._key = key
        self._transport = transport
        self._models: dict[tuple[str | None, bool], OpenAIModel] = {}
        self._local = local
        # the URL checked now (ValueError naming it), and shown without credentials or query
        self._where = OpenAIModel(url).describe()["base_url"] if url is not None else "embedded"

    def describe(self) -> str:
        return str(self._where)

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

    def model_name(self, asked: str | None) -> str:
        if self.url is None:
            return str(self.local().describe().get("model") or "embedded")
        return asked or "unknown"

    async def complete(self, request: Request, model: str | None, relay: Relay | None) -> Reply:
        """One request upstream (the run's `max_tokens` already in `request`): the Reply, or StopError."""
        if self.url is None:
            return await in_thread(self.local().complete, request)
        m = self._model(model, relay is not None)
        if relay is None:
            return await m.acomplete(request)
        token = ON_STREAM_EVENT.set(_text_deltas(relay))
        try:
            return await m.acomplete(request)
        finally:
            ON_STREAM_EVENT.reset(token)

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
        for m in self._models.values():
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
