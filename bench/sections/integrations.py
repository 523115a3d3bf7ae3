"""Integrations: each framework's own agent, without and with loopfence's fence around it
(loopfence.integrations.*), on the runaway and the legitimate scripts; and what the fence adds per
step next to the framework's own bare step (goal: at most 1.0x the bare step).

A framework joins by one entry in INTEGRATIONS: its bare adapter (bench/frameworks/NAME_fw.py, as
the waste section runs it) and its fenced adapter (the same agent with the integration added: same
module contract, NAME, version(), prepare(), run_script()). The overhead rows time both on the
overhead script (a no-op tool with fresh arguments every step, the frameworks' step limits lifted)
in CPU time, interleaved run by run, the least-disturbed run of each (shared machines); fence per step =
fenced - bare.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from ..common import CAP, Outcome, Workspace, quiet
from ..frameworks import load
from ..report import Section, load_average, load_note, met, table
from ..scripts import HONEST, MINIMUM, RUNAWAY
from .overhead import time_run, warm_up

TITLE = "Integrations: the fence inside other frameworks"
QUICK_CAP = 200
# (bare framework adapter, the same with loopfence's integration): one entry per framework
INTEGRATIONS: list[tuple[str, str]] = [("pydantic_ai", "pydantic_ai_fenced"),
                                      ("agents_sdk", "agents_sdk_fenced"),
                                      ("langchain", "langchain_fenced")]
FULL = {"ns": (20, 50, 100), "reps": 9}
GOAL = 1.0  # what the fence adds per step, at most this times the framework's bare step
QUICK = {"ns": (10, 30), "reps": 2}


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cap = QUICK_CAP if quick else CAP
    cfg = QUICK if quick else FULL
    load_start = load_average()
    pairs, skipped = _pairs(frameworks)
    scripts = [*RUNAWAY, *HONEST]
    waste: list[list[Any]] = []
    steps: list[list[Any]] = []
    data: dict[str, Any] = {"cap": cap, "minimum": MINIMUM, "results": {}, "per_step_us": {}}
    for name, bare, fenced in pairs:
        row_bare: dict[str, Outcome] = {}
        row_fenced: dict[str, Outcome] = {}
        for script in scripts:
            with Workspace() as ws, quiet():
                row_bare[script.name] = bare.run_script(script, ws, cap=cap)
            with Workspace() as ws, quiet():
                row_fenced[script.name] = fenced.run_script(script, ws, cap=cap)
        data["results"][name] = {"without": {s: vars(o) for s, o in row_bare.items()},
                                 "with": {s: vars(o) for s, o in row_fenced.items()}}
        false_stops = sum(not row_fenced[s.name].answered for s in HONEST)
        waste.append([bare.NAME, "without", *(_cell(row_bare[s.name]) for s in RUNAWAY),
                      sum(not row_bare[s.name].answered for s in HONEST)])
        waste.append([bare.NAME, "**with loopfence**", *(_cell(row_fenced[s.name]) for s in RUNAWAY), false_stops])
        per_step = _per_step(bare, fenced, cfg["ns"], cfg["reps"])
        data["per_step_us"][name] = per_step
        steps.append(per_step)
    ns = cfg["ns"]
    overhead_rows = [[bare.NAME, *(f"{p['bare'][n]:,.0f}" for n in ns), *(f"{added(p, n):,.0f}" for n in ns),
                      *(f"{added(p, n) / p['bare'][n]:.2f}x" for n in ns),
                      met(all(added(p, n) <= GOAL * p["bare"][n] for n in ns))]
                     for (_, bare, _), p in zip(pairs, steps, strict=True)]
    data["load_average"] = {"start": load_start, "end": load_average()}
    md = [
        load_note(load_start, data["load_average"]["end"]),
        "Real tool executions (model calls) per runaway script, each framework's own agent with its "
        f"defaults, without and with loopfence's integration; the scripted model raises after {cap:,} "
        "calls (`cap`). The last column: legitimate scripts (" + ", ".join(f"`{s.name}`" for s in HONEST) +
        ") that did not reach their answer.",
        table(["framework", "fence", *(s.name for s in RUNAWAY), "false stops"], waste),
        "*loopfence's own figures (the rules' minimum):* " + ", ".join(f"{k} {v}" for k, v in MINIMUM.items()) + ".",
        f"Per step, µs of CPU (the process's, all threads; the least of {cfg['reps']} interleaved runs of "
        f"{', '.join(map(str, ns))} steps; the no-op tool with fresh arguments; step limits lifted; loopfence "
        "writes its log to a real file): "
        "the bare framework's own step, what the fence adds to it (fenced - bare), and that as a ratio of "
        f"the bare step. Goal: the fence adds at most {GOAL:g}x the bare step at every N.",
        table(["framework", *(f"bare @{n}" for n in ns), *(f"fence adds @{n}" for n in ns),
               *(f"added / bare @{n}" for n in ns), f"goal ≤ {GOAL:g}x"], overhead_rows),
    ]
    if skipped:
        md.append("Not run here: " + "; ".join(skipped) + ".")
    return Section(TITLE, "\n\n".join(md), data)


def _pairs(frameworks: dict[str, ModuleType]) -> tuple[list[tuple[str, ModuleType, ModuleType]], list[str]]:
    pairs, skipped = [], []
    for bare_name, fenced_name in INTEGRATIONS:
        if bare_name not in frameworks:
            skipped.append(f"{bare_name} (not selected or not installed)")
            continue
        try:
            pairs.append((bare_name, frameworks[bare_name], load(fenced_name)))
        except ImportError as exc:
            skipped.append(f"{fenced_name} ({exc})")
    return pairs, skipped


def _per_step(bare: ModuleType, fenced: ModuleType, ns: tuple[int, ...], reps: int) -> dict[str, dict[int, float]]:
    warm_up(bare, ns[0])
    warm_up(fenced, ns[0])
    out: dict[str, dict[int, float]] = {"bare": {}, "fenced": {}}
    for n in ns:
        times: dict[str, list[float]] = {"bare": [], "fenced": []}
        for _ in range(reps):  # interleaved: a busy moment hits both
            times["bare"].append(cpu_run(bare, n))
            times["fenced"].append(cpu_run(fenced, n))
        for k, ts in times.items():
            out[k][n] = min(ts) / n * 1e6
    return out


def added(per_step: dict[str, dict[int, float]], n: int) -> float:
    """µs of CPU the fence adds per step at n steps (fenced - bare)."""
    return per_step["fenced"][n] - per_step["bare"][n]


def cpu_run(fw: ModuleType, n: int) -> float:
    """CPU seconds (all of the process's threads) of one n-step run, the run only."""
    return time_run(fw, n, clock=time.process_time)


def _cell(o: Outcome) -> str:
    return f"{o.executions} ({o.model_calls})"


def main(argv: list[str] | None = None) -> None:
    """Only the per-step rows (no runaway table): `python -m bench.sections.integrations --ns 20,100 --reps 5`."""
    import argparse

    from ..frameworks import available

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--ns", default="20,50,100", help="steps per run, comma list")
    p.add_argument("--reps", type=int, default=FULL["reps"], help="interleaved runs of each; the least is kept")
    args = p.parse_args(argv)
    ns = tuple(int(n) for n in args.ns.split(","))
    found = {k: v for k, v in available([bare for bare, _ in INTEGRATIONS]).items() if not isinstance(v, str)}
    pairs, skipped = _pairs(found)
    print(f"load average at the start: {load_average()}")
    rows = [(bare.NAME, _per_step(bare, fenced, ns, args.reps)) for _, bare, fenced in pairs]
    for name, p_ in rows:
        print(f"{name}: " + "; ".join(f"@{n} bare {p_['bare'][n]:,.0f}, fence adds {added(p_, n):,.0f} "
                                      f"({added(p_, n) / p_['bare'][n]:.2f}x)" for n in ns))
    print(f"load average at the end: {load_average()}" + (f"; not run: {skipped}" if skipped else ""))


if __name__ == "__main__":
    main()
