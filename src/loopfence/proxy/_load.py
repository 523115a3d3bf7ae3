"""How much the proxy takes on at once: requests at work, and the memory their bodies take once read.

A JSON body takes far more memory parsed than on the wire: 13 MB of empty text parts is half a million
objects, about 240 MiB in Python. So each body is weighed before it is parsed, from its bytes and a
count of what it would become (`weigh`: objects and arrays at `NODE_BYTES` each, strings at
`STRING_BYTES`), and:

- a body heavier than `per_request` (a quarter of the budget) is refused: 413, naming both numbers;
- the requests at work may weigh `budget` together, and be `max_concurrent` at most: past either, a
  request is refused at once with 429 and `Retry-After` (never queued: a queue is memory too).

The estimate is deliberately high for hostile shapes and close for real ones (a coding agent's request
is mostly long strings). `Load` is shared by every route; `middleware` counts requests and releases
what each took when its response ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ._access import Refused

__all__ = ["Load", "MAX_CONCURRENT", "BUDGET", "Counts", "counts", "plus", "weigh"]

MAX_CONCURRENT = 64  # requests at work at once (--max-concurrent)
BUDGET = 1 << 30  # bytes the requests at work may take parsed, together (--max-memory, in MiB)
NODE_BYTES = 500  # an object or an array, parsed (a dict with its keys, a list: measured 240 MiB / 520k)
STRING_BYTES = 60  # a string, beyond its own characters
SCOPE_KEY = "loopfence.weight"  # where a request's weight is kept in its ASGI scope, until it ends
HOLDS = "loopfence.holds"  # what still works for the request: its handler, and the task it spawned


_NOT_COUNTED = bytes(range(256)).translate(None, b'{["')  # every byte but the three `weigh` counts


Counts = tuple[int, int, int]  # what `weigh` counts in some bytes: their length, brackets and quotes


def counts(data: bytes) -> Counts:
    """What `weigh` counts in `data`, in one pass (one translate keeps the three bytes counted)."""
    kept = data.translate(None, _NOT_COUNTED)
    return len(data), kept.count(b"{") + kept.count(b"["), kept.count(b'"')


def plus(a: Counts, b: Counts) -> Counts:
    """The counts of two runs of bytes, one after the other."""
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def weigh(data: bytes, known: Counts | None = None) -> int:
    """A body's memory once parsed, estimated from its bytes (every bracket and quote counts, those in
    strings too: an estimate that errs high). `known`: the counts of a prefix of `data`, counted before
    (a conversation's body it extends): only the rest is counted, to the same sum."""
    n, brackets, quotes = counts(data) if known is None else plus(known, counts(data[known[0]:]))
    return n * 2 + brackets * NODE_BYTES + quotes // 2 * STRING_BYTES


class Load:
    """The requests at work and their weight, against `max_concurrent` and `budget` (bytes)."""

    def __init__(self, max_concurrent: int = MAX_CONCURRENT, budget: int = BUDGET) -> None:
        if max_concurrent < 1 or budget < 1 << 20:
            raise ValueError(f"--max-concurrent must be 1 or more and --max-memory 1 MiB or more, got "
                             f"{max_concurrent} and {budget >> 20} MiB")
        self.max_concurrent, self.budget = max_concurrent, budget
        self.per_request = budget // 4
        self.at_work = 0
        self.weight = 0

    def take(self, scope: dict[str, Any], data: bytes, known: Counts | None = None) -> None:
        """Reserve `data`'s weight for the request of `scope` (released when it ends), or Refused
        (`known`: as `weigh`'s)."""
        w = weigh(data, known)
        if w > self.per_request:
            raise Refused(413, f"the request body would take about {w >> 20} MiB once read ({len(data):,} bytes "
                          f"of JSON), over the proxy's limit of {self.per_request >> 20} MiB for one request "
                          "(a quarter of --max-memory)", "request_too_large")
        if self.weight + w > self.budget:
            raise Refused(429, f"the proxy is reading {self.weight >> 20} MiB of requests already, and this one "
                          f"would take {w >> 20} MiB more than --max-memory {self.budget >> 20} MiB allows: "
                          "send it again in a moment", "proxy_busy")
        self.weight += w
        scope[SCOPE_KEY] = scope.get(SCOPE_KEY, 0) + w

    def middleware(self, app: Any, shape: Callable[[str, int, str, str], Any]) -> Any:
        """`app` counting its requests: past `max_concurrent` at work, a 429 in the wire's `shape`."""
        async def counted(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                          send: Callable[[Any], Awaitable[None]]) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if self.at_work >= self.max_concurrent:
                response = shape(scope["path"], 429, f"the proxy is serving {self.at_work} requests at once, its "
                                 f"limit (--max-concurrent {self.max_concurrent}): send it again in a moment",
                                 "proxy_busy")
                response.headers["Retry-After"] = "1"
                await response(scope, receive, send)
                return
            self.at_work += 1
            scope[HOLDS] = 1
            try:
                await app(scope, receive, send)
            finally:
                self.release(scope)
        return counted

    def hold(self, scope: dict[str, Any]) -> None:
        """Work for the request of `scope` that may outlive its handler (a client gone mid-stream leaves
        the run's task at work): the request counts until it ends too (`release`)."""
        scope[HOLDS] = scope.get(HOLDS, 0) + 1

    def release(self, scope: dict[str, Any]) -> None:
        scope[HOLDS] = scope.get(HOLDS, 1) - 1
        if scope[HOLDS] <= 0:
            self.at_work -= 1
            self.weight -= scope.pop(SCOPE_KEY, 0)
