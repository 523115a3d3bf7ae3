"""`Agent`: a run's configuration, checked once, then any number of tasks.

    agent = Agent(model=OpenAIModel.from_env(), tools=workspace_tools("."), limits="coding")
    result = agent.run("Fix the failing test")        # or: await agent.arun(...), agent.stream(...)
    agent.batch("episodes.jsonl", out="runs/job")      # every episode under the same settings

Everything an Agent runs goes through `arun()`. Its sync calls (`run`, `batch`) share one event loop
of the agent's own (an `asyncio.Runner`), so an `OpenAIModel`, which keeps a connection pool per
event loop, keeps one pool, and its keep-alive connections, from run to run. `close()` (or `with`)
closes that loop and the model's connections.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from ._aio import loop_running, run_sync
from ._batch import BatchResult, Episode, abatch
from ._compact import Compaction
from ._gate import ApprovalHook, UntrustedGate
from ._guards import Guard
from ._limits import Limits, Policy
from ._loop import arun, check_model, check_price
from ._prices import PricesArg
from ._steps import config_of
from ._stops import RunResult
from ._stream import RunStream
from .models._base import Model
from ._log._schema import LogEvent
from ._log._writer import RunLog
from .tools._executor import Executor
from .tools._registry import Registry, Tool

__all__ = ["Agent"]

T = TypeVar("T")
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

    log: a folder: each run writes its own log there (`run-<UTC time>-<id>.jsonl`); None (the
      default) writes none. One call's own file: `agent.run(task, log="that.jsonl")` (a path or a
      RunLog, as run() takes it).

    `run()` and `batch()` run on the agent's event loop, one loop for all its sync calls (inside a
    running event loop, or while another thread is using it, a call gets a loop of its own, as
    `run()` does). Ctrl-C there cancels the run: it ends `cancelled`, its stop in the log, and then
    KeyboardInterrupt is raised. `close()` (or `with Agent(...) as agent:`) closes the loop and the
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
    header: Mapping[str, Any] | None = None
    executor: Executor | None = None
    _loop: _OwnLoop = field(init=False, repr=False)

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
        put("_loop", _OwnLoop())

    # -- one task ------------------------------------------------------------------------------------
    async def arun(self, task: str, **changes: Any) -> RunResult:
        """`arun()` with the agent's settings (any of them changed for this call by keyword)."""
        return await arun(task, **self._settings(changes))

    def run(self, task: str, **changes: Any) -> RunResult:
        """The run from sync code, on the agent's event loop (see the class): its RunResult."""
        settings = self._settings(changes)
        return self._loop.run(lambda: arun(task, **settings))

    def stream(self, task: str, **changes: Any) -> RunStream:
        """`stream()` with the agent's settings: `async for` / `for` over the run's typed events."""
        return RunStream(task, self._settings(changes))

    # -- many ----------------------------------------------------------------------------------------
    async def abatch(self, episodes: Episodes = None, *, out: str | Path, **options: Any) -> BatchResult:
        """`abatch()` with every episode under the agent's settings (an episode's own limits, policy,
        params and system go over them). `options`: abatch's own (concurrency, resume, retry_stops,
        ...). Each episode's log is in `out`, whatever the agent's `log`."""
        extra = {"system": self.system, "on_event": self.on_event, "guards": self.guards, "gate": self.gate,
                 "approve": self.approve, "compaction": self.compaction, "executor": self.executor}
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
        self._loop.close(self.model)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _settings(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """`arun()`'s keywords for one call: the agent's, with `changes` checked as Agent(...) checks."""
        changes = dict(changes)
        log = changes.pop("log") if "log" in changes else self._log_file()
        unknown = sorted(set(changes) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                            f"(an Agent's: {', '.join(_SETTINGS)}, log)")
        me = dataclasses.replace(self, **changes) if changes else self
        settings = {name: getattr(me, name) for name in _SETTINGS}
        settings.update(params=dict(me.params or {}), header=dict(me.header or {}) or None,
                        guards=None if me.guards is None else list(me.guards), log=log)
        return settings

    def _log_file(self) -> Path | None:
        if self.log is None:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        return Path(self.log) / f"run-{stamp}-{uuid.uuid4().hex[:8]}.jsonl"


_SETTINGS = tuple(f.name for f in dataclasses.fields(Agent) if f.init and f.name != "log")


def _check_folder(log: Any) -> None:
    if log is None:
        return
    if isinstance(log, RunLog) or not isinstance(log, (str, Path)):
        raise TypeError(f"Agent(log=) is a folder, each run writing its own log there, got {type(log).__name__}; "
                        "one run's RunLog goes to that call: agent.run(task, log=...)")
    if (Path(log).exists() and not Path(log).is_dir()) or str(log).endswith(".jsonl"):
        raise ValueError(f"Agent(log=) is a folder, each run writing its own log there, got the file {str(log)!r}; "
                         "one run's own file goes to that call: agent.run(task, log=...)")


class _OwnLoop:
    """The agent's event loop for its sync calls, made on first use. Busy (a loop running on the
    calling thread, or another thread's call on it): the call gets a loop of its own (run_sync)."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None
        self._lock = threading.Lock()

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if loop_running() or not self._lock.acquire(blocking=False):
            return run_sync(make())
        try:
            if self._runner is None:
                self._runner = asyncio.Runner()
                weakref.finalize(self, self._runner.close)  # an agent never closed: its loop, at least
            return self._runner.run(make())
        finally:
            self._lock.release()

    def close(self, model: Any) -> None:
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is None:
            return

        def shut() -> None:
            try:
                if callable(aclose := getattr(model, "aclose", None)):
                    runner.run(aclose())
            finally:
                runner.close()

        if loop_running():  # closed from async code: the agent's loop cannot run on this thread
            helper = threading.Thread(target=shut, name="loopfence-agent-close")
            helper.start()
            helper.join()
        else:
            shut()
