"""A long, deterministic chat.completions stream shaped like a real gpt-4o capture
(../shared/fixtures/wire/openai-python__two_parallel_calls.sse): a content prelude, then parallel
tool calls told apart by `index`, their arguments in small fragments and interleaved, a
finish_reason chunk, a usage chunk with no choices, and [DONE]."""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["long_stream", "to_sse", "expected_calls"]

_ENVELOPE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1727346178,
             "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_5050236cbd"}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {**_ENVELOPE, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def expected_calls(n_calls: int, arg_chars: int) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each call, in index order."""
    rng = random.Random(7)
    out = []
    for i in range(n_calls):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "épsilon", "zeta"])
                         for _ in range(arg_chars // 6))
        args = json.dumps({"path": f"src/module_{i}.py", "query": words[:arg_chars], "page": i + 1})
        out.append((f"call_{i:02d}_{rng.getrandbits(64):016x}", f"tool_{i}", args))
    return out


def long_stream(n_calls: int = 8, arg_chars: int = 2000, fragment: int = 4, prelude: int = 200
                ) -> list[dict[str, Any]]:
    """Chunk dicts: `prelude` content chunks, then the calls' fragments interleaved two at a time."""
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": f"word{i} "}) for i in range(prelude)]
    calls = expected_calls(n_calls, arg_chars)
    for pair in range(0, n_calls, 2):
        frags = {}
        for i in range(pair, min(pair + 2, n_calls)):
            cid, name, args = calls[i]
            chunks.append(_chunk({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                                  "function": {"name": name, "arguments": ""}}]}))
            frags[i] = [args[k:k + fragment] for k in range(0, len(args), fragment)]
        for k in range(max(len(f) for f in frags.values())):
            for i, parts in frags.items():
                if k < len(parts):
                    chunks.append(_chunk({"tool_calls": [{"index": i, "function": {"arguments": parts[k]}}]}))
    chunks.append(_chunk({}, "tool_calls"))
    chunks.append({**_ENVELOPE, "choices": [], "usage": {
        "prompt_tokens": 1200, "completion_tokens": 4500, "total_tokens": 5700}})
    return chunks


def to_sse(chunks: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks) + "data: [DONE]\n\n"
