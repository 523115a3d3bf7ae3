"""3. Overhead per step: a scripted model calling a no-op tool with fresh arguments for N steps.

Each framework's step limits are lifted (nothing else changes); loopfence keeps its guards and writes
its run log to a real file. Timed: the run only (agents and tools are built before the clock starts).
The garbage collector stays on, but the objects alive before the clock starts (every framework's
imports: ~290k objects) are frozen out of it: otherwise a full collection, which walks them all,
is charged to whichever framework happens to trigger it (it doubled some loopfence medians).
Per step = the run's CPU time (the process's, all its threads: what the harness costs, not what other
work on a shared machine takes from it) / N; the median of REPS runs. Peak memory: tracemalloc's
peak during one untimed run at the largest N.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..common import CAP, Workspace, quiet
from ..report import Section, table
from ..scripts import overhead_script
from . import profile

TITLE = "Overhead per step"
GOAL_US = 150
GOAL_MIB = 60
FULL = {"ns": (50, 200, 1000), "reps": 5}
QUICK = {"ns": (10, 50), "reps": 2}
WARM_RUNS, WARM_S = 3, 0.5


def time_run(fw: ModuleType, n: int, clock: Callable[[], float] = time.perf_counter, **options: Any) -> float:
    """Seconds for one n-step run (the run only), on `clock` (wall time; `time.process_time`: the CPU
    of all the process's threads, steadier than wall time on a shared machine)."""
    with Workspace() as ws, quiet():
        go = fw.prepare(overhead_script(n), ws, cap=CAP, unbounded=True, **options)
        gc.collect()
        gc.freeze()  # what is already alive (every framework's imports) is left out of collections
        try:
            start = clock()
            outcome = go()
            elapsed = clock() - start
        finally:
            gc.unfreeze()
    if outcome.executions != n or not outcome.answered:
        raise RuntimeError(f"{fw.NAME} overhead run of {n} steps did not complete: {outcome}")
    return elapsed


def warm_up(fw: ModuleType, n: int, **options: Any) -> None:
    """Imports and lazy set-up are not per-step costs, and neither is a VM's first touch of fresh
    memory pages (here it made a framework's first several runs up to 3x slower): at least
    WARM_RUNS runs and WARM_S seconds before timing."""
    start, runs = time.perf_counter(), 0
    while runs < WARM_RUNS or time.perf_counter() - start < WARM_S:
        time_run(fw, n, **options)
        runs += 1


def peak_mib(fw: ModuleType, n: int, **options: Any) -> float:
    with Workspace() as ws, quiet():
        go = fw.prepare(overhead_script(n), ws, cap=CAP, unbounded=True, **options)
        gc.collect()
        tracemalloc.start()
        try:
            go()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return peak / 2**20


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cfg = QUICK if quick else FULL
    ns, reps = cfg["ns"], cfg["reps"]
    variants = [(name, fw, {}) for name, fw in frameworks.items()]
    if "loopfence" in frameworks:  # arun(), and diagnostics: tools inline, a sync-only model
        lf = frameworks["loopfence"]
        variants[1:1] = [(name, lf, options) for name, options in _VARIANTS.items()]
    per_step: dict[str, dict[int, float]] = {}
    peaks: dict[str, float] = {}
    for name, fw, options in variants:
        warm_up(fw, ns[0], **options)
        per_step[name] = {n: statistics.median(time_run(fw, n, time.process_time, **options)
                                               for _ in range(reps)) / n * 1e6 for n in ns}
        peaks[name] = peak_mib(fw, ns[-1], **options)
    rows = [[_label(frameworks, name), *(f"{per_step[name][n]:,.0f}" for n in ns),
             f"{per_step[name][ns[-1]] / per_step[name][ns[0]]:.2f}x", f"{peaks[name]:.1f}"]
            for name, _, _ in variants]
    parts = [
        f"Median µs of CPU per step (the process's, all threads) over {reps} runs "
        f"({', '.join(map(str, ns))} steps), in one process; "
        f"peak Python memory (tracemalloc) during a {ns[-1]:,}-step run. Goal for loopfence: at most "
        f"{GOAL_US} µs per step, flat in N; at most {GOAL_MIB} MiB at 1,000 steps.",
        table(["framework", *(f"µs/step @{n}" for n in ns), f"growth {ns[0]}→{ns[-1]}",
               f"peak MiB @{ns[-1]}"], rows),
        "`loopfence` is `run()` with a sync no-op tool under its default 30 s timeout: the run's "
        "event loop has a runner thread of its own, and the tool runs right there (a watchdog takes "
        "the run over only if the deadline passes: no thread hand-off per call). `loopfence arun()` "
        "is `asyncio.run(arun(...))` with the same tool as an `async def` (what an asyncio program "
        "passes). The script model offers `acomplete` (as ScriptedModel does). Diagnostics, not "
        "defaults: `(tools inline)` runs the tool with `isolation=\"inline\"` (no timeout); `(sync "
        "model)` gives the model only a sync `complete` (it runs inline too); `arun() (sync tool)` "
        "hands each call of a sync tool to a worker thread, as arun() must so as never to block the "
        "caller's event loop: that hand-off is two cross-thread wake-ups, most of its cost per step.",
    ]
    data: dict[str, Any] = {"ns": list(ns), "reps": reps, "per_step_us": per_step, "peak_mib": peaks}
    if "loopfence" in frameworks:
        prof = profile.loopfence_profile(frameworks["loopfence"], ns[-1])
        if prof:
            parts += [f"pyinstrument profile of one {ns[-1]:,}-step loopfence arun() (async tool; "
                      "default limits lifted as above):", "```\n" + prof + "\n```"]
            data["profile"] = prof
    return Section(TITLE, "\n\n".join(parts), data)


_VARIANTS = {"loopfence_arun": {"entry": "arun", "async_tools": True}, "loopfence_inline": {"inline_tools": True},
             "loopfence_sync_model": {"sync_model": True}, "loopfence_arun_sync": {"entry": "arun"}}
_LABELS = {"loopfence_arun": "loopfence arun()", "loopfence_inline": "loopfence (tools inline)",
           "loopfence_sync_model": "loopfence (sync model)", "loopfence_arun_sync": "loopfence arun() (sync tool)"}


def _label(frameworks: dict[str, ModuleType], name: str) -> str:
    return _LABELS.get(name) or frameworks[name].NAME
