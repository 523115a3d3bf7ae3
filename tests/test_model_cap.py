"""A reply cut at the model's own cap (issue 61, item 1): the embedded model stops at its own
`max_tokens` (512 by default) where a request sets none. The stop says so and names the setting that
raises it; the cut text is kept (`partial_text`), never shipped; replay and reconcile agree; and a
streamed request through `loopfence proxy` gets the text as the model makes it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import loopfence
from loopfence import ScriptedModel, StopReason
from loopfence._messages import Reply
from loopfence.runlog import read_log, reconcile, replay

from _local_support import needs_local_model, read_valid_log
from _proxy_support import Proxy

TASK = "Say hello in French."


def _cut(content: str, n: int) -> dict:
    """A chat.completion cut at `n` tokens (finish_reason "length")."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}


class _Capped(ScriptedModel):
    """A scripted model describing itself with its own cap, as the embedded model does."""

    def describe(self) -> dict:
        return {**super().describe(), "max_tokens": 16}


def test_a_cut_at_the_models_own_cap_names_it_and_keeps_the_text(tmp_path: Path) -> None:
    result = loopfence.run(TASK, model=_Capped([_cut("Bonjour! Et puis", 16)]), tools=[], log=tmp_path / "r.jsonl")
    assert result.reason is StopReason.INCOMPLETE_STREAM and result.verdict == "KILL"
    assert "the model's own cap (max_tokens=16" in result.stop.detail, result.stop.detail
    assert "--param max_tokens=N" in result.stop.detail and "LocalModel(max_tokens=N)" in result.stop.detail
    assert result.final_answer is None and result.partial_text == "Bonjour! Et puis"
    assert read_log(tmp_path / "r.jsonl").header.model["max_tokens"] == 16
    assert replay(tmp_path / "r.jsonl").ok  # the detail comes back from the logged header
    assert reconcile(tmp_path / "r.jsonl").ok


@pytest.mark.parametrize("model,params", [
    (_Capped([_cut("Bonjour", 16)]), {"max_tokens": 16}),  # the request asked for that cap
    (_Capped([_cut("Bonjour", 16)]), "per_request"),  # max_tokens_per_request=16: a larger request cap lifts nothing
    (_Capped([_cut("Bonjour", 9)]), None),  # cut elsewhere (a server's own limit)
    (ScriptedModel([_cut("Bonjour", 16)]), None),  # a model that records no cap of its own
], ids=["asked", "per-request-bound", "elsewhere", "no-own-cap"])
def test_any_other_cut_is_not_called_the_models_cap(model: ScriptedModel, params: dict | str | None) -> None:
    limits = {"max_tokens_per_request": 16} if params == "per_request" else None
    result = loopfence.run(TASK, model=model, tools=[], params=params if isinstance(params, dict) else None,
                           limits=limits, log=None)
    assert result.reason is StopReason.INCOMPLETE_STREAM and result.partial_text == "Bonjour"
    assert result.stop.detail == "finish_reason is 'length': the reply was cut off", result.stop.detail


def _edited(log: Path, out: Path, version: int, plain: bool) -> Path:
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    lines[0]["version"] = version
    if plain:
        lines[-1]["detail"] = "finish_reason is 'length': the reply was cut off"
        lines[-1].pop("data", None)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return out


def test_an_older_log_keeps_its_plain_detail_on_replay(tmp_path: Path) -> None:
    """A version-5 log named such a cut plainly (its header records the model's cap all the same):
    it replays as it was. The same log claiming version 6 does not: the new detail is owed."""
    loopfence.run(TASK, model=_Capped([_cut("Bonjour", 16)]), tools=[], log=tmp_path / "r.jsonl")
    assert replay(_edited(tmp_path / "r.jsonl", tmp_path / "v5.jsonl", 5, plain=True)).ok
    assert not replay(_edited(tmp_path / "r.jsonl", tmp_path / "v6.jsonl", 6, plain=True)).ok


class _FakeEmbedded:
    """Stands in for the embedded model behind the proxy (no weights needed): its own cap of 16,
    its text through the text sink piece by piece, as LocalModel's, then the reply cut at the cap."""

    def describe(self) -> dict:
        return {"kind": "local", "model": "fake-embedded", "max_tokens": 16}

    def complete(self, request: Any) -> Reply:
        from loopfence.models._base import text_sink

        sink = text_sink(request)
        for piece in ("Bon", "jour ", "et "):
            if sink is not None:
                sink(piece)
        return Reply.from_response({**_cut("Bonjour et ", 16), "model": "fake-embedded"})


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_the_proxy_names_the_embedded_models_cap(tmp_path: Path, stream: bool) -> None:
    from loopfence.proxy import Proxy, Settings

    async def ask() -> str:
        proxy = Proxy(None, Settings(logs=tmp_path), local=_FakeEmbedded())
        transport = httpx.ASGITransport(app=proxy.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1/v1", timeout=30) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": TASK}], "stream": stream}
            got = await client.post("/chat/completions", json=body)
        await proxy.aclose()
        if not stream:
            return got.json()["choices"][0]["message"]["content"]
        return "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in got.text.splitlines() if line.startswith("data: {") and '"choices": [{' in line)

    text = asyncio.run(ask())
    stop = text[text.index("[loopfence stop]"):]
    assert "the model's own cap (max_tokens=16" in stop and "max_tokens through the proxy" in stop, text
    assert text.startswith("Bonjour et \n\n[loopfence stop]") if stream else text.startswith("[loopfence stop]")
    (log,) = tmp_path.glob("*.jsonl")
    assert read_log(log).header.model["max_tokens"] == 16
    assert read_valid_log(log)[-1]["partial_text"] == "Bonjour et "
    assert replay(log).ok


def test_the_cli_shows_the_cut_text_as_not_shipped(tmp_path: Path) -> None:
    script = tmp_path / "replies.jsonl"
    script.write_text(json.dumps(_cut("Bonjour! Et puis", 7)) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "loopfence", "run", TASK, "--script", str(script), "--log",
                           str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    shown = done.stdout + done.stderr
    assert "the cut reply's text (not shipped, incomplete_stream):" in shown, shown
    assert shown.index("Bonjour! Et puis") > shown.index("the cut reply's text"), shown


@pytest.mark.local_model
@pytest.mark.skipif(needs_local_model[1].args[0], reason=needs_local_model[1].kwargs["reason"])
def test_the_embedded_models_cap_through_the_proxy_streams_then_names_it(tmp_path: Path) -> None:
    """The issue's case as a user meets it: the openai SDK asks `loopfence proxy` (no upstream: the
    embedded model) for a streamed answer. The text arrives as it is made (many deltas, the first
    long before the last), then the stop names the cap and the setting that raises it."""
    from openai import OpenAI

    with Proxy("--logs", str(tmp_path / "logs"), stderr=tmp_path / "proxy.err") as proxy:
        client = OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=120)
        arrived: list[tuple[float, str]] = []
        for chunk in client.chat.completions.create(model="any", messages=[{"role": "user", "content": TASK}],
                                                    stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrived.append((time.monotonic(), chunk.choices[0].delta.content))
    text = "".join(t for _, t in arrived)
    assert "[loopfence stop] loopfence stopped this run: incomplete_stream" in text, text[-600:]
    said = text[text.index("[loopfence stop]"):]
    assert "the model's own cap (max_tokens=512" in said and "max_tokens through the proxy" in said, said
    before = [t for t, piece in arrived if "[loopfence stop]" not in piece]
    assert len(before) >= 20, arrived[:5]  # the model's text, piece by piece, not one block at the end
    assert arrived[-1][0] - before[0] > 1.0, "the first piece came only when the reply was whole"
    log = next((tmp_path / "logs").glob("*.jsonl"))
    stop = read_valid_log(log)[-1]
    assert stop["reason"] == "incomplete_stream" and stop["partial_text"], stop
    assert text.startswith(stop["partial_text"][:200])  # the client saw the text the log keeps
    assert replay(log).ok
