"""The Model protocol: one request in, one assistant reply out.

A model signals a stop it cannot recover from (endpoint errors, context overflow, a broken
stream that yields nothing) by raising `StopError`; the ring turns it into a value.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .._messages import Reply, Request

__all__ = ["Model"]


@runtime_checkable
class Model(Protocol):
    def complete(self, request: Request) -> Reply: ...

    def describe(self) -> dict[str, Any]:
        """Settings recorded in the run log header (never secrets)."""
        ...
