"""`Agent`: a run's configuration, checked once, then any number of tasks; and `run`, `arun`,
`stream`, which make one for a single task.

    agent = Agent(model=OpenAIModel.from_env(), tools=workspace_tools("."), limits="coding")
    result = agent.run("Fix the failing test")        # or: await agent.arun(...), agent.stream(...)
    agent.batch("episodes.jsonl", out="runs/job")      # every episode under the same settings

Every run goes through one path, `_loop.to_stop`. An agent's sync calls (`run`, `batch`, a sync
`stream`) share one event loop of the agent's own (`_aio.KeptLoop`), so an `OpenAIModel`, which
keeps a connection pool per event loop, keeps one pool, and its keep-alive connections, from run to
run. `close()` (or `with`) closes that loop and the model's connections. `run(task, model=...)`
makes an agent and runs the task on a fresh loop, closed after, as one call should.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, Unpack

from ._aio import KeptLoop, run_sync
from ._batch import BatchResult, Episode, abatch
from ._answer import AnswerArg, answer_contract
from ._compact import Compaction
from ._conversation import Task, check_task
from ._gate import ApprovalHook, UntrustedGate
from ._guards import Guard
from ._keywords import keywords_checked, unknown_keywords
from ._limits import Limits, Policy
from ._loop import LogArg, RunSettings, Settings, arun_with, check_model, check_price, to_stop
from ._prices import PricesArg
from ._setup import config_of
from ._stops import RunResult
from ._stream import RunStream
from .models._base import Model
from ._log._schema import LogEvent
from ._log._writer import RunLog
from .tools._executor import Executor
from .tools._registry import Registry, Tool

__all__ = ["Agent", "run", "arun", "stream"]

Episodes = str | Path | Iterable[Episode | Mapping[str, Any]] | None


@dataclass(frozen=True, eq=False)
class Agent:
    """A model, its tools and the run's settings, configured once; `run(task)`, `await arun(task)`,
    `stream(task)` and `batch(episodes, out=...)` take just the work. Frozen: change a setting for
    one call with a keyword (`agent.run(task, limits={"max_steps": 3}, log="one.jsonl")`), or make
    another agent (`dataclasses.replace(agent, ...)`).

    The settings are `run()`'s keywords (docs/python-api.md), checked here, before any run:
    `model=` a model adapter (TypeError for a name); `tools=` Tools or functions (a name twice is a
    ValueError); `limits=` a Limits, a dict of its fields or a profile's name (`"coding"`, `"chat"`,
    `"default"`); `policy=` a Policy or a dict; a cost budget with no price is a PriceError.
    After checking, `limits` and `policy` hold their objects, `tools` a tuple of Tools, and `params`
    and `header` read-only mappings.

    answer: the answer contract (loopfence._answer): a pydantic model class, a JSON schema (a dict) or a
      function `(text) -> error message | None`. A final answer that fails it goes back to the model
      with the error as a user message (`answer_retries` times, default 1), then the run stops
      `answer_rejected`; an accepted one is `result.output` (the model's instance, the parsed JSON).

    log: a folder: each run writes its own log there (`run-<UTC time>-<id>.jsonl`); None (the
      default) writes none. One call's own file: `agent.run(task, log="that.jsonl")` (a path or a
      RunLog, as run() takes it).

    `run()`, `batch()` and a sync `stream()` run on the agent's event loop, one loop for all its sync
    calls (inside a running event loop, or while another thread is using it, a call gets a loop of
    its own, as `run()` does). Ctrl-C during `agent.run()` ends the run `cancelled` and returns its
    result, as `run()` does (a second Ctrl-C raises KeyboardInterrupt). `close()` (or `with Agent(...) as agent:`) closes the loop and the
    model's connections (an `OpenAIModel` opens new ones if it is used again).
    """

    model: Model
    tools: Iterable[Tool | Callable[..., Any]] | Registry = ()
    limits: Limits | Mapping[str, Any] | str | None = None
    policy: Policy | Mapping[str, Any] | None = None
    system: str | None = None
    params: Mapping[str, Any] | None = None
    log: str | Path | None = None
    on_event: Callable[[LogEvent], None] | None = None
    guards: Iterable[Guard] | None = None
    gate: UntrustedGate | None = None
    approve: ApprovalHook | None = None
    compaction: Compaction | None = None
    prices: PricesArg = None
    answer: AnswerArg = None
    answer_retries: int = 1
    header: Mapping[str, Any] | None = None
    executor: Executor | None = None
    _loop: KeptLoop = field(init=False, repr=False)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - frozen: set once, here
        check_model(self.model)
        put("tools", tuple(Registry(self.tools)))  # type: ignore[arg-type]
        put("limits", config_of(Limits, self.limits, "limits"))  # type: ignore[arg-type]
        put("policy", config_of(Policy, self.policy, "policy"))  # type: ignore[arg-type]
        put("params", MappingProxyType(dict(self.params or {})))
        put("header", MappingProxyType(dict(self.header or {})))
        put("guards", None if self.guards is None else tuple(self.guards))
        _check_folder(self.log)
        check_price(self.model, self.limits, self.prices, dict(self.params))  # type: ignore[arg-type]
        answer_contract(self.answer, self.answer_retries)
        put("_loop", KeptLoop())

    # -- one task ------------------------------------------------------------------------------------
    async def arun(self, task: Task, **changes: Unpack[RunSettings]) -> RunResult:
        """`arun()` with the agent's settings (any of them changed for this call by keyword)."""
        return await arun_with(task, self._settings(changes, called="Agent.arun()"))

    def run(self, task: Task, **changes: Unpack[RunSettings]) -> RunResult:
        """The run from sync code, on the agent's event loop (see the class): its RunResult."""
        settings = self._settings(changes, called="Agent.run()")
        return self._loop.run(lambda: to_stop(task, settings))[0]

    def stream(self, task: Task, **changes: Unpack[RunSettings]) -> RunStream:
        """`stream()` with the agent's settings: `async for` / `for` over the run's typed events (a
        sync `for` runs on the agent's event loop, over its connection pool)."""
        check_task(task)
        return RunStream(task, self._settings(changes, called="Agent.stream()"), self._loop.run)

    # -- many ----------------------------------------------------------------------------------------
    async def abatch(self, episodes: Episodes = None, *, out: str | Path, **options: Any) -> BatchResult:
        """`abatch()` with every episode under the agent's settings (an episode's own limits, policy,
        params and system go over them). `options`: abatch's own (concurrency, resume, retry_stops,
        ...). Each episode's log is in `out`, whatever the agent's `log`."""
        extra = {"system": self.system, "on_event": self.on_event, "guards": self.guards, "gate": self.gate,
                 "approve": self.approve, "compaction": self.compaction, "executor": self.executor,
                 "answer": self.answer, "answer_retries": self.answer_retries}
        return await abatch(episodes, model=self.model, out=out, tools=list(self.tools),  # type: ignore[arg-type]
                            limits=self.limits, policy=self.policy, params=dict(self.params or {}),  # type: ignore[arg-type]
                            prices=self.prices, header=dict(self.header or {}),
                            run_options={k: v for k, v in extra.items() if v is not None}, **options)

    def batch(self, episodes: Episodes = None, *, out: str | Path, **options: Any) -> BatchResult:
        """`abatch` from sync code, on the agent's event loop: the batch's results."""
        return self._loop.run(lambda: self.abatch(episodes, out=out, **options))

    # -- the loop ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the agent's event loop and its model's connections (`aclose()`, where it has one)."""
        aclose = getattr(self.model, "aclose", None)
        self._loop.close(aclose if callable(aclose) else None)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _settings(self, changes: Mapping[str, Any], *, own: bool = True, called: str = "Agent.run()") -> RunSettings:
        """One run's settings: the agent's, with `changes` checked as Agent(...) checks. `own`: the
        run gets its own copy of the gate and of each guard (their counts and taint are one run's:
        an agent's second run starts clean); a one-task agent (`run()`) passes the caller's own."""
        changes = dict(changes)
        log = changes.pop("log") if "log" in changes else self.new_log()
        unknown_keywords(called, changes, [*_SETTINGS, "log"])
        me = dataclasses.replace(self, **changes) if changes else self
        settings: dict[str, Any] = {name: getattr(me, name) for name in _SETTINGS}
        settings.update(header=me.header or None, log=log)
        if own:
            settings.update(gate=copy.deepcopy(me.gate), guards=copy.deepcopy(me.guards))
        return settings  # type: ignore[return-value]

    def new_log(self) -> Path | None:
        """A new run's own log in the agent's `log` folder (`run-<UTC time>-<id>.jsonl`; None without one)."""
        if self.log is None:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        return Path(self.log) / f"run-{stamp}-{uuid.uuid4().hex[:8]}.jsonl"


_SETTINGS = tuple(f.name for f in dataclasses.fields(Agent) if f.init and f.name != "log")
keywords_checked(Agent)  # Agent(limts=...) names Agent() and the nearest setting


def _check_folder(log: Any) -> None:
    if log is None:
        return
    if isinstance(log, RunLog) or not isinstance(log, (str, Path)):
        raise TypeError(f"Agent(log=) is a folder, each run writing its own log there, got {type(log).__name__}; "
                        "one run's RunLog goes to that call: agent.run(task, log=...)")
    if (Path(log).exists() and not Path(log).is_dir()) or str(log).endswith(".jsonl"):
        raise ValueError(f"Agent(log=) is a folder, each run writing its own log there, got the file {str(log)!r}; "
                         "one run's own file goes to that call: agent.run(task, log=...)")


# -- one task: an Agent made for it ----------------------------------------------------------------
def run(task: Task, *, model: Model, log: LogArg = None, **settings: Unpack[Settings]) -> RunResult:
    """Run the fenced loop until it stops for a named reason: `Agent(model=model, **settings)`'s
    run, on an event loop of its own (inside a running event loop, on a helper thread). Never raises
    for a stop; raises LogWriteError (an OSError) when the log cannot be written, ending the run
    where its log ends. Ctrl-C ends the run `cancelled` and returns its result (a second Ctrl-C
    raises KeyboardInterrupt). A bad argument raises before anything is written or sent.

    task: a string, or a conversation to continue: OpenAI chat messages ending with the user's, e.g.
    `[*result.messages, {"role": "user", "content": "next"}]` (`result.messages` is the conversation
    so far). Each call is one run, with its own log and budgets (a whole conversation's budget:
    `limits=Limits(...).left_after(*earlier_ledgers)`). A conversation that opens with a system
    message keeps its own; else `system` goes first.
    log: a path or a RunLog (None: no log file). The rest as `Agent(...)`'s settings:
    gate: the untrusted-content gate (default: UntrustedGate(approve); `approve` None denies);
    compaction: the outgoing-context policy (default: Compaction(); `Compaction.off()` disables);
    on_event: called with each typed event (_log._schema) as it is written, header to stop;
    prices: the price table for the cost budget (`Limits(max_cost_usd=...)`): a mapping
    `{"model": (input_per_mtok, output_per_mtok)}` ("*": any model nothing else prices) or a TOML
    file's path, over the `genai-prices` package's table. With a cost budget (or a table) the ledger
    counts dollars. A cost budget for a model with no known price raises PriceError (a ValueError)
    before anything is written or sent.
    """
    unknown_keywords("run()", settings, [*_SETTINGS, "log"])
    one = Agent(model=model, **settings)._settings({"log": log}, own=False)
    return run_sync(to_stop(task, one))[0]


async def arun(task: Task, *, model: Model, log: LogArg = None, **settings: Unpack[Settings]) -> RunResult:
    """Run the fenced loop until it stops for a named reason, on the running event loop: `Agent(model=
    model, **settings)`'s arun. Every operation (model request, token count, tool, approval) is
    awaited under the run's limits: an async adapter (`acomplete`, `acount_tokens`, an `async def`
    tool) is awaited and cancelled at its deadline; a sync one runs on the worker pool and the run
    goes on without it at the deadline.

    Never raises for a stop; raises LogWriteError (an OSError) when the log cannot be written.
    Cancelling the task that awaits it (or an `asyncio.timeout` around it) ends the run `cancelled`:
    nothing new starts, the call in flight is cancelled or killed (its result `outcome_unknown`),
    every other requested call is answered `not_executed`, the stop line is written, and then
    CancelledError propagates, as asyncio expects (the stop is in the log: `runlog.read_log`).
    A SystemExit raised inside (by a model or a guard) ends the run `cancelled` and then propagates;
    a bug inside loopfence ends it `internal_error` with the traceback in the stop's data.
    Arguments as `run()`.
    """
    unknown_keywords("arun()", settings, [*_SETTINGS, "log"])
    return await arun_with(task, Agent(model=model, **settings)._settings({"log": log}, own=False))


def stream(task: Task, *, model: Model, log: LogArg = None, **settings: Unpack[Settings]) -> RunStream:
    """The run as a stream of its typed events (loopfence._log._schema), ending with the stop; the
    final RunResult is `.result` once the stop has been yielded. `async for` or plain `for` (see
    RunStream; a plain `for` runs on a fresh event loop of its own). Arguments as `run()`."""
    unknown_keywords("stream()", settings, [*_SETTINGS, "log"])
    check_task(task)
    return RunStream(task, Agent(model=model, **settings)._settings({"log": log}, own=False))
