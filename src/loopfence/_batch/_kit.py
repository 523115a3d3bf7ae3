"""What every episode of a batch runs with, and one fresh attempt of an episode.

A `Kit` is plain data (the model or its factory, the custom tools or their factory, the default
limits, policy, params, prices and header lines): the local engine keeps one, and each Ray actor
(`_batch/_ray.py`) gets a copy, so an episode runs the same code wherever it runs.
"""

from __future__ import annotations

import functools

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .._limits import Limits, Policy
from .._loop import arun_with, check_price
from .._prices import PricesArg
from ..models._base import Model
from ..tools._builtin import workspace_tools
from ..tools._registry import Tool
from ._episodes import Episode
from ._results import EpisodeResult

__all__ = ["Kit", "ModelSource", "ToolSource", "WorkerLost", "is_model"]

ModelSource = Union[Model, Callable[[Episode], Model]]  # one model for all, or a model per episode
ToolSource = Union[Iterable[Tool], Callable[[Episode, "Path | None"], Iterable[Tool]]]


class WorkerLost(Exception):
    """The worker running an episode died (a Ray actor's process): the episode has no row; its log,
    if it has one, is continued by `resume`."""


def is_model(obj: Any) -> bool:
    return hasattr(obj, "complete") or hasattr(obj, "acomplete")


@dataclass
class Kit:
    model: ModelSource
    tools: list[Tool] = field(default_factory=list)
    tools_factory: Callable[[Episode, Path | None], Iterable[Tool]] | None = None
    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    params: dict[str, Any] = field(default_factory=dict)
    prices: PricesArg = None
    header: dict[str, Any] = field(default_factory=dict)
    run_options: dict[str, Any] = field(default_factory=dict)  # more arun() keywords (an Agent's)

    @classmethod
    def of(cls, model: ModelSource, tools: ToolSource, **settings: Any) -> Kit:
        if not is_model(model) and not callable(model):
            raise ValueError("model must be a Model or a callable that makes one per episode")
        factory = tools if callable(tools) and not isinstance(tools, (list, tuple, Tool)) else None
        listed = [] if factory is not None else [tools] if isinstance(tools, Tool) else list(tools)  # type: ignore[arg-type]
        return cls(model, listed, factory, **settings)  # type: ignore[arg-type]

    @property
    def is_factory(self) -> bool:
        return not is_model(self.model)

    def custom_names(self) -> list[str] | None:
        """The custom tools' names (None: a factory's, known only per episode)."""
        return None if self.tools_factory is not None else [t.name for t in self.tools]

    def tools_for(self, ep: Episode, ws: Path | None) -> list[Tool]:
        builtins = ep.builtin_names()
        made = workspace_tools(ws, builtins) if builtins and ws is not None else []
        custom = list(self.tools_factory(ep, ws)) if self.tools_factory is not None else self.tools
        wanted = ep.custom_names()
        if wanted is not None:
            by_name = {t.name: t for t in custom}
            missing = [n for n in wanted if n not in by_name]
            if missing:
                raise ValueError(f"tools: no tool named {', '.join(map(repr, missing))}")
            custom = [by_name[n] for n in wanted]
        return [*made, *custom]

    def model_for(self, ep: Episode) -> Model:
        return self.model(ep) if self.is_factory else self.model  # type: ignore[operator, return-value]

    async def fresh(self, ep: Episode, ws: Path | None, log: Path, attempts: int, folder: Path) -> EpisodeResult:
        """One attempt of `ep` from the start, logged at `log` (its workspace copy `ws` made already)."""
        rel = str(log.relative_to(folder))
        try:
            tools = self.tools_for(ep, ws)
            model = self.model_for(ep)
            limits = ep.effective_limits(self.limits)
            params = {**self.params, **ep.params}  # the request's model names the price
            if self.is_factory or ep.limits:  # a shared model under the batch's limits was checked at the start
                check_price(model, limits, self.prices, params)
        except Exception as exc:  # noqa: BLE001 - an episode that cannot start is an error row
            return EpisodeResult.failed(ep.id, f"cannot start: {type(exc).__name__}: {exc}", ep.metadata, attempts)
        header: dict[str, Any] = {**self.header, "batch": {"id": ep.id, "attempt": attempts,
                                                           "out": _resolved(folder) if folder.is_absolute()
                                                           else str(folder.resolve())}}
        if ws is not None:
            header["workspace"] = str(ws)
        options = {**self.run_options, **({"system": ep.system} if ep.system is not None else {})}
        result = await arun_with(ep.task, {**options, "model": model, "tools": tools, "limits": limits,  # type: ignore[typeddict-item]
                                           "policy": ep.effective_policy(self.policy), "params": params,
                                           "log": log, "header": header, "prices": self.prices})
        return EpisodeResult.of_run(ep.id, result, ep.metadata, attempts, rel)


@functools.lru_cache(maxsize=64)
def _resolved(folder: Path) -> str:
    """An absolute batch folder's real path (resolved once, not once per episode)."""
    return str(folder.resolve())
