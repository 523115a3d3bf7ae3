"""2. No false stops: honest scripts that must reach their final answer under default settings."""

from __future__ import annotations

from types import ModuleType

from ..common import CAP, Outcome, Workspace, quiet
from ..report import Section, table
from ..scripts import HONEST

TITLE = "No false stops"


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    results: dict[str, dict[str, Outcome]] = {}
    for name, fw in frameworks.items():
        results[name] = {}
        for script in HONEST:
            with Workspace() as ws, quiet():
                results[name][script.name] = fw.run_script(script, ws, cap=CAP)
    names = [s.name for s in HONEST]
    rows = [[frameworks[n].NAME, *(_cell(results[n][s]) for s in names),
             sum(not results[n][s].answered for s in names)] for n in results]
    md = "\n\n".join([
        "Each script must reach its final answer with default settings. Scripts: " +
        "; ".join(f"`{s.name}`: {s.note}" for s in HONEST) + ".",
        table(["framework", *names, "false stops"], rows),
    ])
    data = {n: {s: vars(o) for s, o in r.items()} for n, r in results.items()}
    return Section(TITLE, md, {"results": data})


def _cell(o: Outcome) -> str:
    verdict = "answer" if o.answered else f"STOPPED: {o.ended}"
    return f"{verdict} ({o.model_calls} calls, {o.executions} executions)"
