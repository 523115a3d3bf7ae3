"""One `httpx.AsyncClient` per running event loop, shared by every request a model makes there.

An AsyncClient (its connection pool) belongs to the event loop it is first used on. A model keeps
one per loop: a thousand concurrent runs on one loop share one pool; the model's own loop for its
sync calls (`complete()`, see `_sync.SyncLoop`) keeps one from call to call, released when the
model closes.

Each pool has a gate, a semaphore as wide as the pool: requests beyond it wait here, not in
httpcore's queue, whose bookkeeping grows with the queue's length on every request (measured: 1,000
concurrent requests over 100 connections took 26 s queued in httpcore, 9 s behind the gate). The
wait is bounded by the pool timeout, as httpcore's would be.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["LoopClients", "Pool", "Borrowed"]


@dataclass(slots=True)
class Pool:
    """A loop's client and the gate in front of it."""

    client: httpx.AsyncClient
    width: int | None
    _gate: asyncio.Semaphore | None = field(default=None, init=False)

    @asynccontextmanager
    async def slot(self, wait_s: float | None) -> AsyncIterator[httpx.AsyncClient]:
        """The client, once one of the pool's `width` places is free (httpx.PoolTimeout after
        `wait_s`)."""
        if self.width is None:
            yield self.client
            return
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.width)
        if not self._gate.locked():  # a place is free: taken at once, no timer armed for a wait
            await self._gate.acquire()
        else:
            try:
                async with asyncio.timeout(wait_s):
                    await self._gate.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout(f"no connection free in the pool within {wait_s}s") from None
        try:
            yield self.client
        finally:
            self._gate.release()


class LoopClients:
    """The model's clients, one per event loop (weakly keyed: a loop that is gone takes its entry)."""

    def __init__(self, factory: Callable[[], httpx.AsyncClient], width: int | None = None) -> None:
        self._factory = factory
        self._width = width  # the gate's width: the pool's max_connections (None: no gate)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._closing: set[Any] = set()  # aclose() tasks scheduled by close(), kept until done

    def get(self) -> Pool:
        """The running loop's pool (made on first use)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._clients.get(loop)
            if pool is None or pool.client.is_closed:
                pool = self._clients[loop] = Pool(self._factory(), self._width)
            return pool

    def __len__(self) -> int:
        return len(self._clients)

    async def release(self) -> None:
        """Close the running loop's client, if it has one (its connections close with it)."""
        with self._lock:
            pool = self._clients.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.client.aclose()

    def close(self) -> None:
        """Close every client from sync code: on this thread's running loop as a task, on another
        thread's running loop through that loop, on an idle loop by running it; a closed loop's
        client is dropped (its loop can no longer run anything)."""
        with self._lock:
            items = list(self._clients.items())
            self._clients.clear()
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, pool in items:
            client = pool.client
            if loop.is_closed() or client.is_closed:
                continue
            if loop is here:
                task = loop.create_task(client.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(client.aclose(), loop)
            else:
                try:
                    loop.run_until_complete(client.aclose())
                except RuntimeError:  # started meanwhile by its owner: it stays the owner's to close
                    pass


class Borrowed(httpx.AsyncBaseTransport):
    """A caller's transport, shared by every loop's client and never closed by them (its owner
    closes it)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        return None
