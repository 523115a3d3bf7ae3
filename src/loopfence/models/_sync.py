"""Sync wrappers over the async adapters: `run_sync(make)` runs the coroutine `make()` to the end.

With no event loop running on this thread, it runs on a private loop here (`asyncio.run`): a
Ctrl-C on the main thread cancels the coroutine, so a request in flight is closed, then
KeyboardInterrupt propagates. Where this thread already runs a loop (sync code called from async
code: a notebook cell), that loop cannot be re-entered, so the coroutine runs on a private loop on
a helper thread while this thread waits (blocking its loop, as any sync call does); an exception
raised while waiting (KeyboardInterrupt) cancels the coroutine before it propagates.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    return _on_helper_thread(make)


def _on_helper_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    box: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> T:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await make()

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    worker = threading.Thread(target=target, name="loopfence-sync", daemon=True)
    worker.start()
    try:
        worker.join()
    except BaseException:
        if started.is_set():
            box["loop"].call_soon_threadsafe(box["task"].cancel)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
