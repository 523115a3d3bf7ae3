"""Where a scenario's replies come from: a model factory opens one Model per scenario run.

- `scripted_models` (the default): chat.completions objects go through ScriptedModel; scenarios
  whose replies need the HTTP path (streams, raw SSE, HTTP errors, `"stream": true`) are served by
  a real loopback server (`loopfence.testing._fakeserver.FakeServer`) and read by the real client
  (`loopfence.models._openai.OpenAIModel`).
- `Endpoint(base_url, model)`: keep the scenario's tools and workspace, let a real model answer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from ..models import Model, ScriptedModel
from ._scenario import Scenario

__all__ = ["ModelFactory", "DrillSetupError", "scripted_models", "Endpoint", "http_pieces"]

ModelFactory = Callable[[Scenario], AbstractContextManager[Model]]

_NEEDS = "needs the HTTP endpoint (loopfence's HTTP client and fake server could not be imported)"


class DrillSetupError(RuntimeError):
    """A scenario that cannot be run here (not a bad file): its row fails with this message."""


def http_pieces(server: bool = True) -> tuple[Any, Any]:
    """(FakeServer or None, OpenAIModel), or DrillSetupError when they are not installed yet."""
    try:
        model_cls = importlib.import_module("loopfence.models._openai").OpenAIModel
        server_cls = importlib.import_module("loopfence.testing._fakeserver").FakeServer if server else None
    except (ImportError, AttributeError) as exc:
        raise DrillSetupError(f"{_NEEDS}: {exc}") from None
    return server_cls, model_cls


@contextmanager
def scripted_models(scenario: Scenario) -> Iterator[Model]:
    """The model a scenario's replies make: a ScriptedModel, or (for HTTP forms: chunks, faults) an
    OpenAIModel against a FakeServer serving them, closed after the run."""
    if not scenario.needs_http:
        yield ScriptedModel(list(scenario.replies))
        return
    server_cls, model_cls = http_pieces()
    with server_cls(list(scenario.replies)) as srv:
        with _closing(model_cls(srv.base_url, "scripted", stream=scenario.stream)) as model:
            yield model


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A real OpenAI-compatible endpoint answers instead of the scenario's replies."""

    base_url: str
    model: str | None = None  # None: LOOPFENCE_MODEL, or the server's default

    @contextmanager
    def __call__(self, scenario: Scenario) -> Iterator[Model]:
        _, model_cls = http_pieces(server=False)
        make = getattr(model_cls, "from_env", model_cls)  # from_env also reads the API key variables
        with _closing(make(self.base_url, self.model, stream=scenario.stream)) as model:
            yield model


@contextmanager
def _closing(model: Any) -> Iterator[Any]:
    try:
        yield model
    finally:
        close = getattr(model, "close", None)
        if callable(close):
            close()
