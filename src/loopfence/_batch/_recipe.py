"""A model factory that can travel: OpenAI-compatible endpoints, or a script, built where it is used.

`Endpoints([url, ...], "model")` is a picklable `(episode) -> Model`: each process that calls it (the
driver, or each Ray actor it was sent to) builds its own `OpenAIModel` per endpoint once, with one
connection pool, and spreads episodes over them round-robin. `ScriptFile(path)` gives each episode a
fresh `ScriptedModel` from the first reply. `aclose()` closes what this process built.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ..models._base import Model
from ..models._scripted import ScriptedModel
from ._episodes import Episode

__all__ = ["Endpoints", "ScriptFile"]


@dataclass
class Endpoints:
    base_urls: list[str]
    model: str | None = None
    stream: bool = False
    max_connections: int = 16
    _built: list[Any] = field(default_factory=list, repr=False)
    _turn: Any = field(default_factory=itertools.count, repr=False)

    def __post_init__(self) -> None:
        if not self.base_urls:
            raise ValueError("no endpoint: give at least one base URL")

    def build(self) -> list[Any]:
        """This process's models, one per endpoint (ValueError for a URL that cannot be used)."""
        if not self._built:
            import httpx

            from ..models._openai import OpenAIModel

            width = self.max_connections
            self._built = [OpenAIModel.from_env(url, self.model, stream=self.stream,
                                                limits=httpx.Limits(max_connections=width,
                                                                    max_keepalive_connections=width))
                           for url in self.base_urls]
        return self._built

    def sample(self) -> Model:
        """A model as the episodes get one (for checks before anything runs, e.g. its price)."""
        return self.build()[0]  # type: ignore[no-any-return]

    def __call__(self, ep: Episode) -> Model:
        built = self.build()
        return built[next(self._turn) % len(built)]  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        built, self._built = self._built, []
        for m in built:
            await m.aclose()

    def __getstate__(self) -> dict[str, Any]:  # the models (clients, pools) stay in this process
        return {"base_urls": self.base_urls, "model": self.model, "stream": self.stream,
                "max_connections": self.max_connections}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


@dataclass
class ScriptFile:
    path: str
    _replies: list[Any] = field(default_factory=list, repr=False)
    _source: Any = None

    def __post_init__(self) -> None:
        base = ScriptedModel.from_file(self.path)  # ScriptError for a bad file, at once
        self._replies, self._source = list(base.replies), base.source

    def sample(self) -> Model:
        return ScriptedModel(self._replies, source=self._source)

    def __call__(self, ep: Episode) -> Model:
        return self.sample()

    async def aclose(self) -> None:
        return None
