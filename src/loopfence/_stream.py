"""`stream()`: a run as an async iterator of its typed events, as they are written."""

from __future__ import annotations

import asyncio
from typing import Any

from ._loop import arun
from ._stops import RunResult
from .runlog._schema import LogEvent, StopLine

__all__ = ["stream", "RunStream"]


class RunStream:
    """`async for event in stream(task, ...)`: header, request, reply, call, result, … ending with
    the stop. Then `.result` is the run's RunResult (and `await s.finish()` returns it)."""

    def __init__(self, task: str, kwargs: dict[str, Any]) -> None:
        self._task, self._kwargs = task, kwargs
        self._queue: asyncio.Queue[LogEvent] = asyncio.Queue()
        self._run: asyncio.Task[RunResult] | None = None
        self._done = False
        self.result: RunResult | None = None

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> LogEvent:
        if self._done:
            raise StopAsyncIteration
        if self._run is None:
            self._run = asyncio.ensure_future(arun(self._task, on_event=self._queue.put_nowait, **self._kwargs))
        get = asyncio.ensure_future(self._queue.get())
        await asyncio.wait((get, self._run), return_when=asyncio.FIRST_COMPLETED)
        if not get.done():  # the run ended without a further event: it raised (LogWriteError, a cancel)
            get.cancel()
            self._done = True
            await self._run  # raises what the run raised
            raise StopAsyncIteration
        event = get.result()
        if isinstance(event, StopLine):
            self._done = True
            await self.finish()
        return event

    async def finish(self) -> RunResult:
        """The run to its end (the events not yet taken are dropped): its result."""
        if self._run is None:
            self._run = asyncio.ensure_future(arun(self._task, on_event=self._queue.put_nowait, **self._kwargs))
        self.result = await self._run
        return self.result

    async def aclose(self) -> None:
        """Stop early: the run is cancelled (it ends `cancelled`, its stop in the log)."""
        self._done = True
        if self._run is not None and not self._run.done():
            self._run.cancel()
            try:
                await self._run
            except asyncio.CancelledError:
                pass


def stream(task: str, **kwargs: Any) -> RunStream:
    """`arun(task, **kwargs)` as a stream of its typed events (loopfence.runlog._schema), ending
    with the stop; the final RunResult is `.result` once the stop has been yielded."""
    return RunStream(task, kwargs)
