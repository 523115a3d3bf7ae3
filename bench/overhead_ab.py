"""Per-step overhead of loopfence checkouts, interleaved on one machine: the fair comparison on a
shared VM whose speed drifts by 2-3x over a day (the overhead section's absolute figures do not
travel between machines; a ratio measured side by side does).

    bench/.venv/bin/python bench/overhead_ab.py /path/to/checkout-a /path/to/checkout-b [...]
        [--variant run|arun] [--rounds 8] [--steps 300] [--reps 5] [--instructions]

Each round runs every checkout once, in turn, in a fresh process (its own `src/` and `bench/` first
on the path): 4 warm-up runs of 50 steps, then `--reps` runs of `--steps` steps of the overhead
script (a no-op tool with fresh arguments, step limits lifted, the log to a real file), each timed
on the process's CPU clock, the run only. A checkout's figure: the median over rounds of each
round's median, and of each round's least run.

`--instructions` counts instead of timing (no noise at all; needs valgrind: `apt-get install
valgrind`): each checkout runs under callgrind twice, two 20-step runs then one of 20 or of 60
steps; instructions per step = the difference of the two totals / 40 (everything but the steps,
imports included, cancels out).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import gc, statistics, sys, time
root, variant, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path[:0] = [root + "/src", root]
from bench.common import CAP, Workspace, quiet
from bench.frameworks import loopfence_fw as fw
from bench.scripts import overhead_script
opts = {"run": {}, "arun": {"entry": "arun", "async_tools": True}}[variant]
def once(k):
    with Workspace() as ws, quiet():
        go = fw.prepare(overhead_script(k), ws, cap=CAP, unbounded=True, **opts)
        gc.collect(); gc.freeze()
        start = time.process_time(); out = go(); took = time.process_time() - start
        gc.unfreeze()
    if out.executions != k:
        raise SystemExit(f"{root}: the run did not complete: {out}")
    return took / k * 1e6
for _ in range(4):
    once(50)
runs = [once(n) for _ in range(reps)]
print(statistics.median(runs), min(runs))
"""


_COUNTED = r"""
import sys
root, variant, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [root + "/src", root]
from bench.common import CAP, Workspace, quiet
from bench.frameworks import loopfence_fw as fw
from bench.scripts import overhead_script
opts = {"run": {}, "arun": {"entry": "arun", "async_tools": True}}[variant]
for k in (20, 20, n):
    with Workspace() as ws, quiet():
        out = fw.prepare(overhead_script(k), ws, cap=CAP, unbounded=True, **opts)()
    if out.executions != k:
        raise SystemExit(f"{root}: the run did not complete: {out}")
"""


def instructions(checkout: Path, variant: str) -> float:
    """Instructions per step of `checkout` (callgrind's totals of a 60- and a 20-step process)."""
    totals = []
    for n in (20, 60):
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              "-c", _COUNTED, str(checkout.resolve()), variant, str(n)],
                             capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONHASHSEED": "0"})  # one hashing: the same work every time
        found = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode or not found:
            raise SystemExit(f"{checkout}: callgrind failed ({out.returncode}): {out.stderr.strip()[-500:]}")
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) / 40


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkouts", nargs="+", type=Path, help="loopfence checkouts (each with src/ and bench/)")
    p.add_argument("--variant", choices=["run", "arun"], default="run",
                   help="run(): a sync tool; arun(): asyncio.run(arun()) with an async tool (arun() needs issue 13)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--instructions", action="store_true", help="count instructions per step (valgrind) instead")
    a = p.parse_args(argv)
    if a.instructions:
        if shutil.which("valgrind") is None:
            print("--instructions needs valgrind: apt-get install valgrind", file=sys.stderr)
            return 2
        print(f"| checkout | {a.variant}(): instructions per step |")
        print("|---|---|")
        for c in a.checkouts:
            print(f"| {c} | {instructions(c, a.variant):,.0f} |", flush=True)
        return 0
    figures: dict[Path, list[tuple[float, float]]] = {c: [] for c in a.checkouts}
    for r in range(a.rounds):
        for c in a.checkouts:
            out = subprocess.run([sys.executable, "-c", _CHILD, str(c.resolve()), a.variant, str(a.steps),
                                  str(a.reps)], capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"{c}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}",
                      file=sys.stderr)
                return 1
            med, least = map(float, out.stdout.split())
            figures[c].append((med, least))
            print(f"round {r + 1}/{a.rounds} {c}: median {med:.0f}, least {least:.0f} µs/step", file=sys.stderr)
    print(f"| checkout | {a.variant}(): µs/step, median of round medians | median of round minima |")
    print("|---|---|---|")
    for c, rows in figures.items():
        print(f"| {c} | {statistics.median(m for m, _ in rows):.0f} | {statistics.median(x for _, x in rows):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
