"""The Gemini wire (issue 57): `POST /v1beta/models/MODEL:generateContent` and `:streamGenerateContent`
through `loopfence proxy`, a real process, in front of a real upstream on 127.0.0.1 that speaks the
same wire: the bench's scripts over raw HTTP (calls without ids, as Gemini CLI's model sends them),
a stream cut before its last chunk, the stop's shape, hostile input in Google's error shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _gemini_support import GeminiReplies, GeminiScripts, converse, gemini_chunks, post_gemini, to_gemini
from _proxy_support import HONEST, RUNAWAY, Proxy, bench_run_ended, wire_proxy
from bench.common import Workspace

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with wire_proxy(GeminiScripts(), "gemini", tmp_path_factory.mktemp("gemini")) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("script", RUNAWAY + HONEST, ids=lambda s: s.name)
def test_the_bench_scripts_over_the_gemini_wire(wire: Any, script: Any, stream: bool) -> None:
    up, proxy, logs = wire
    with Workspace() as ws:
        ended = converse(proxy.base_url.removesuffix("/v1"), script.name, ws, tag=f"g-{stream}", stream=stream)
    bench_run_ended(script, ended, logs, "gemini")


DECL = {"functionDeclarations": [{"name": "read_file", "parameters": {
    "type": "OBJECT", "properties": {"path": {"type": "STRING"}}, "required": ["path"]}}]}


def test_a_stream_cut_before_its_last_chunk_is_incomplete_stream(tmp_path: Path) -> None:
    cut = {"sse": gemini_chunks(to_gemini(calls_reply(tool_call("read_file", {"path": "a.py"}), content="Reading.")),
                                cut=True)}
    with GeminiReplies(lambda body: cut) as up, \
            Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r, resp = post_gemini(proxy.base_url.removesuffix("/v1"), {
            "contents": [{"role": "user", "parts": [{"text": "read a.py"}]}], "tools": [DECL]}, stream=True)
    parts = resp["candidates"][0]["content"]["parts"]  # (its text streamed first: the stop follows it)
    text = "".join(p.get("text", "") for p in parts)
    assert all("functionCall" not in p for p in parts) and text.startswith("Reading.")
    assert f"{STOP_MARKER} loopfence stopped this run: incomplete_stream" in text
    assert resp["candidates"][0]["finishReason"] == "STOP"


def test_a_stop_is_one_text_part_and_error_mode_is_googles_error(tmp_path: Path) -> None:
    again = calls_reply(tool_call("read_file", {"path": "status"}))
    for mode in ("answer", "error"):
        with GeminiReplies(lambda body: again) as up, \
                Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path / mode), "--on-stop", mode,
                      stderr=tmp_path / "err") as proxy:
            root = proxy.base_url.removesuffix("/v1")
            contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": f"wait ({mode})"}]}]
            for turn in range(5):
                r, resp = post_gemini(root, {"contents": contents, "tools": [DECL],
                                             "generationConfig": {"maxOutputTokens": 99999}},
                                      stream=turn % 2 == 1, headers={"x-goog-api-key": "client"})
                if "x-loopfence-stop" in r.headers:
                    break
                contents += [resp["candidates"][0]["content"],
                             {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                                              "response": {"output": "pending"}}}]}]
            assert r.headers["x-loopfence-stop"] == "repeated_call" and len(up.requests) == 3
            assert up.requests[0]["generationConfig"]["maxOutputTokens"] == 8192  # capped (coding)
            assert "client" not in json.dumps(read_log(next((tmp_path / mode).glob("*.jsonl"))).header.record)
            if mode == "answer":
                cand = resp["candidates"][0]
                assert r.status_code == 200 and cand["finishReason"] == "STOP"
                assert [list(p) for p in cand["content"]["parts"]] == [["text"]]
                assert cand["content"]["parts"][0]["text"].startswith(STOP_MARKER)
            else:
                assert r.status_code == 400 and resp["error"]["status"] == "INVALID_ARGUMENT"
                assert STOP_MARKER in resp["error"]["message"]


@pytest.mark.parametrize(("raw", "field"), [
    (b"not json", None),
    (json.dumps({"contents": "hi"}).encode(), "contents"),
    (json.dumps({"contents": [{"role": "wizard", "parts": []}]}).encode(), "role"),
    (json.dumps({"contents": [{"role": "user", "parts": [{"text": "x"}]}],
                 "generationConfig": {"maxOutputTokens": "9"}}).encode(), "maxOutputTokens"),
    (json.dumps({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "x", "response": {}}}]}]}).encode(),
     "functionResponse"),
    (json.dumps({"contents": [{"role": "user", "parts": [{"text": "x"}]}],
                 "tools": [{"functionDeclarations": [{"description": "no name"}]}]}).encode(), "name"),
    (b"[" * 100_000 + b"]" * 100_000, None),
    (json.dumps({"contents": [{"role": "user", "parts": [{"text": "x" * (17 << 20)}]}]}).encode(), None),
])
def test_hostile_input_gets_googles_error_shape_and_is_never_forwarded(tmp_path: Path, raw: bytes,
                                                                       field: str | None) -> None:
    with GeminiReplies(lambda body: text_reply("never")) as up, \
            Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r = httpx.post(f"{proxy.base_url.removesuffix('/v1')}/v1beta/models/fake:generateContent", content=raw,
                       headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code in (400, 413), r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == r.status_code and body["error"]["status"]
    if field is not None:
        assert field in body["error"]["message"], body
    assert up.requests == []


def test_count_tokens_passes_through_outside_any_run_or_is_estimated(tmp_path: Path) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "how many tokens is this sentence?"}]}]}
    with GeminiReplies(lambda b: text_reply("unused")) as up, \
            Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path / "a"), stderr=tmp_path / "err") as proxy:
        passed = httpx.post(f"{proxy.base_url.removesuffix('/v1')}/v1beta/models/fake:countTokens", json=body, timeout=30)
    with Proxy("--logs", str(tmp_path / "b"), stderr=tmp_path / "err2") as proxy:  # no Gemini upstream
        estimated = httpx.post(f"{proxy.base_url.removesuffix('/v1')}/v1beta/models/fake:countTokens", json=body,
                               timeout=30)
    assert passed.status_code == 404 and "countTokens" in passed.json()["error"]["message"]  # the upstream's own answer
    assert estimated.status_code == 200 and estimated.json()["totalTokens"] > 0
    assert up.requests == [] and not list((tmp_path / "a").glob("*.jsonl"))  # outside any run
