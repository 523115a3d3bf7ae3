"""OpenAIModel's sync calls (`complete`, `count_tokens` from sync code) keep their client and its
keep-alive connection from one call to the next, on the model's own loop, in the caller's context."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator

import pytest
from _http_support import CountingServer, counting_server

from loopfence import Request
from loopfence.models import OpenAIModel


@pytest.fixture
def server() -> Iterator[CountingServer]:
    with counting_server() as srv:
        yield srv


def _request() -> Request:
    return Request([{"role": "user", "content": "hi"}], [], {}, None, 1, 8)


def test_sync_complete_calls_share_one_connection(server: CountingServer) -> None:
    with OpenAIModel(f"http://127.0.0.1:{server.server_port}/v1", "m") as model:
        replies = [model.complete(_request()) for _ in range(3)]
    assert [r.content for r in replies] == ["ok", "ok", "ok"]
    assert len(server.peers) == 3 and len(set(server.peers)) == 1, server.peers


def test_sync_complete_runs_in_the_callers_context(server: CountingServer) -> None:
    """The ring's retry reporter (a contextvar) reaches a sync call: the context travels with it."""
    from loopfence.models._base import ON_RETRY

    seen: list[object] = []
    probe: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="unset")

    class Probing(OpenAIModel):
        async def acomplete(self, request: Request):  # type: ignore[no-untyped-def]
            seen.append((probe.get(), ON_RETRY.get() is reporter))
            return await super().acomplete(request)

    def reporter(*args: object) -> None:
        pass

    probe.set("caller")
    token = ON_RETRY.set(reporter)
    try:
        with Probing(f"http://127.0.0.1:{server.server_port}/v1", "m") as model:
            model.complete(_request())
    finally:
        ON_RETRY.reset(token)
    assert seen == [("caller", True)]


def test_close_stops_the_sync_loop_thread(server: CountingServer) -> None:
    before = set(threading.enumerate())
    model = OpenAIModel(f"http://127.0.0.1:{server.server_port}/v1", "m")
    model.complete(_request())
    mine = [t for t in set(threading.enumerate()) - before if t.name == "loopfence-openai-sync"]
    assert len(mine) == 1
    model.close()
    assert not mine[0].is_alive()
