"""3. Overhead per step: a scripted model calling a no-op tool with fresh arguments for N steps, every
framework side by side in one run; loopfence is judged by its ratio to the lightest peer at each N.

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
import shutil
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..common import CAP, Workspace, quiet
from ..overhead_ab import instructions
from ..report import Section, load_average, load_note, met, table
from ..scripts import overhead_script
from . import profile

TITLE = "Overhead per step"
GOAL_RATIO = {50: 0.5, 1000: 0.1}  # loopfence's µs/step over the lightest peer's, at N steps
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
    load_start = load_average()
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
    peers = [name for name in frameworks if name != "loopfence"]
    lightest = {n: min(peers, key=lambda p: per_step[p][n]) for n in ns} if peers else {}
    ratio = {name: {n: per_step[name][n] / per_step[lightest[n]][n] for n in lightest} for name in per_step}
    rows = [[_label(frameworks, name), *(f"{per_step[name][n]:,.0f}" for n in ns),
             *(f"{ratio[name][n]:.2f}" if n in lightest else "-" for n in ns),
             f"{per_step[name][ns[-1]] / per_step[name][ns[0]]:.2f}x", f"{peaks[name]:.1f}"]
            for name, _, _ in variants]
    parts = [
        f"Median µs of CPU per step (the process's, all threads) over {reps} runs "
        f"({', '.join(map(str, ns))} steps), every framework in one process, one after the other; the ratio "
        "of each row to the lightest peer at the same N (peers: every framework but loopfence); peak Python "
        f"memory (tracemalloc) during a {ns[-1]:,}-step run.",
        table(["framework", *(f"µs/step @{n}" for n in ns), *(f"ratio @{n}" for n in ns),
               f"growth {ns[0]}→{ns[-1]}", f"peak MiB @{ns[-1]}"], rows),
        _goals(per_step, ratio, lightest, peaks, frameworks, ns),
        "`loopfence run()` is `run()` with a sync no-op tool under its default 30 s timeout; `loopfence "
        "arun()` is `asyncio.run(arun(...))` with the same tool as an `async def` (what an asyncio program "
        "passes). `run()` drives `arun()` on an event loop of its own, and under both a sync tool goes to "
        "the one bounded worker pool (a hand-off per call: `arun() (sync tool)` shows arun() paying it too). "
        "The script model offers `acomplete` (as ScriptedModel does). Diagnostics, not defaults: `(tools "
        "inline)` runs the tool with `isolation=\"inline\"` on the loop (no timeout, no hand-off); `(sync "
        "model)` gives the model only a sync `complete` (a hand-off per model call too).",
    ]
    data: dict[str, Any] = {"ns": list(ns), "reps": reps, "per_step_us": per_step, "peak_mib": peaks,
                            "lightest_peer": lightest, "ratio_to_lightest_peer": ratio}
    if "loopfence" in frameworks:
        counts = None if quick else instruction_counts()
        parts.append(_counts_text(counts, quick))
        data["instructions_per_step"] = counts
        prof = profile.loopfence_profile(frameworks["loopfence"], ns[-1])
        if prof:
            parts += [f"pyinstrument profile of one {ns[-1]:,}-step loopfence arun() (async tool; "
                      "default limits lifted as above):", "```\n" + prof + "\n```"]
            data["profile"] = prof
    data["load_average"] = {"start": load_start, "end": load_average()}
    parts.insert(0, load_note(load_start, data["load_average"]["end"]))
    return Section(TITLE, "\n\n".join(parts), data)


def _goals(per_step: dict[str, dict[int, float]], ratio: dict[str, dict[int, float]], lightest: dict[int, str],
           peaks: dict[str, float], frameworks: dict[str, ModuleType], ns: tuple[int, ...]) -> str:
    """One line per goal: loopfence's run() and arun() against the lightest peer, and memory."""
    lines = []
    for n, goal in GOAL_RATIO.items():
        if n not in lightest:
            lines.append(f"- ratio @{n} ≤ {goal:g}: not measured in this run ({'no peer ran' if not lightest else 'N not run'}).")
            continue
        peer = f"{_label(frameworks, lightest[n])} ({per_step[lightest[n]][n]:,.0f} µs)"
        got = ", ".join(f"{_label(frameworks, name)} {ratio[name][n]:.2f} ({met(ratio[name][n] <= goal)})"
                        for name in JUDGED if name in ratio)
        lines.append(f"- ratio @{n} ≤ {goal:g} of the lightest peer, {peer}: {got}.")
    if "loopfence" in peaks and ns[-1] == 1000:
        lines.append(f"- peak memory @1,000 ≤ {GOAL_MIB} MiB: {peaks['loopfence']:.1f} ({met(peaks['loopfence'] <= GOAL_MIB)}).")
    return "Goals for loopfence's `run()` and `arun()` (the ratio to the lightest peer at the same N):\n\n" + \
        "\n".join(lines)


def instruction_counts() -> dict[str, float] | str:
    """Instructions per step of loopfence's run() and arun() (bench/overhead_ab.py's count: valgrind's
    callgrind, (a 60-step process - a 20-step one) / 40), or why there are none."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    root = Path(__file__).resolve().parents[2]
    return {variant: instructions(root, variant) for variant in ("run", "arun")}


def _counts_text(counts: dict[str, float] | str | None, quick: bool) -> str:
    if counts is None or isinstance(counts, str):
        return f"Instructions per step: not counted ({'quick mode' if quick else counts})."
    return (f"Instructions per step (deterministic; valgrind's callgrind, (a 60-step run - a 20-step one) / 40, "
            f"PYTHONHASHSEED=0, as `bench/overhead_ab.py --instructions`): loopfence run() (sync tool) "
            f"{counts['run']:,.0f}, arun() (async tool) {counts['arun']:,.0f}. Peers are not counted.")


JUDGED = ["loopfence", "loopfence_arun"]  # the rows the ratio goals are for
_VARIANTS = {"loopfence_arun": {"entry": "arun", "async_tools": True}, "loopfence_arun_sync": {"entry": "arun"},
             "loopfence_inline": {"inline_tools": True}, "loopfence_sync_model": {"sync_model": True}}
_LABELS = {"loopfence": "loopfence run()", "loopfence_arun": "loopfence arun()",
           "loopfence_arun_sync": "loopfence arun() (sync tool)", "loopfence_inline": "loopfence (tools inline)",
           "loopfence_sync_model": "loopfence (sync model)"}


def _label(frameworks: dict[str, ModuleType], name: str) -> str:
    return _LABELS.get(name) or frameworks[name].NAME
