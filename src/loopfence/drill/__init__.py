"""The drill: scenario files, the misbehaving stub tools, and the decision table.

    from loopfence.drill import load_scenarios, run_scenario
    for s in load_scenarios(["drills/"]):
        row = run_scenario(s, "runs/drill")
        row.stop, row.passed, row.mismatches

The scenario file format is public and stable: docs/DRILL.md.
"""

from ._calls import CallRecord, calls_from_events
from ._load import (builtin_tool_names, find_scenario_files, known_tool_names, load_each, load_scenario,
                    load_scenarios)
from ._models import DrillSetupError, Endpoint, ModelFactory, scripted_models
from ._runner import DrillResult, run_scenario
from ._scenario import CannedTool, Expect, ExpectedCall, Scenario, ScenarioError
from ._stubs import STUB_NAMES, stub_tools
from ._table import decision_table, print_table, write_results
from ._tools import canned_tool, scenario_tools

__all__ = [
    "CallRecord", "CannedTool", "DrillResult", "DrillSetupError", "Endpoint", "Expect", "ExpectedCall",
    "ModelFactory", "STUB_NAMES", "Scenario", "ScenarioError", "builtin_tool_names", "calls_from_events",
    "canned_tool", "decision_table", "find_scenario_files", "known_tool_names", "load_each", "load_scenario",
    "load_scenarios", "print_table", "run_scenario", "scenario_tools", "scripted_models", "stub_tools",
    "write_results",
]
