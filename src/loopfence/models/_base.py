"""The Model protocol: one request in, one assistant reply out.

Required: `complete(request) -> Reply` (sync) and `describe()`. Optional, found by name:

- `async def acomplete(request) -> Reply`: the async form. The ring awaits it when present;
  otherwise it runs `complete` in a worker thread under the run's deadline (a sync adapter that
  overruns is left behind: the run goes on without it, and the log says so). An `acomplete` must
  honour cancellation: cancelling the awaiting task (the run's deadline, Ctrl-C) stops its work
  promptly (closes its request) and lets CancelledError propagate.
- `count_tokens(messages, tools) -> int | None` and/or `async def acount_tokens(messages, tools)`:
  the prompt's exact token count (None: unknown, the ring estimates). The async one is preferred.

A model signals a stop it cannot recover from (endpoint errors, context overflow, a broken
stream that yields nothing) by raising `StopError`; the ring turns it into a value. Any other
exception is a bug in the adapter (the ring names it endpoint_error). `request.deadline`, when
set, is the `time.monotonic()` the run ends at: an adapter may decline to start work it cannot
finish, but only the run decides that the run is over (its wall clock is one scope around the ring).
`loopfence.testing.check_model` checks an adapter against all of this.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from .._messages import Reply, Request

__all__ = ["Model", "RetryReport", "ON_RETRY", "report_retry", "TextReport", "ON_TEXT", "text_sink"]

RetryReport = Callable[[int, "int | None", float, str], None]  # (attempt, status, wait_s, reason)
ON_RETRY: ContextVar[RetryReport | None] = ContextVar("loopfence_on_retry", default=None)
"""Set by the ring around each model request: an adapter that retries says so through
`report_retry`, and the run logs a `retry` event (the adapter needs no log)."""


def report_retry(attempt: int, status: int | None, wait_s: float, reason: str) -> None:
    """Tell the run awaiting this request that attempt `attempt` failed (HTTP `status`, None for a
    connection error or a timeout) and the next one follows in `wait_s` seconds."""
    report = ON_RETRY.get()
    if report is not None:
        report(attempt, status, wait_s, reason)


TextReport = Callable[[int, str], None]  # (step, a piece of the reply's text)
ON_TEXT: ContextVar[TextReport | None] = ContextVar("loopfence_on_text", default=None)
"""Set by `stream()` around its run: an adapter that receives its reply's text in pieces (a stream)
passes each piece on through `text_sink`, and the stream yields it as a `TextDelta`. Only answer
text, never a tool call's; the pieces of one reply concatenate to its `content`."""


def text_sink(request: Request) -> Callable[[str], None] | None:
    """Where this request's answer text goes as it arrives, or None when nobody listens (the
    adapter then need not look at its pieces at all)."""
    report = ON_TEXT.get()
    if report is None:
        return None
    step = request.step

    def sink(text: str) -> None:
        if text:
            report(step, text)
    return sink


@runtime_checkable
class Model(Protocol):
    """A model adapter: `complete(request) -> Reply` and `describe()`; optional async and token
    counting methods are found by name (this module's docstring)."""

    def complete(self, request: Request) -> Reply: ...

    def describe(self) -> dict[str, Any]:
        """Settings recorded in the run log header (never secrets)."""
        ...
