"""Running one scenario: a fresh temp workspace, its tools, a model from the factory, the fenced run."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import MAX_LOG_DEPTH, dumps, loads
from .._agent import run
from .._stops import RunResult
from .._log import RunLog
from .._log._schema import LogEvent
from ..tools import ArgumentError, Registry, Tool
from ._calls import CallRecord, calls_from_events
from ._expect import Observed, mismatches
from ._models import DrillSetupError, ModelFactory, scripted_models
from ._scenario import Scenario, ScenarioError
from ._tools import make_workspace, scenario_tools

__all__ = ["DrillResult", "run_scenario"]


@dataclass(frozen=True, slots=True)
class DrillResult:
    """One row of the decision table."""

    name: str
    file: str
    expected_stop: str | None
    stop: str | None
    verdict: str | None
    detail: str
    counts: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    calls: tuple[CallRecord, ...] = ()
    passed: bool | None = None  # None: the scenario has no expect
    mismatches: tuple[str, ...] = ()
    error: str | None = None  # the scenario could not run
    log: str | None = None

    @classmethod
    def bad_file(cls, exc: ScenarioError) -> DrillResult:
        """The row of a scenario file that could not be loaded: it names the file and the field."""
        why = str(exc)
        return cls(Path(exc.file).stem, exc.file, None, None, None, why, passed=False, mismatches=(why,),
                   error=why)

    @property
    def failed(self) -> bool:
        return self.error is not None or self.passed is False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "file": self.file, "stop": self.stop, "verdict": self.verdict,
            "detail": self.detail, **{k: self.counts.get(k, 0) for k in _COUNTS},
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "elapsed_s": round(self.elapsed_s, 3), "calls": [c.to_json() for c in self.calls],
            "log": self.log,
        }
        if self.expected_stop is not None:
            out["expected_stop"] = self.expected_stop
        if self.error is not None:
            out["error"] = self.error
        if self.passed is not None or self.error is not None:
            out["pass"] = not self.failed
            out["mismatches"] = list(self.mismatches)
        return out


_COUNTS = ("model_requests", "tool_calls", "tool_executions", "reused", "refused", "rejected")


def run_scenario(scenario: Scenario, out_dir: str | Path, models: ModelFactory = scripted_models,
                 extra_tools: Iterable[Tool] = (), header: dict[str, Any] | None = None) -> DrillResult:
    """Run one scenario; its log goes to `out_dir/<name>.jsonl`. Never raises for a run's outcome.
    `extra_tools` (e.g. the `--mcp` servers' tools) go next to the scenario's own, `header` into the
    log's header; the scenario's own MCP servers (`mcp`) start for it and stop after it."""
    log_path = Path(out_dir) / f"{scenario.name}.jsonl"
    expected = str(scenario.expect.stop) if scenario.expect and scenario.expect.stop else None
    events: list[LogEvent] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"loopfence-drill-{scenario.name}-") as tmp:
        root = Path(tmp).resolve()
        try:
            make_workspace(root, scenario)
            own = [*scenario_tools(scenario, root), *extra_tools]
            with models(scenario) as model, _servers(scenario, [t.name for t in own]) as mcp:
                registry = Registry([*own, *mcp])
                result = run(scenario.task, model=model, tools=registry, limits=scenario.limits,
                             policy=scenario.policy, system=scenario.system, params=scenario.params,
                             log=RunLog(log_path, on_event=events.append),
                             header={**(header or {}), **_merged_mcp(header, mcp), "workspace": str(root),
                                     "drill": {"scenario": scenario.name, "file": scenario.file}})
        except Exception as exc:  # noqa: BLE001 - a scenario that cannot run is a failed row
            why = str(exc) if isinstance(exc, (DrillSetupError, OSError)) else f"{type(exc).__name__}: {exc}"
            return DrillResult(scenario.name, scenario.file, expected, None, None, why,
                               elapsed_s=time.monotonic() - started, passed=False,
                               mismatches=(why,), error=why)
        expect = scenario.expect
        existing = frozenset(p for p in (expect.files_exist if expect else ()) if (root / p).exists())
    return _row(scenario, expected, result, calls_from_events(events), existing, registry, log_path)


@contextmanager
def _servers(scenario: Scenario, reserved: list[str]) -> Iterator[Any]:
    """The scenario's own MCP servers, open for its run (no tools when it names none)."""
    spec = scenario.mcp
    if spec is None:
        yield ()
        return
    from ..mcp import McpServer, mcp_tools

    folder = str(Path(scenario.file).resolve().parent) if scenario.file != "<memory>" else None
    group = mcp_tools(*(McpServer.parse(text, cwd=folder) for text in spec.servers),  # cwd: stdio only
                      trust_annotations=spec.trust, kinds=spec.kinds, reserved=reserved)
    try:
        group.open()
    except Exception as exc:  # noqa: BLE001 - a server that does not start fails this row only
        raise DrillSetupError(f"mcp: {type(exc).__name__}: {exc}") from None
    try:
        yield group
    finally:
        group.close()


def _merged_mcp(header: dict[str, Any] | None, mcp: Any) -> dict[str, Any]:
    """One `mcp.servers` list in the header: the --mcp servers' and the scenario's own."""
    own = mcp.header() if hasattr(mcp, "header") else {}
    given = (header or {}).get("mcp", {}).get("servers", [])
    servers = [*given, *own.get("mcp", {}).get("servers", [])]
    return {"mcp": {"servers": servers}} if servers else {}


def _searchable(log_path: Path) -> str:
    """The run log's text as `log_contains` searches it: the lines as written (compact JSON), then
    each again with the usual `", "` and `": "` spacing, so either spelling of a field is found."""
    text = log_path.read_text(encoding="utf-8")
    spaced = []
    for line in text.splitlines():
        try:
            spaced.append(dumps(loads(line, max_depth=MAX_LOG_DEPTH)))
        except ValueError:  # a cut last line: searched as written
            continue
    return text + "\n" + "\n".join(spaced)


def _row(scenario: Scenario, expected: str | None, result: RunResult, calls: list[CallRecord],
         existing: frozenset[str], registry: Registry, log_path: Path) -> DrillResult:
    led = result.ledger
    counts = {k: int(getattr(led, k)) for k in _COUNTS}
    passed, problems = None, ()
    if scenario.expect is not None:
        log_text = _searchable(log_path) if scenario.expect.log_contains else ""
        observed = Observed(str(result.stop.reason), str(result.verdict), counts, led.elapsed_s,
                            tuple(calls), existing, log_text)
        problems = tuple(mismatches(scenario.expect, observed, lambda n, a: _bind(registry, n, a)))
        passed = not problems
    return DrillResult(scenario.name, scenario.file, expected, str(result.stop.reason), str(result.verdict),
                       result.stop.detail, counts, led.prompt_tokens, led.completion_tokens, led.elapsed_s,
                       tuple(calls), passed, problems, None, str(log_path))


def _bind(registry: Registry, name: str, arguments: dict[str, Any]) -> Any:
    t = registry.get(name)
    if t is None:
        return arguments
    try:
        return t.validate(arguments)
    except ArgumentError:
        return arguments
