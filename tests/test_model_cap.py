"""A reply cut at the model's own cap (issue 61, item 1): the embedded model stops at its own
`max_tokens` (512 by default) where a request sets none. The stop says so and names the setting that
raises it; the cut text is kept (`partial_text`), never shipped; replay and reconcile agree; and a
streamed request through `loopfence proxy` gets the text as the model makes it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loopfence
from loopfence import ScriptedModel, StopReason
from loopfence.runlog import read_log, reconcile, replay

from _local_support import needs_local_model, read_valid_log
from _proxy_support import Proxy

TASK = "Say hello in French."


def _cut(content: str, n: int, cap: int | None) -> dict:
    """A chat.completion cut at `n` tokens, from a model whose description records `cap`."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}


class _Capped(ScriptedModel):
    """A scripted model describing itself with its own cap, as the embedded model does."""

    def describe(self) -> dict:
        return {**super().describe(), "max_tokens": 16}


def test_a_cut_at_the_models_own_cap_names_it_and_keeps_the_text(tmp_path: Path) -> None:
    result = loopfence.run(TASK, model=_Capped([_cut("Bonjour! Et puis", 16, 16)]), tools=[], log=tmp_path / "r.jsonl")
    assert result.reason is StopReason.INCOMPLETE_STREAM and result.verdict == "KILL"
    assert "the model's own cap (max_tokens=16" in result.stop.detail, result.stop.detail
    assert "--param max_tokens=N" in result.stop.detail and "LocalModel(max_tokens=N)" in result.stop.detail
    assert result.final_answer is None and result.partial_text == "Bonjour! Et puis"
    assert read_log(tmp_path / "r.jsonl").header.model["max_tokens"] == 16
    assert replay(tmp_path / "r.jsonl").ok  # the detail comes back from the logged header
    assert reconcile(tmp_path / "r.jsonl").ok


@pytest.mark.parametrize("model,params", [
    (_Capped([_cut("Bonjour", 16, 16)]), {"max_tokens": 16}),  # the request asked for that cap
    (_Capped([_cut("Bonjour", 9, 16)]), None),  # cut elsewhere (a server's own limit)
    (ScriptedModel([_cut("Bonjour", 16, None)]), None),  # a model that records no cap of its own
], ids=["asked", "elsewhere", "no-own-cap"])
def test_any_other_cut_is_not_called_the_models_cap(model: ScriptedModel, params: dict | None) -> None:
    result = loopfence.run(TASK, model=model, tools=[], params=params, log=None)
    assert result.reason is StopReason.INCOMPLETE_STREAM and result.partial_text == "Bonjour"
    assert result.stop.detail == "finish_reason is 'length': the reply was cut off", result.stop.detail


def test_the_cli_shows_the_cut_text_as_not_shipped(tmp_path: Path) -> None:
    script = tmp_path / "replies.jsonl"
    script.write_text(json.dumps(_cut("Bonjour! Et puis", 7, None)) + "\n", encoding="utf-8")
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
