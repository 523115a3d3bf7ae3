"""Timeouts and retry timing for the HTTP client: value objects and pure functions, no I/O."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

__all__ = ["Timeouts", "RETRY_STATUSES", "retryable_status", "parse_retry_after", "backoff_delay"]

RETRY_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-phase timeouts in seconds (None = unlimited). `read` is the longest gap between two
    reads: waiting for the response headers, and between chunks of a stream."""

    connect: float | None = 10.0
    read: float | None = 120.0
    write: float | None = 30.0
    pool: float | None = 10.0

    def bounded(self, left: float | None) -> httpx.Timeout:
        """The httpx timeout with every phase capped at `left` seconds (what remains until the
        deadline), so no single wait can outlive it."""

        def cap(v: float | None) -> float | None:
            if left is None:
                return v
            return max(0.001, left if v is None else min(v, left))

        return httpx.Timeout(connect=cap(self.connect), read=cap(self.read), write=cap(self.write),
                             pool=cap(self.pool))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or 500 <= status <= 599


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
            if value >= 0:
                return value
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if ra is None:
        return None
    ra = ra.strip()
    try:
        value = float(ra)
        return value if value >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(retry: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with jitter for the n-th retry (1-based): uniform in [d/2, d],
    d = min(cap, base * 2**(retry-1))."""
    d = min(cap, base * (2 ** (retry - 1)))
    return rng.uniform(d / 2, d)
