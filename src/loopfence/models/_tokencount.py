"""Prompt tokens as a llama.cpp server counts them: `POST /apply-template`, then `POST /tokenize`.

`OpenAIModel.acount_tokens` (and its sync `count_tokens`) uses this so the ring's pre-send check (max_prompt_tokens,
context_window) sees the server's own number instead of an estimate. The server is recognised once
with `GET /props` (llama.cpp's server answers it with its settings; OpenAI and most others do not):
if it does not answer like llama.cpp, the counter answers None for the rest of its life and the run
keeps its calibrated estimate. A failed count is None too, never an exception: counting is a
courtesy, the estimate still holds. Async: the model passes the client of the loop it runs on.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import httpx

from .._json import wire_body

__all__ = ["ServerTokenCounter"]


class ServerTokenCounter:
    """Counts a chat prompt (messages + tools) with a llama.cpp server's template and tokenizer."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> None:
        root = base_url.rstrip("/")
        self.root = root[: -len("/v1")] if root.endswith("/v1") else root  # llama.cpp: /tokenize at the root
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.available: bool | None = None  # None: not probed yet
        self._probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[bool]] = \
            weakref.WeakKeyDictionary()
        self.failures = 0

    async def count(self, client: httpx.AsyncClient, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]]) -> int | None:
        if self.available is None:
            self.available = await self._probe_once(client)
        if not self.available:
            return None
        try:
            body: dict[str, Any] = {"messages": messages}
            if tools:
                body["tools"] = tools
            prompt = (await self._post(client, "/apply-template", body))["prompt"]
            tokens = (await self._post(client, "/tokenize", {"content": prompt, "add_special": True}))["tokens"]
            if not isinstance(prompt, str) or not isinstance(tokens, list):
                raise TypeError("unexpected /apply-template or /tokenize answer")
            return len(tokens)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            self.failures += 1
            if self.failures >= 2:  # e.g. tools need --jinja: stop asking, estimate instead
                self.available = False
            return None

    async def _probe_once(self, client: httpx.AsyncClient) -> bool:
        """One probe per event loop, however many runs there ask at once (a thousand concurrent
        first requests would otherwise send a thousand GET /props)."""
        loop = asyncio.get_running_loop()
        probe = self._probes.get(loop)
        if probe is None:
            probe = self._probes[loop] = loop.create_task(self._probe(client))
        return await asyncio.shield(probe)

    async def _probe(self, client: httpx.AsyncClient) -> bool:
        try:
            r = await client.get(f"{self.root}/props", headers=self.headers, timeout=self.timeout_s)
            data = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return False
        return isinstance(data, dict) and "default_generation_settings" in data

    async def _post(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await client.post(f"{self.root}{path}", content=wire_body(body),
                              headers={**self.headers, "Content-Type": "application/json"}, timeout=self.timeout_s)
        r.raise_for_status()
        data = r.json()
        if not isinstance(data, dict):
            raise TypeError(f"{path} answered {type(data).__name__}, not an object")
        return data
