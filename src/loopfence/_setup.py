"""A run's start: its settings checked (`config_of`), its state, its price, and its log with the
header written (`start`), before the ring's first step (`_steps`). The ring and the framework
fences start a run here alike."""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from ._answer import AnswerArg, answer_contract
from ._compact import Compaction
from ._conversation import Task, opening
from ._gate import ApprovalHook, UntrustedGate
from ._guards import Guard, Guards, default_guards
from ._hooks import with_run_hooks
from ._json import loggable
from ._limits import Limits, Policy
from ._prices import PricesArg, price_book
from ._state import RunState
from ._log._schema import HeaderLine, LogEvent
from ._log._writer import FORMAT, VERSION, RunLog
from .tools._executor import Executor
from .tools._registry import Registry, Tool

__all__ = ["start", "new_state", "config_of", "set_price", "describe_model", "model_cap"]

C = TypeVar("C", Limits, Policy)


def start(task: Task, model: Any, tools: Iterable[Tool] | Registry, limits: Limits | Mapping[str, Any] | None,
          policy: Policy | Mapping[str, Any] | None, system: str | None, params: dict[str, Any] | None,
          log: RunLog | str | Path | None, guards: list[Guard] | None, executor: Executor | None,
          header: dict[str, Any] | None, gate: UntrustedGate | None, approve: ApprovalHook | None,
          compaction: Compaction | None,
          on_event: Callable[[LogEvent], None] | None = None,
          prices: PricesArg = None, answer: AnswerArg = None,
          answer_retries: int = 1) -> tuple[RunState, RunLog, Guards, Executor]:
    """The run's state, and its log with the header written (a cost budget's price is resolved
    first: PriceError before anything is written). `model`: anything with `describe()` (recorded
    in the header, and its name prices a cost budget)."""
    if on_event is not None and (inspect.iscoroutinefunction(on_event) or not callable(on_event)):
        raise TypeError("on_event must be a plain function, called with each event as it is written (an "
                        "async def one would never be awaited: hand its events to a queue, or use stream())")
    registry = tools if isinstance(tools, Registry) else Registry(tools)
    if isinstance(task, str):
        task = loggable(task)  # as the header reads back (replay)
    system = system and loggable(system)
    messages, text, conversation = opening(task, system)
    gate = gate or UntrustedGate(approve)
    state = new_state(registry, config_of(Limits, limits, "limits"), config_of(Policy, policy, "policy"),
                      params or {}, messages, compaction or Compaction())
    described = describe_model(model)
    state.model_cap = model_cap(described)
    set_price(state, model, described, prices)
    state.answer = answer_contract(answer, answer_retries)
    priced = {"prices": state.prices.record(state.price)} if state.prices is not None else {}
    if state.answer is not None:
        priced["answer"] = state.answer.describe()
    runlog = log if isinstance(log, RunLog) else RunLog(log, t0=state.t0)
    state.t0 = runlog.t0  # one clock: what happened since a given log began (servers starting) is the run's
    runlog.on_event = with_run_hooks(runlog.on_event, on_event)  # the log's own (the console), the
    # caller's, then loopfence.instrument() and other run hooks
    state.run_id = uuid.uuid4().hex  # sent with each request (Request.run_id)
    runlog.write(HeaderLine(
        format=FORMAT, version=VERSION, run_id=state.run_id, started_at=datetime.now(timezone.utc).isoformat(),
        task=text, system=system, **({"messages": messages} if conversation else {}),
        limits=state.limits.to_json(), policy=state.policy.to_json(), params=state.params,
        tools=[{"kind": str(t.kind), "untrusted": t.untrusted, "privileged": t.privileged,
                **({"arguments": "signature"} if t.args_model is not None else {}), **t.schema()} for t in registry],
        model=described, gate=gate.describe(), compaction=state.compaction.to_json(),
        **_tool_info(registry), **priced, **(header or {})))
    return state, runlog, default_guards(state.limits, guards, gate), executor or Executor()


def config_of(cls: type[C], value: C | Mapping[str, Any] | None, what: str) -> C:
    """`limits=` or `policy=` as run() takes it: the class's instance, None (its defaults), a
    mapping of its field names (the others keep their defaults), or for limits a profile's name
    (`"coding"`: `Limits.profile`). TypeError for anything else, ValueError naming every unknown
    key or profile, before the run starts."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, str) and cls is Limits:
        return Limits.profile(value)  # type: ignore[return-value]
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a {cls.__name__} or a dict of its fields (e.g. {what}="
                        f"{cls.__name__}(...) or {what}={{...}}), got {type(value).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = [repr(k) for k in value if k not in names]
    if unknown:
        raise ValueError(f"{what}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                         f"(known: {', '.join(names)})")
    return cls(**value)


def set_price(s: RunState, model: Any, described: dict[str, Any], prices: PricesArg) -> None:
    """The run's price book and start price, where it has a cost budget or a price table; PriceError
    for a cost budget with no price. Priced by the name the model's describe() gives (what an
    `OpenAIModel` sends, whatever the params say), else by the `model` the request params set."""
    if prices is None and s.limits.max_cost_usd is None:
        return
    name = described.get("model")
    if not (isinstance(name, str) and name):
        name = s.params.get("model")
    s.set_prices(price_book(prices), name if isinstance(name, str) and name else None,
                 f"{type(model).__name__}, kind {described.get('kind')!r}")


def _tool_info(registry: Registry) -> dict[str, Any]:
    """What tools report about themselves for the header (run_command: the bounds in force)."""
    info = {t.name: t.info for t in registry if t.info}
    return {"tool_info": info} if info else {}


def describe_model(model: Any) -> dict[str, Any]:
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else {"kind": type(model).__name__}


def model_cap(described: Any) -> int | None:
    """The model's own cap on a reply's tokens where a request sets none, as its description records
    it (`max_tokens`: the embedded model's); None where it records none."""
    cap = described.get("max_tokens") if isinstance(described, dict) else None
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1 else None


def new_state(registry: Registry, limits: Limits, policy: Policy, params: dict[str, Any],
              messages: list[dict[str, Any]], compaction: Compaction | None = None) -> RunState:
    return RunState(limits, policy, registry, dict(params), messages=messages,
                    compaction=compaction or Compaction())
