"""1,000 concurrent `arun()`s on one event loop against the loopback FakeServer (in a child process,
so that this process's threads are loopfence's own): every run ends named, and the thread count
stays bounded (the worker pool's cap, not one thread per run)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from loopfence import StopReason, tool
from loopfence._aio import MAX_THREADS
from loopfence import arun
from loopfence.runlog import reconcile

pytestmark = pytest.mark.slow

RUNS = 1_000
STEPS = 2  # no-op calls per run before its answer

SERVER = textwrap.dedent(f"""
    import sys
    from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

    class PerRun(FakeServer):  # each run follows its own script: calls until it holds {STEPS} results
        def _next(self, body, headers):
            done = sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "tool")
            return calls_reply(tool_call("noop", {{"i": done}})) if done < {STEPS} else text_reply("done")

    srv = PerRun([text_reply("unused")]).start()
    srv._httpd.RequestHandlerClass.disable_nagle_algorithm = True
    srv._httpd.socket.listen(2048)
    print(srv.base_url, flush=True)
    sys.stdin.read()
""")


def noop(i: int) -> str:
    """Do nothing with a number."""
    return f"ok {i}"


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_thousand_concurrent_aruns_end_named_with_bounded_threads(server: str, tmp_path: Path) -> None:
    from loopfence.models import OpenAIModel

    peak = [threading.active_count()]

    async def main() -> list:
        model = OpenAIModel(server, "fake")  # one model, one connection pool for every run
        done = asyncio.Event()

        async def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], threading.active_count())
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.gather(*(arun("Do the task.", model=model, tools=[tool(noop)],
                                               log=tmp_path / f"run-{k}.jsonl") for k in range(RUNS)))
        finally:
            done.set()
            await watcher
            await model.aclose()

    before = threading.active_count()
    results = asyncio.run(main())
    print(f"\n{RUNS} concurrent arun(): threads before {before}, peak {peak[0]} "
          f"(worker cap {MAX_THREADS})")
    assert len(results) == RUNS
    assert all(r.stop.reason is StopReason.FINAL_ANSWER for r in results), \
        {str(r.stop.reason) for r in results}
    assert all(r.ledger.tool_executions == STEPS for r in results)
    assert peak[0] <= before + MAX_THREADS + 4
    for k in (0, RUNS // 2, RUNS - 1):
        assert reconcile(tmp_path / f"run-{k}.jsonl").ok
