"""5. Concurrency: 1, 10, 100, 1,000 runs at once (threads), each a real loopfence run with default
limits, guards and a run log file, through OpenAIModel over HTTP to the loopback FakeServer.

Harness cost per step = the CPU time of the threads that ran the ring (RunResult.cpu_s: the ring
and the HTTP client; the server's threads are not in it) / model requests, median over the runs of a level. Also
shown: wall time per step amortized over the level (everything, server included, on 2 cores) and
the whole process's CPU per step.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from loopfence import Reply, Request, arun as lf_arun, run as lf_run, tool
from loopfence.models._openai import OpenAIModel
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.testing._fakeserver import FakeServer

from ..report import Section, table

TITLE = "Concurrency"
GOAL_GROWTH = 2.0
FULL = {"levels": (1, 10, 100, 1000), "steps": 4}
QUICK = {"levels": (1, 10), "steps": 2}
MIN_RUNS = 20
BACKLOG = 2048


class PerRunServer(FakeServer):
    """Picks each reply from the request itself, so that concurrent runs each follow their own script:
    a no-op call with fresh arguments until the conversation holds `steps` tool results, then an answer.
    (FakeServer serves one shared list in order; this overrides only that choice.)"""

    def __init__(self, steps: int) -> None:
        super().__init__([text_reply("unused")])
        self.steps = steps

    def start(self) -> PerRunServer:
        super().start()
        # FakeServer writes headers and body separately; without TCP_NODELAY every keep-alive reply
        # waits ~40 ms for the client's delayed ACK (Nagle). Set on this server's own handler class.
        self._httpd.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[union-attr]
        # socketserver listens with a backlog of 5: a thousand clients connecting at once get
        # resets. Linux lets a listening socket raise its backlog by calling listen() again.
        self._httpd.socket.listen(BACKLOG)  # type: ignore[union-attr]
        return self

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        done = sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "tool")
        return calls_reply(tool_call("noop", {"i": done})) if done < self.steps else text_reply("done")


class TimedModel:
    """OpenAIModel with the thread CPU time spent inside complete() counted (client vs ring)."""

    def __init__(self, inner: OpenAIModel) -> None:
        self.inner = inner
        self.cpu = 0.0

    def complete(self, request: Request) -> Reply:
        start = time.thread_time()
        try:
            return self.inner.complete(request)
        finally:
            self.cpu += time.thread_time() - start

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


@dataclass
class RunCost:
    steps: int
    cpu_s: float  # the run thread: ring + client
    client_s: float  # of which inside OpenAIModel.complete
    answered: bool
    stop: str


def noop(i: int) -> str:
    """Do nothing with a number.

    Args:
        i: Any number.
    """
    return f"ok {i}"


def _level(srv: FakeServer, n: int, log_dir: Path) -> tuple[list[RunCost], float, float]:
    """n runs at once, started together; (their costs, wall seconds, process CPU seconds)."""
    tools = [tool(noop)]
    costs: list[RunCost | None] = [None] * n
    gate = threading.Barrier(n + 1)

    def one(k: int) -> None:
        model = TimedModel(OpenAIModel(srv.base_url, "fake"))
        gate.wait()
        result = lf_run("Do the task.", model=model, tools=tools, log=log_dir / f"run-{n}-{k}.jsonl")
        model.inner.close()
        assert result.cpu_s is not None  # CPU of the threads that ran the ring (not this caller's)
        costs[k] = RunCost(result.ledger.model_requests, result.cpu_s, model.cpu, result.final_answer == "done",
                           str(result.stop.reason))

    threads = [threading.Thread(target=one, args=(k,), name=f"bench-run-{k}") for k in range(n)]
    for t in threads:
        t.start()
    gate.wait()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    done = [c for c in costs if c is not None]
    return done, wall, cpu


def _async_level(srv: FakeServer, n: int, log_dir: Path) -> tuple[list[RunCost], float, float]:
    """n `arun()`s at once on one event loop, sharing one OpenAIModel (one connection pool)."""
    tools = [tool(noop)]

    async def main() -> list[Any]:
        model = OpenAIModel(srv.base_url, "fake")
        try:
            return await asyncio.gather(*(lf_arun("Do the task.", model=model, tools=tools,
                                                  log=log_dir / f"arun-{n}-{k}.jsonl") for k in range(n)))
        finally:
            await model.aclose()

    wall0, cpu0 = time.perf_counter(), time.process_time()
    results = asyncio.run(main())
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return [RunCost(r.ledger.model_requests, r.cpu_s or 0.0, 0.0, r.final_answer == "done", str(r.stop.reason))
            for r in results], wall, cpu


def _async_rows(srv: FakeServer, levels: tuple[int, ...], tmp: Path) -> tuple[list[list[str]], dict[int, Any]]:
    rows, data = [], {}
    _async_level(srv, 2, tmp)  # warm-up
    for n in levels:
        costs, wall, cpu = [], 0.0, 0.0
        for _ in range(-(-MIN_RUNS // n)):
            c, w, p = _async_level(srv, n, tmp)
            costs, wall, cpu = costs + c, wall + w, cpu + p
        steps = sum(c.steps for c in costs)
        ring = statistics.median(c.cpu_s / c.steps * 1e6 for c in costs if c.steps)
        answered = sum(c.answered for c in costs)
        threads = threading.active_count()
        rows.append([f"{n:,}", f"{answered:,}/{len(costs):,}", f"{steps:,}", f"{cpu / steps * 1e6:,.0f}",
                     f"{ring:,.0f}", f"{wall / steps * 1e6:,.0f}", f"{threads}"])
        data[n] = {"runs": n, "answered": answered, "steps": steps, "process_cpu_s": cpu, "ring_us": ring,
                   "harness_us": cpu / steps * 1e6,
                   "wall_s": wall, "threads_after": threads}
    return rows, data


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cfg = FULL if not quick else QUICK
    rows, data, notes = [], {}, []
    base: float | None = None
    with PerRunServer(cfg["steps"]) as srv, tempfile.TemporaryDirectory(prefix="loopfence-bench-") as tmp:
        _level(srv, 2, Path(tmp))  # warm-up: first connections, imports, lazy set-up
        for n in cfg["levels"]:
            costs, wall, cpu = [], 0.0, 0.0
            for _ in range(-(-MIN_RUNS // n)):  # rounds, so that every level has MIN_RUNS runs or more
                c, w, p = _level(srv, n, Path(tmp))
                costs, wall, cpu = costs + c, wall + w, cpu + p
            steps = sum(c.steps for c in costs)
            per_run = [c.cpu_s / c.steps * 1e6 for c in costs if c.steps]
            ring = [(c.cpu_s - c.client_s) / c.steps * 1e6 for c in costs if c.steps]
            harness = statistics.median(per_run)
            base = base or harness
            answered = sum(c.answered for c in costs)
            others = Counter(c.stop for c in costs if not c.answered)
            if others:
                notes.append(f"{n:,} at once: other stops " + ", ".join(f"{k} x{v}" for k, v in others.items()))
            rows.append([f"{n:,}", f"{answered:,}/{len(costs):,}", f"{steps:,}", f"{harness:,.0f}",
                         f"{statistics.median(ring):,.0f}", f"{harness / base:.2f}x",
                         f"{wall / steps * 1e6:,.0f}", f"{cpu / steps * 1e6:,.0f}"])
            data[n] = {"runs": n, "answered": answered, "steps": steps, "harness_us": harness,
                       "ring_us": statistics.median(ring), "wall_s": wall, "process_cpu_s": cpu}
        async_rows, async_data = _async_rows(srv, cfg["levels"], Path(tmp))
        data.update({f"arun-{n}": v for n, v in async_data.items()})
    md = "\n\n".join([
        f"Each run: {cfg['steps']} no-op calls with fresh arguments, then an answer "
        f"({cfg['steps'] + 1} model requests, JSON replies). Goal: harness cost per step growing less "
        f"than {GOAL_GROWTH:g}x from 1 to {cfg['levels'][-1]:,} concurrent runs.",
        f"Levels below {MIN_RUNS} runs are repeated until {MIN_RUNS} runs are measured; the FakeServer "
        "runs in the same process (its threads' CPU is in the last column only).",
        table(["concurrent runs", "answered", "model requests", "harness CPU µs/step",
               "of which ring µs/step", "growth vs 1", "wall µs/step (amortized)",
               "process CPU µs/step"], rows),
        *notes,
        "The same through `arun()`: all runs of a level at once on one event loop, one OpenAIModel "
        "(httpx.AsyncClient, one connection pool). Harness CPU per step here is the whole process's "
        "(the ring, the async client, and the in-process FakeServer's threads: everything); the ring "
        "column is RunResult.cpu_s (the ring on the loop and its sync no-op tool on a worker thread).",
        table(["concurrent arun()s", "answered", "model requests", "process CPU µs/step",
               "ring µs/step", "wall µs/step (amortized)", "threads after"], async_rows),
    ])
    return Section(TITLE, md, data)
