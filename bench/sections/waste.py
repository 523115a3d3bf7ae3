"""1. Waste on runaway scripts: every framework with its defaults, capped at 10,000 model calls; and
loopfence with Policy(nudge=True) (`loopfence_nudge`: one message before the first repetition stop)."""

from __future__ import annotations

from types import ModuleType

from ..common import CAP, Outcome, Workspace, quiet
from ..report import Section, table
from ..scripts import MINIMUM, RUNAWAY

TITLE = "Waste on runaway scripts"
QUICK_CAP = 200
NUDGE = "loopfence_nudge"


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cap = QUICK_CAP if quick else CAP
    results: dict[str, dict[str, Outcome]] = {}
    label = {name: fw.NAME for name, fw in frameworks.items()}
    for name, fw in frameworks.items():
        results[name] = {}
        for script in RUNAWAY:
            with Workspace() as ws, quiet():
                results[name][script.name] = fw.run_script(script, ws, cap=cap)
    if "loopfence" in frameworks:  # the same, nudged once before the first repetition stop
        label[NUDGE] = "loopfence, Policy(nudge=True)"
        results[NUDGE] = {}
        for script in RUNAWAY:
            with Workspace() as ws, quiet():
                results[NUDGE][script.name] = frameworks["loopfence"].run_script(script, ws, cap=cap, nudge=True)
    names = [s.name for s in RUNAWAY]
    summary = [[label[n], *(_cell(results[n][s]) for s in names)] for n in results]
    summary.append(["*rules' minimum*", *(str(MINIMUM[s]) for s in names)])
    detail = [[label[n], s.name, o.model_calls, o.executions, o.ended]
              for n in results for s in RUNAWAY for o in [results[n][s.name]]]
    md = "\n\n".join([
        f"Real tool executions (model calls) before each run ended; the scripted model raises after "
        f"{cap:,} calls (`cap`). Scripts: " + "; ".join(f"`{s.name}`: {s.note}" for s in RUNAWAY) + ".",
        table(["framework", *names], summary),
        "How each run ended:",
        table(["framework", "script", "model calls", "executions", "how it ended"], detail),
        "Defaults used: " + "; ".join(f"**{fw.NAME}**: {fw.DEFAULTS}" for fw in frameworks.values()),
    ])
    data = {n: {s: vars(o) for s, o in r.items()} for n, r in results.items()}
    return Section(TITLE, md, {"cap": cap, "results": data, "minimum": MINIMUM})


def _cell(o: Outcome) -> str:
    return f"{o.executions} ({o.model_calls})"
