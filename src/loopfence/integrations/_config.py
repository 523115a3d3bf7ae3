"""`Fence`: what to fence a framework's agent runs with, configured once (or taken from an
`Agent`); its `start()` begins one `FencedRun` (`_fence.py`) per run of the framework's agent, and
`tool()` makes the loopfence Tool for each of the framework's tools."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._agent import Agent
from .._compact import Compaction
from .._gate import ApprovalHook, UntrustedGate
from .._guards import Guard
from .._limits import Limits, Policy
from .._prices import PricesArg
from .._setup import start
from .._stops import RunResult
from .._log._schema import LogEvent
from .._log._writer import RunLog
from ..tools._executor import DEFAULT_RESULT_CAP
from ..tools._registry import Tool, ToolKind
from ..tools._registry import tool as make_tool
from ._fence import FencedRun, FenceStop, LimitOf, framework_call

__all__ = ["Fence", "Fenced", "LogArg"]

LogArg = str | Path | RunLog | Callable[[], "str | Path | RunLog"] | None


class _Described:
    """What the header records as the run's model: the framework, and the model's name."""

    def __init__(self, framework: str, model: str | None, max_tokens: int | None = None) -> None:
        self.info: dict[str, Any] = {"kind": framework, **({"model": model} if model else {}),
                                     **({"max_tokens": max_tokens} if max_tokens is not None else {})}

    def describe(self) -> dict[str, Any]:
        return self.info


class Fence:
    """What to fence a framework's agent runs with: configured once, one `FencedRun` per run.

    limits, policy, prices: as `loopfence.run()`. kinds: tool name -> `ToolKind` ("read_only":
    answered from the cache when asked again; "poll": exempt from repetition rules); other tools are
    `default_kind` (side_effect: never cached). untrusted: tools whose results are untrusted content
    (the gate taints the run); privileged: tools the gate refuses once the run is tainted (None: the
    gate's default names), unless `approve` allows the call. guards: a factory of extra guards, called
    per run (guards keep counts). log: a path (each run rewrites it), a `RunLog`, a callable giving
    one per run, or None (events kept in memory). on_event: each typed event as it is written.

    agent: an `Agent` whose settings the fence takes (configure once, for the ring and for a fenced
    framework): its limits, policy, prices, approve, guards, on_event, its gate's approval hook and
    privileged names, and its log folder (a log of its own there for each run). Its model and tools are the framework's. A keyword given
    here as well goes over the agent's.
    """

    def __init__(self, *, limits: Limits | None = None, policy: Policy | None = None,
                 kinds: Mapping[str, str | ToolKind] | None = None, default_kind: str | ToolKind = ToolKind.SIDE_EFFECT,
                 untrusted: Collection[str] = (), privileged: Collection[str] | None = None,
                 approve: ApprovalHook | None = None, guards: Callable[[], Iterable[Guard]] | None = None,
                 log: LogArg = None, on_event: Callable[[LogEvent], None] | None = None,
                 prices: PricesArg = None, result_cap: int | None = DEFAULT_RESULT_CAP,
                 agent: Agent | None = None) -> None:
        if agent is not None:
            limits, policy, prices = limits or agent.limits, policy or agent.policy, prices or agent.prices  # type: ignore[assignment]
            approve, on_event = approve or agent.approve, on_event or agent.on_event
            guards = guards or (None if agent.guards is None else functools.partial(copy.deepcopy, list(agent.guards)))
            log = log or (agent.new_log if agent.log is not None else None)
            if agent.gate is not None:  # its settings; each run has a gate of its own (a gate keeps the taint)
                approve = approve or agent.gate.approve
                privileged = privileged if privileged is not None else agent.gate.names
        self.limits = limits or Limits()
        self.policy = policy or Policy()
        self.kinds = {name: ToolKind(kind) for name, kind in (kinds or {}).items()}
        self.default_kind = ToolKind(default_kind)
        self.untrusted = frozenset(untrusted)
        self.privileged = None if privileged is None else frozenset(privileged)
        self.approve = approve
        self.guards = guards
        self.log = log
        self.on_event = on_event
        self.prices = prices
        self.result_cap = result_cap
        self.results: list[RunResult] = []  # every finished run's result, in the order they ended

    @property
    def result(self) -> RunResult | None:
        """The last finished run's result."""
        return self.results[-1] if self.results else None

    def tool(self, name: str, parameters: Mapping[str, Any] | None = None, description: str = "",
             fn: Callable[..., Any] | None = None, isolation: str = "async") -> Tool:
        """The loopfence Tool for a framework's tool, from its JSON schema: the contract binds a call's
        arguments to it (defaults applied) for the canonical key; the kind, untrusted and privileged
        flags come from this fence. `fn`: the tool's Python function, where the framework gives it:
        its signature binds the arguments (as `loopfence.tool(fn)` does, ~10x faster than the schema)
        when its parameters are the schema's properties (modelled at the tool's first call); the
        schema is what the log records either way. `isolation`: "async" (the framework's function runs
        under the tool timeout) or "inline" (a result already in hand, as the proxy's: nothing to time)."""
        params = dict(parameters or {"type": "object"})
        return _FrameworkTool.from_schema(name, framework_call, params, description=description,
                                          kind=self.kinds.get(name, self.default_kind),
                                          untrusted=name in self.untrusted,
                                          privileged=self.privileged is not None and name in self.privileged,
                                          isolation=isolation, source=fn)

    def start(self, task: str, tools: Iterable[Tool], *, framework: str, version: str | None = None,
              model: str | None = None, system: str | None = None,
              stop_error: type[FenceStop] = FenceStop, limit_of: LimitOf | None = None,
              header: Mapping[str, Any] | None = None, model_max_tokens: int | None = None) -> FencedRun:
        """A run begins: the header is written (the framework and its version recorded, and `header`'s
        own fields). PriceError for a cost budget whose model has no price, before anything is written.
        `limit_of`: the framework's own limit an error it raises reports (its `framework_limit` stop), or None.
        `model_max_tokens`: the model's own cap on a reply where a request sets none (the embedded model's),
        recorded and named by the stop when a reply is cut at it."""
        tools = list(tools)
        _known_kinds(self.kinds, tools)  # before the log is made or anything is sent
        log = self.log() if callable(self.log) else self.log
        gate = UntrustedGate(self.approve, self.privileged)
        extra = list(self.guards()) if self.guards is not None else None
        fields = {"framework": {"name": framework, **({"version": version} if version else {})}, **(header or {})}
        state, runlog, guards, _ = start(task, _Described(framework, model, model_max_tokens), list(tools), self.limits, self.policy,
                                         system, None, log, extra, None, fields, gate, None, Compaction.off(),
                                         self.on_event, self.prices)
        return FencedRun(self, state, runlog, guards, stop_error, limit_of=limit_of)


def _known_kinds(kinds: Mapping[str, ToolKind], tools: list[Tool]) -> None:
    """ValueError for a name in `kinds=` that no tool of the run has (a misspelt name would leave its
    tool `default_kind` without a word); the run's tools are known at its first request."""
    names = sorted(t.name for t in tools)
    unknown = [repr(k) for k in kinds if k not in names]
    if unknown:
        raise ValueError(f"kinds= names {', '.join(unknown)}, which no tool of this run has (its tools: "
                         f"{', '.join(names) or 'none'})")


@dataclass(frozen=True)
class _FrameworkTool(Tool):
    """A framework's tool: its arguments bound by the signature of `source` (its Python function),
    modelled when a call to it is first checked (a run's tools are made at its first request; most
    are never called), or by the schema where that function's parameters are not its properties."""

    source: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def validate(self, args: Any) -> dict[str, Any]:
        if self.source is not None:  # the first call: the signature's model, once
            object.__setattr__(self, "args_model", _signature_model(self.source, self.parameters))
            object.__setattr__(self, "source", None)
        return super().validate(args)


def _signature_model(fn: Callable[..., Any], params: Mapping[str, Any]) -> Any:
    """The arguments' model of `fn` (the ring's: bound to its signature, defaults applied), when its
    parameters are the schema's properties; None otherwise (the schema binds them)."""
    try:
        made = make_tool(fn)
    except Exception:  # noqa: BLE001 - a signature loopfence cannot model: the schema binds the arguments
        return None
    mine, theirs = made.parameters.get("properties", {}), params.get("properties", {})
    return made.args_model if isinstance(theirs, dict) and set(mine) == set(theirs) else None


class Fenced:
    """What every integration's entry point shares: it takes a `Fence`, or `Fence`'s keyword
    arguments, and gives its runs' RunResults (`result`: the last one, `results`: all)."""

    def __init__(self, fence: Fence | None = None, /, **options: Any) -> None:
        if fence is not None and options:
            raise TypeError(f"{type(self).__name__} takes a Fence or Fence's keyword arguments, not both")
        self.fence = fence or Fence(**options)

    @property
    def result(self) -> RunResult | None:
        return self.fence.result

    @property
    def results(self) -> list[RunResult]:
        return self.fence.results
