"""OpenAIModel as an async adapter: `await acomplete` on one shared pool, cancellation closes the request.

No pytest-asyncio here: each test drives its own loop with asyncio.run. No timing bounds either
(shared 2-core machines): what is asserted is what happened and in which order.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from loopfence import Request, StopReason
from loopfence._stops import StopError
from loopfence.models import OpenAIModel, ScriptedModel, Timeouts
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
OK = text_reply("ok", usage=(5, 1))


def req(deadline: float | None = None) -> Request:
    return Request([{"role": "user", "content": "hi"}], TOOLS, {}, deadline)


class Silent:
    """A loopback TCP server that reads a request, answers `head` (or nothing), then holds the
    connection open until the client closes it: `closed` is set the moment it sees EOF."""

    def __init__(self, head: bytes = b"") -> None:
        self.head = head
        self.got_request = threading.Event()
        self.closed = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True, name="silent-server").start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            self.got_request.set()
            if self.head:
                conn.sendall(self.head)
            conn.settimeout(30)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            self.closed.set()

    def close(self) -> None:
        self.sock.close()


@contextmanager
def silent(head: bytes = b"") -> Iterator[Silent]:
    srv = Silent(head)
    try:
        yield srv
    finally:
        srv.close()


async def _until(event: threading.Event) -> None:
    await asyncio.get_running_loop().run_in_executor(None, event.wait, 30)
    assert event.is_set()


@pytest.mark.parametrize("stream", [False, True])
def test_acomplete_against_the_fake_server(stream: bool) -> None:
    async def main() -> None:
        async with OpenAIModel(srv.base_url, "m", stream=stream) as model:
            first = await model.acomplete(req())
            second = await model.acomplete(req())
        assert first.tool_calls[0].name == "read_file" and first.complete
        assert second.content == "ok" and second.usage is not None and second.usage.prompt_tokens == 5

    with FakeServer([calls_reply(tool_call("read_file", path="a")), OK]) as srv:
        asyncio.run(main())
        assert len(srv.requests) == 2 and srv.requests[0].get("stream", False) is stream


def test_errors_and_retries_are_the_same_through_acomplete() -> None:
    async def main() -> None:
        model = OpenAIModel(srv.base_url, "m", backoff_base=0.01)
        assert (await model.acomplete(req())).content == "ok" and model.retries == 1
        with pytest.raises(StopError) as e:
            await model.acomplete(req())
        assert e.value.stop.reason is StopReason.CONTEXT_OVERFLOW
        await model.aclose()

    overflow = {"fault": "overflow", "shape": "openai"}
    with FakeServer([{"fault": "server_error"}, OK, overflow]) as srv:
        asyncio.run(main())


def test_a_thousand_concurrent_acompletes_share_one_pool_with_bounded_threads() -> None:
    n = 1_000
    peak = {"threads": 0, "client_threads": 0}

    def client_threads() -> int:  # the fake server runs here too: one handler thread per connection
        return sum(1 for t in threading.enumerate() if "process_request" not in t.name)

    async def sample(stop: asyncio.Event) -> None:
        while not stop.is_set():
            peak["threads"] = max(peak["threads"], threading.active_count())
            peak["client_threads"] = max(peak["client_threads"], client_threads())
            await asyncio.sleep(0.01)

    async def main(model: OpenAIModel) -> list[object]:
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(stop))
        replies = await asyncio.gather(*(model.acomplete(req()) for _ in range(n)), return_exceptions=True)
        stop.set()
        await sampler
        assert len(model._clients) == 1  # one pool served them all
        await model.aclose()
        return replies

    timeouts = Timeouts(connect=60, read=60, write=60, pool=120)  # a queue of 1,000 on 2 busy cores
    before = threading.active_count()
    with FakeServer([OK]) as srv:
        model = OpenAIModel(srv.base_url, "m", timeout=timeouts, max_retries=0,  # 20: the suite's time
                            limits=httpx.Limits(max_connections=20, max_keepalive_connections=20))
        started = time.monotonic()
        replies = asyncio.run(main(model))
        took = time.monotonic() - started
    failed = [r for r in replies if not (hasattr(r, "content") and r.content == "ok")]
    print(f"\n{n} concurrent acomplete: {took:.2f}s, threads before {before}, peak {peak['threads']} "
          f"(of which not fake-server handlers: {peak['client_threads']}), pool limit "
          f"{model.limits.max_connections} connections")
    assert not failed, failed[:3]
    assert len(srv.requests) == n
    assert peak["client_threads"] <= before + 4, peak  # no thread per request on the client side
    assert peak["threads"] <= before + model.limits.max_connections + 8, peak  # bounded by the pool


_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT))  # one event, then silence


@pytest.mark.parametrize("head", [b"", _STREAM_HEAD], ids=["before-headers", "mid-stream"])
def test_cancelling_acomplete_closes_the_connection(head: bytes) -> None:
    async def main(srv: Silent) -> None:
        model = OpenAIModel(srv.base_url, "m", stream=True, timeout=Timeouts(read=60))
        task = asyncio.create_task(model.acomplete(req()))
        await _until(srv.got_request)
        await asyncio.sleep(0.05)  # the head, if any, reaches the client
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _until(srv.closed)  # the server saw the client close the connection
        await model.aclose()

    with silent(head) as srv:
        asyncio.run(main(srv))
        assert srv.closed.is_set()


def test_a_full_pool_waits_its_pool_timeout_for_a_place_then_says_so() -> None:
    """One place in the pool (max_connections=1), held by a request the server never answers: the
    next request waits the pool timeout for the place, then stops naming that timeout; once the place
    is given back, a request takes it."""
    async def main(srv: Silent) -> None:
        model = OpenAIModel(srv.base_url, "m", max_retries=0, limits=httpx.Limits(max_connections=1),
                            timeout=Timeouts(connect=30, read=60, write=30, pool=0.2))
        held = asyncio.create_task(model.acomplete(req()))
        await _until(srv.got_request)
        with pytest.raises(StopError) as e:
            async with asyncio.timeout(30):  # (a wait without its bound would hang here)
                await model.acomplete(req())
        assert e.value.stop.reason is StopReason.ENDPOINT_ERROR and "pool timeout" in e.value.stop.detail, e.value
        assert not held.done()
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        with FakeServer([OK]) as fake:  # the place given back: the next request takes it, and is answered
            got = await model.apost({"model": "m", "messages": []}, url=fake.base_url + "/chat/completions")
        assert got.content == "ok"
        await model.aclose()

    with silent() as srv:
        asyncio.run(main(srv))


def test_the_runs_clock_cancels_the_request_and_closes_it() -> None:
    """The adapter keeps no run clock of its own: a cancel from outside (the run's wall-clock scope)
    cancels the request and closes its connection."""
    async def main(srv: Silent) -> None:
        model = OpenAIModel(srv.base_url, "m", timeout=Timeouts(read=60))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await model.acomplete(req(deadline=time.monotonic() + 0.5))
        await _until(srv.closed)
        await model.aclose()

    with silent() as srv:
        asyncio.run(main(srv))
    assert srv.got_request.is_set() and srv.closed.is_set()


def test_sync_complete_works_inside_a_running_loop_and_on_threads() -> None:
    async def main() -> str | None:
        return model.complete(req()).content  # a sync call from async code: the model's own loop runs it

    with FakeServer([OK]) as srv, OpenAIModel(srv.base_url, "m") as model:
        assert asyncio.run(main()) == "ok"
        out: list[str | None] = []
        threads = [threading.Thread(target=lambda: out.append(model.complete(req()).content)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out == ["ok"] * 8 and model.complete(req()).content == "ok"
        assert len(model._clients) == 1  # every sync call, from any thread, on the model's own loop
    assert len(model._clients) == 0  # closed with the model


def test_one_client_per_loop_and_close_reaches_them() -> None:
    with FakeServer([OK]) as srv:
        model = OpenAIModel(srv.base_url, "m")

        async def use() -> None:
            await model.acomplete(req())

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(use())
            loop.run_until_complete(use())
            assert len(model._clients) == 1
            client = model._clients._clients[loop].client
            model.close()  # an idle loop: closed by running it
            assert client.is_closed and len(model._clients) == 0
            loop.run_until_complete(use())  # and used again, a new client
            assert len(model._clients) == 1
            model.close()
        finally:
            loop.close()


def test_acount_tokens_is_none_when_the_server_is_gone() -> None:
    async def main() -> int | None:
        async with OpenAIModel("http://127.0.0.1:9/v1", "m", max_retries=0) as model:
            return await model.acount_tokens([{"role": "user", "content": "hi"}], [])

    assert asyncio.run(main()) is None


def test_scripted_acomplete_awaits_its_delay_and_a_cancel_ends_it() -> None:
    async def main() -> None:
        model = ScriptedModel([OK], delay_s=30)
        task = asyncio.create_task(model.acomplete(req()))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(model.requests) == 1
        assert (await ScriptedModel([OK]).acomplete(req())).content == "ok"

    asyncio.run(main())


def test_a_scripted_subclass_overriding_complete_is_honoured_by_acomplete() -> None:
    class Loud(ScriptedModel):
        def complete(self, request: Request):  # type: ignore[no-untyped-def]
            return ScriptedModel([text_reply("loud")]).complete(request)

    assert asyncio.run(Loud([OK]).acomplete(req())).content == "loud"



def test_concurrent_first_requests_probe_the_server_once() -> None:
    """A hundred runs starting at once on one loop send one GET /props, not a hundred."""
    import asyncio as _asyncio
    import json as _json
    import threading as _threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from loopfence import Limits, RunLog, arun
    from loopfence.models import OpenAIModel
    from loopfence.testing import text_reply

    gets: list[str] = []
    body = _json.dumps(text_reply("done")).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            gets.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    _threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        model = OpenAIModel(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m")

        async def main() -> list:
            return await _asyncio.gather(*(arun("t", model=model, log=RunLog(None), limits=Limits())
                                           for _ in range(100)))

        results = _asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
    assert all(r.stop.reason == "final_answer" for r in results)
    assert [p for p in gets if p.endswith("/props")] == ["/props"]
