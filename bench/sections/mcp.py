"""MCP call overhead (issue 18, must-show 4): the median time of one `tools/call` to a stdio server
(bench/mcp_echo.py: a FastMCP `echo` tool) through loopfence, against a direct call with
the SDK's own `ClientSession` to another process of the same server.

Through loopfence is what the ring does for each MCP call: the arguments checked against the tool's
inputSchema and bound (`Tool.validate`), then `Executor.aexecute` (the deadline, the hop to the
group's host loop, the result turned into text and capped). Both are awaited from one event loop,
alternating in rounds of ROUND calls (so drift in the machine's load falls on both alike); each call
is timed alone. Goal: the fence adds at most 10% to the median call.

    python -m bench.sections.mcp [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from ..report import Section, table

TITLE = "MCP call overhead"
GOAL_PCT = 10.0
FULL = {"calls": 2000, "warm": 200}
QUICK = {"calls": 100, "warm": 20}
ROUND = 50
SERVER = [sys.executable, str(Path(__file__).resolve().parent.parent / "mcp_echo.py")]


async def _direct(stack: AsyncExitStack) -> Any:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    read, write = await stack.enter_async_context(stdio_client(StdioServerParameters(command=SERVER[0],
                                                                                     args=SERVER[1:])))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()

    async def call(text: str) -> str:
        result = await session.call_tool("echo", {"text": text})
        return result.content[0].text

    return call


async def _fenced(stack: AsyncExitStack, hosted: bool = False) -> Any:
    """`async with` (arun()'s way: the sessions on this loop), or `with` (hosted: run()'s and the
    CLI's way, the sessions on a thread of their own: each call hops there and back)."""
    from loopfence.mcp import mcp_tools
    from loopfence.tools._executor import Executor

    group = mcp_tools(SERVER, connect_timeout_s=120)
    if hosted:
        stack.enter_context(group)
    else:
        await stack.enter_async_context(group)
    [tool] = list(group)
    executor = Executor()

    async def call(text: str) -> str:
        result = await executor.aexecute(tool, tool.validate({"text": text}), 30.0)
        return result.content

    return call


async def _measure(calls: int, warm: int) -> dict[str, list[float]]:
    async with AsyncExitStack() as stack:
        ways = {"direct": await _direct(stack), "loopfence": await _fenced(stack),
                "loopfence, hosted": await _fenced(stack, hosted=True)}
        times: dict[str, list[float]] = {name: [] for name in ways}
        for name, call in ways.items():  # imports, first touches, the servers' own warm-up
            for i in range(warm):
                await call(f"warm {i}")
        for start in range(0, calls, ROUND):
            for name, call in ways.items():
                for i in range(start, min(start + ROUND, calls)):
                    text = f"call {i}"
                    t0 = time.perf_counter()
                    answer = await call(text)
                    times[name].append(time.perf_counter() - t0)
                    if answer != text:
                        raise RuntimeError(f"{name} echo answered {answer!r} to {text!r}")
    return times


def run(frameworks: dict[str, Any], quick: bool) -> Section:
    cfg = QUICK if quick else FULL
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        return Section(TITLE, f"Skipped: the MCP SDK is not installed ({exc}).", {"skipped": str(exc)})
    times = asyncio.run(_measure(cfg["calls"], cfg["warm"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()}
    added_pct = {k: 100.0 * (med[k] - med["direct"]) / med["direct"] for k in med}
    rows = [[k, f"{med[k] * 1e3:.3f}", f"{p90[k] * 1e3:.3f}",
             "" if k == "direct" else f"{(med[k] - med['direct']) * 1e3:+.3f} ({added_pct[k]:+.1f}%)", len(times[k])]
            for k in times]
    verdict = "met" if added_pct["loopfence"] <= GOAL_PCT else "NOT met"
    about = ("One `tools/call` to a FastMCP `echo` tool over stdio: the SDK's `ClientSession` directly, and "
             "the same call through loopfence (argument check and binding, the executor, the result as text). "
             "`loopfence`: the group opened with `async with` on the awaiting loop (`arun()`, `abatch()`); "
             "`loopfence, hosted`: opened with `with`, its sessions on a thread of their own, as under `run()` "
             f"and the CLI (each call hops there and back). Calls alternate in rounds of {ROUND}; each is timed alone.")
    goal = (f"Goal: the fence adds at most {GOAL_PCT:g}% to the median call (`async with`): **{verdict}** "
            f"({added_pct['loopfence']:+.1f}%; hosted {added_pct['loopfence, hosted']:+.1f}%).")
    text = "\n\n".join([about, table(["way", "median ms", "p90 ms", "added to the median", "calls"], rows), goal])
    data = {"median_ms": {k: v * 1e3 for k, v in med.items()}, "p90_ms": {k: v * 1e3 for k, v in p90.items()},
            "added_pct": added_pct, "goal_pct": GOAL_PCT, "calls": cfg["calls"]}
    return Section(TITLE, text, data)


if __name__ == "__main__":
    section = run({}, "--quick" in sys.argv)
    print(f"## {section.title}\n\n{section.markdown}")
