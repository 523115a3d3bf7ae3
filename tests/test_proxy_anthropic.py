"""The Anthropic Messages wire (issue 55): `POST /v1/messages` through `loopfence proxy`, a real
process, in front of a real upstream on 127.0.0.1 that speaks the same wire, streamed and not.

The bench's scripts over raw HTTP: the runaways stop at the rules' minimum without a cache, the
legitimate ones finish, every log reconciles and replays; a stream cut inside a `tool_use` is
`incomplete_stream`; a stop is an assistant message with one text block and `end_turn`, in the
event sequence of a real answer; hostile input gets Anthropic's error shape and is never forwarded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.cli import cli
from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _anthropic_support import AnthropicReplies, AnthropicScripts, converse, events_text, post_messages, to_messages
from _proxy_support import HONEST, RUNAWAY, Proxy, bench_run_ended, reconciles, replays, reset_all, wire_proxy
from bench.common import Workspace

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with wire_proxy(AnthropicScripts(), "anthropic", tmp_path_factory.mktemp("anthropic")) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("script", RUNAWAY + HONEST, ids=lambda s: s.name)
def test_the_bench_scripts_over_the_anthropic_wire(wire: Any, script: Any, stream: bool) -> None:
    """The runaways stop at the rules' minimum, the legitimate scripts finish; report and export read
    the logs of this wire as any other."""
    up, proxy, logs = wire
    with Workspace() as ws:
        ended = converse(proxy.base_url.removesuffix("/v1"), script.name, ws, tag=f"a-{stream}", stream=stream)
    bench_run_ended(script, ended, logs, "anthropic")
    if script in HONEST:
        log, out = logs / f"{ended.run}.jsonl", logs.parent / f"{ended.run}"
        assert cli(["report", str(log), "-o", f"{out}.html"]) == 0 and script.name in Path(f"{out}.html").read_text()
        assert cli(["export", "--format", "atif", str(log), "-o", f"{out}.atif.json"]) == 0
        steps = json.loads(Path(f"{out}.atif.json").read_text())["steps"]
        assert sum(len(st.get("tool_calls") or []) for st in steps) == ended.executions


READ = {"name": "read_file", "description": "read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def test_a_stream_cut_inside_a_tool_use_is_incomplete_stream(tmp_path: Path) -> None:
    cut = {"sse": events_text(to_messages(calls_reply(tool_call("read_file", {"path": "a.py"}, id="toolu_1"))),
                              cut_in_tool_use=True)}
    with AnthropicReplies(lambda body: cut) as up, \
            Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r, msg = post_messages(proxy.base_url.removesuffix("/v1"), {
            "model": "m", "max_tokens": 100, "stream": True, "tools": [READ],
            "messages": [{"role": "user", "content": "read a.py"}]})
    assert r.headers["x-loopfence-stop"] == "incomplete_stream"
    assert [b["type"] for b in msg["content"]] == ["text"] and msg["stop_reason"] == "end_turn"
    assert msg["content"][0]["text"].startswith(STOP_MARKER)
    assert msg["events"][0] == "message_start" and msg["events"][-2:] == ["message_delta", "message_stop"]


def test_a_stop_is_one_text_block_and_end_turn_streamed_and_not_and_a_400_in_error_mode(tmp_path: Path) -> None:
    again = calls_reply(tool_call("read_file", {"path": "a.py"}, id="toolu_x"))
    for mode in ("answer", "error"):
        with AnthropicReplies(lambda body: again) as up, \
                Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path / mode), "--on-stop", mode,
                      stderr=tmp_path / "err") as proxy:
            root = proxy.base_url.removesuffix("/v1")
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"read a.py ({mode})"}]
            seen = []
            for turn in range(5):
                r, msg = post_messages(root, {"model": "m", "max_tokens": 100, "tools": [READ], "messages": messages,
                                              "stream": turn % 2 == 1})
                seen.append((r, msg))
                if "x-loopfence-stop" in r.headers:
                    break
                use = next(b for b in msg["content"] if b["type"] == "tool_use")
                messages += [{"role": "assistant", "content": msg["content"]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                           "content": "x = 1"}]}]
            r, msg = seen[-1]
            assert r.headers["x-loopfence-stop"] == "repeated_call" and len(up.requests) == 3
            if mode == "answer":
                assert r.status_code == 200 and msg["stop_reason"] == "end_turn"
                assert [b["type"] for b in msg["content"]] == ["text"] and msg["content"][0]["text"].startswith(STOP_MARKER)
                if "events" in msg:
                    assert msg["events"] == ["message_start", "content_block_start", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"]
            else:
                assert r.status_code == 400 and msg["type"] == "error"
                assert msg["error"]["type"] == "invalid_request_error" and STOP_MARKER in msg["error"]["message"]
            reset_all(proxy.base_url)
        for log in (tmp_path / mode).glob("*.jsonl"):
            reconciles(log)


def test_messages_pass_through_untouched_but_for_the_cap_and_tool_results_count(tmp_path: Path) -> None:
    """thinking blocks, cache_control, metadata and unknown fields reach the upstream as sent; max_tokens
    is capped to the run's bound; system as blocks; a tool_result with is_error; count_tokens passes
    through outside any run; the client's key comes from x-api-key."""
    replies = [calls_reply(tool_call("read_file", {"path": "a.py"}, id="toolu_1")), text_reply("done")]
    with AnthropicReplies(lambda body: replies[min(sum(m["role"] == "assistant" for m in body["messages"]), 1)]) as up, \
            Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path), "--key", "k1",
                  "--limit", "max_tokens_per_request=500", stderr=tmp_path / "err") as proxy:
        root = proxy.base_url.removesuffix("/v1")
        key = {"x-api-key": "k1", "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
        body = {"model": "m", "max_tokens": 32000, "metadata": {"user_id": "u1"}, "x_unknown": {"a": 1},
                "system": [{"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}],
                "tools": [READ], "messages": [{"role": "user", "content": [{"type": "text", "text": "read a.py"}]}]}
        r1 = httpx.post(f"{root}/v1/messages?beta=true", json=body, headers=key, timeout=60)  # Claude Code's query
        m1 = r1.json()
        thinking = {"type": "thinking", "thinking": "let me read", "signature": "sig=="}
        body["messages"] += [{"role": "assistant", "content": [thinking, *m1["content"]]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                           "is_error": True, "content": [{"type": "text", "text": "ENOENT"}]}]}]
        r2, m2 = post_messages(root, body, headers=key)
        count = httpx.post(f"{root}/v1/messages/count_tokens", json={"model": "m", "messages": body["messages"]},
                           headers=key, timeout=30)
        no_key = httpx.post(f"{root}/v1/messages", json=body, timeout=30)
    assert r1.status_code == r2.status_code == 200 and m2["content"] == [{"type": "text", "text": "done"}]
    sent = up.requests[1]
    assert sent["messages"][1]["content"][0] == thinking and sent["metadata"] == {"user_id": "u1"}
    assert sent["x_unknown"] == {"a": 1} and sent["system"] == body["system"] and sent["max_tokens"] == 500
    assert up.headers[1]["anthropic-beta"] == "interleaved-thinking-2025-05-14" and "x-api-key" not in up.headers[1]
    # passed through to the upstream (which has no such route here: its own 404), outside any run
    assert count.status_code == 404 and "/v1/messages/count_tokens" in count.json()["error"]["message"]
    assert len(up.requests) == 2
    assert no_key.status_code == 401 and no_key.json()["type"] == "error"
    log = next(tmp_path.glob("*.jsonl"))
    results = [e for e in read_log(log).of("result")]
    assert results and results[0].content.startswith("[is_error] ENOENT")
    reconciles(log)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_signed_thinking_blocks_come_back_to_the_client_as_they_came(tmp_path: Path, stream: bool) -> None:
    """With thinking on, the upstream's thinking block (its signature too) reaches the client before
    the text and the tool_use, so that the client can send it back, as the API wants."""
    thought = {"type": "thinking", "thinking": "I should read a.py first.", "signature": "EqQBCkgIARABGAIiQ=="}
    msg = {**to_messages(calls_reply(tool_call("read_file", {"path": "a.py"}, id="toolu_t"), content="Reading.")),
           "id": "msg_t"}
    msg["content"] = [thought, *msg["content"]]
    served = {"sse": events_text(msg)} if stream else {"status": 200, "body": msg}
    with AnthropicReplies(lambda body: served) as up, \
            Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r, got = post_messages(proxy.base_url.removesuffix("/v1"), {
            "model": "m", "max_tokens": 2000, "stream": stream, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [READ], "messages": [{"role": "user", "content": "read a.py"}]})
        reset_all(proxy.base_url)
    assert r.status_code == 200 and got["stop_reason"] == "tool_use"
    assert [b["type"] for b in got["content"]] == ["thinking", "text", "tool_use"]
    assert got["content"][0] == thought and got["content"][2]["id"] == "toolu_t"
    log = next(tmp_path.glob("*.jsonl"))
    reconciles(log)
    replays(log)


@pytest.mark.parametrize(("raw", "field"), [
    (b"not json", None),
    (json.dumps({"model": "m", "max_tokens": 10, "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": 5, "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
    (json.dumps({"model": "m", "max_tokens": "9", "messages": [{"role": "user", "content": "x"}]}).encode(), "max_tokens"),
    (json.dumps({"model": "m", "max_tokens": 9, "messages": [{"role": "wizard", "content": "x"}]}).encode(), "role"),
    (json.dumps({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}).encode(), "tool_use_id"),
    (json.dumps({"model": "m", "max_tokens": 9, "tools": [{"name": "t"}],
                 "messages": [{"role": "user", "content": "x"}]}).encode(), "input_schema"),
    (b"[" * 100_000 + b"]" * 100_000, None),
    (json.dumps({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x" * (17 << 20)}]}).encode(),
     None),
])
def test_hostile_input_gets_anthropics_error_shape_and_is_never_forwarded(tmp_path: Path, raw: bytes,
                                                                          field: str | None) -> None:
    with AnthropicReplies(lambda body: text_reply("never")) as up, \
            Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r = httpx.post(f"{proxy.base_url.removesuffix('/v1')}/v1/messages", content=raw,
                       headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code in (400, 413), r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] in ("invalid_request_error", "request_too_large")
    if field is not None:
        assert field in body["error"]["message"], body
    assert up.requests == []


def test_without_an_anthropic_upstream_a_messages_client_is_translated_to_chat(tmp_path: Path) -> None:
    """No `--upstream anthropic=`: the request goes to the Chat Completions upstream as its chat
    reading, and the answer comes back in the Messages shape."""
    from _proxy_support import ReplyServer

    replies = [calls_reply(tool_call("read_file", {"path": "a.py"}, id="call_1")), text_reply("done")]
    with ReplyServer(lambda body: replies[min(sum(m["role"] == "assistant" for m in body["messages"]), 1)]) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        root = proxy.base_url.removesuffix("/v1")
        body: dict[str, Any] = {"model": "m", "max_tokens": 100, "system": "Be brief.", "tools": [READ],
                                "messages": [{"role": "user", "content": "read a.py"}]}
        _, m1 = post_messages(root, body)
        body["messages"] += [{"role": "assistant", "content": m1["content"]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                           "content": "x = 1"}]}]
        _, m2 = post_messages(root, {**body, "stream": True})
    assert m1["stop_reason"] == "tool_use" and m1["content"][0] == {"type": "tool_use", "id": "call_1",
                                                                     "name": "read_file", "input": {"path": "a.py"}}
    assert m2["content"] == [{"type": "text", "text": "done"}] and m2["stop_reason"] == "end_turn"
    assert up.requests[1]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert up.requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"}
