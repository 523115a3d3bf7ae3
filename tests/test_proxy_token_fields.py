"""Every token-count field a known server reads is capped to the run's bound (issue "the proxy as a
shared service, part 2", item 4), through the real proxy process, on each wire: llama.cpp's
`n_predict` (read before `max_tokens` there) and `max_completion_tokens` on Chat Completions,
`max_output_tokens` on Responses, `maxOutputTokens` and its proto name `max_output_tokens` (in
`generationConfig` or `generation_config`) on Gemini, `max_tokens` on Anthropic Messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.testing import text_reply

from _anthropic_support import AnthropicReplies
from _gemini_support import GeminiReplies
from _proxy_support import Proxy, ReplyServer
from _responses_support import ResponsesReplies

CAP = 300  # --limit max_tokens_per_request
HUGE = 1_000_000
USER = [{"role": "user", "content": "write a long story"}]


def _proxy(up: Any, tmp: Path, wire: str | None = None) -> Proxy:
    upstream = up.base_url if wire is None else f"{wire}={up.root}"
    return Proxy("--upstream", upstream, "--logs", str(tmp), "--limit", f"max_tokens_per_request={CAP}",
                 stderr=tmp / "err")


@pytest.mark.parametrize("fields", [
    {"n_predict": HUGE}, {"n_predict": -1}, {"n_predict": HUGE, "max_tokens": HUGE},
    {"max_completion_tokens": HUGE}, {"max_tokens": 50, "n_predict": HUGE}, {}],
    ids=["n_predict", "n_predict-unlimited", "both", "max_completion_tokens", "small-max_tokens", "none"])
def test_chat_completions_caps_every_token_field(fields: dict[str, int], tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply("ok")) as up, _proxy(up, tmp_path) as p:
        r = httpx.post(f"{p.base_url}/chat/completions", json={"model": "m", "messages": USER, **fields}, timeout=60)
        assert r.status_code == 200, r.text
    sent = up.requests[0]
    counts = {k: sent[k] for k in ("max_tokens", "max_completion_tokens", "n_predict") if k in sent}
    assert counts and all(1 <= v <= CAP for v in counts.values()), counts
    assert set(counts) == (set(fields) or {"max_tokens"})  # nothing dropped, nothing invented but the bound
    if fields.get("max_tokens") == 50:
        assert counts["max_tokens"] == 50  # a smaller ask stays


def test_responses_caps_max_output_tokens_and_the_chat_names(tmp_path: Path) -> None:
    with ResponsesReplies(lambda body: text_reply("ok")) as up, _proxy(up, tmp_path, "responses") as p:
        r = httpx.post(f"{p.base_url}/responses", timeout=60, json={
            "model": "m", "input": "write a long story", "max_output_tokens": HUGE, "max_tokens": HUGE})
        assert r.status_code == 200, r.text
    sent = up.requests[0]
    assert sent["max_output_tokens"] == CAP and sent["max_tokens"] == CAP


@pytest.mark.parametrize("config", [
    {"generationConfig": {"maxOutputTokens": HUGE}},
    {"generationConfig": {"max_output_tokens": HUGE}},
    {"generation_config": {"max_output_tokens": HUGE}},
    {"generation_config": {"maxOutputTokens": HUGE}, "generationConfig": {"temperature": 0.2}},
], ids=["json-name", "proto-name", "proto-holder", "both-holders"])
def test_gemini_caps_the_reply_length_by_either_name(config: dict[str, Any], tmp_path: Path) -> None:
    with GeminiReplies(lambda body: text_reply("ok")) as up, _proxy(up, tmp_path, "gemini") as p:
        r = httpx.post(f"{p.base_url.removesuffix('/v1')}/v1beta/models/m:generateContent", timeout=60, json={
            "contents": [{"role": "user", "parts": [{"text": "write a long story"}]}], **config})
        assert r.status_code == 200, r.text
    sent = up.requests[0]
    lengths = [v for holder in ("generationConfig", "generation_config") for k, v in (sent.get(holder) or {}).items()
               if k in ("maxOutputTokens", "max_output_tokens")]
    assert lengths and all(v <= CAP for v in lengths), sent
    assert CAP in lengths  # the bound itself went (the ask was over it)


def test_anthropic_caps_max_tokens(tmp_path: Path) -> None:
    with AnthropicReplies(lambda body: text_reply("ok")) as up, _proxy(up, tmp_path, "anthropic") as p:
        r = httpx.post(f"{p.base_url.removesuffix('/v1')}/v1/messages", timeout=60,
                       json={"model": "m", "max_tokens": HUGE, "messages": USER})
        assert r.status_code == 200, r.text
    assert up.requests[0]["max_tokens"] == CAP
