"""Models: the protocol and the adapters.

`OpenAIModel` and `Timeouts` (the HTTP client) load on first use, so `import loopfence` stays light
(no httpx until a model talks HTTP). `LocalModel` (the embedded llama.cpp default, loopfence[local])
imports llama_cpp only when it first answers.
"""

from typing import Any

from ._base import Model
from ._scripted import ScriptedModel, ScriptError, load_script

__all__ = ["LocalModel", "LocalModelUnavailable", "Model", "OpenAIModel", "ScriptError", "ScriptedModel",
           "Timeouts", "load_script"]


def __getattr__(name: str) -> Any:
    if name in ("OpenAIModel", "Timeouts"):
        from . import _openai

        return getattr(_openai, name)
    if name in ("LocalModel", "LocalModelUnavailable"):
        from . import _local

        return getattr(_local, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
