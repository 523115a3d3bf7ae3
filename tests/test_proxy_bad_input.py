"""Hostile requests to `loopfence proxy`: each is answered with a 4xx whose OpenAI-style error body
names the field at fault (in its message or its `param`); nothing of it reaches the upstream; and
the proxy goes on serving other runs, including one that was in progress before them.

Bodies: not JSON, not an object, nested past any sane depth, 50 MB, 10,000 messages; wrong types at
every level; an unknown field; a role that does not exist; a tool message answering no call; a tool
call id used twice; calls and tools that are not what the wire allows. (Unknown keys inside a message
pass: clients add their own, e.g. `refusal`, `annotations`, `reasoning_content`.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

from _proxy_support import Proxy

USER = {"role": "user", "content": "Summarise the notes."}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
ASKED = {"role": "assistant", "content": None, "tool_calls": [CALL]}


def _body(**fields: Any) -> bytes:
    body = {"model": "fake", "messages": [USER]}
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not _GONE}).encode()


_GONE = object()
MB50 = 50 * 1024 * 1024

# (id, raw body, a name the answer must mention: the field at fault, or what is wrong with the body)
HOSTILE: list[tuple[str, bytes, str]] = [
    ("not_json", b'{"model": "fake", "messages": [', "JSON"),
    ("empty_body", b"", "JSON"),
    ("an_array", b"[1, 2, 3]", "object"),
    ("a_string", b'"hello"', "object"),
    ("nan", b'{"model": "fake", "messages": NaN}', "NaN"),
    ("nested_100k_deep", b'{"model": "fake", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deep"),
    ("no_messages", _body(messages=_GONE), "messages"),
    ("messages_a_string", _body(messages="hi"), "messages"),
    ("messages_empty", _body(messages=[]), "messages"),
    ("message_a_number", _body(messages=[7]), "messages"),
    ("ten_thousand_messages", _body(messages=[USER] * 10_000), "messages"),
    ("model_a_number", _body(model=42), "model"),
    ("unknown_role", _body(messages=[{"role": "wizard", "content": "abracadabra"}]), "role"),
    ("no_role", _body(messages=[{"content": "hi"}]), "role"),
    ("content_a_number", _body(messages=[{"role": "user", "content": 42}]), "content"),
    ("unknown_top_field", _body(frobnicate=True), "frobnicate"),
    ("stream_a_string", _body(stream="yes"), "stream"),
    ("max_tokens_negative", _body(max_tokens=-5), "max_tokens"),
    ("max_tokens_a_string", _body(max_tokens="many"), "max_tokens"),
    ("temperature_an_object", _body(temperature={"hot": True}), "temperature"),
    ("tools_an_object", _body(tools={"read_file": {}}), "tools"),
    ("tool_without_name", _body(tools=[{"type": "function", "function": {"parameters": {"type": "object"}}}]), "name"),
    ("tool_parameters_a_string", _body(tools=[{"type": "function", "function": {
        "name": "read_file", "parameters": "path"}}]), "parameters"),
    ("tool_declared_twice", _body(tools=TOOLS * 2), "read_file"),
    ("tool_result_with_no_call", _body(tools=TOOLS, messages=[USER, {"role": "tool", "tool_call_id": "call_9",
                                                                     "content": "r"}]), "tool_call_id"),
    ("tool_result_without_id", _body(tools=TOOLS, messages=[USER, ASKED, {"role": "tool", "content": "r"}]),
     "tool_call_id"),
    ("tool_call_id_used_twice", _body(tools=TOOLS, messages=[USER, dict(ASKED, tool_calls=[CALL, CALL]),
                                                             {"role": "tool", "tool_call_id": "call_1", "content": "r"},
                                                             {"role": "tool", "tool_call_id": "call_1", "content": "r"}]),
     "call_1"),
    ("tool_call_arguments_an_object", _body(tools=TOOLS, messages=[USER, dict(ASKED, tool_calls=[dict(
        CALL, function={"name": "read_file", "arguments": {"path": "a.txt"}})])]), "arguments"),
    ("tool_calls_a_string", _body(messages=[USER, dict(ASKED, tool_calls="read_file")]), "tool_calls"),
    ("tool_choice_undeclared", _body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "rm_rf"}}),
     "tool_choice"),
]


@pytest.fixture(scope="module")
def fence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeServer, Proxy, Path]]:
    tmp = tmp_path_factory.mktemp("proxy-bad")
    replies = [calls_reply(tool_call("read_file", path="a.txt", id="call_up")), text_reply("the notes say hello")]
    with FakeServer(replies) as upstream, Proxy("--upstream", upstream.base_url, "--logs", str(tmp / "logs"),
                                                stderr=tmp / "proxy.err") as proxy:
        yield upstream, proxy, tmp / "logs"


def _error(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI-style error object of a 4xx answer."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"].strip()
    assert set(error) >= {"message", "type", "param", "code"}, error
    return error


@pytest.mark.parametrize(("raw", "names"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_request_gets_a_4xx_naming_the_field_and_never_reaches_the_upstream(
        fence: tuple[FakeServer, Proxy, Path], raw: bytes, names: str) -> None:
    upstream, proxy, _ = fence
    before = upstream.served
    response = httpx.post(f"{proxy.base_url}/chat/completions", content=raw, timeout=120,
                          headers={"Content-Type": "application/json"})
    error = _error(response)
    assert names in f"{error['message']} {error['param']}", error
    assert "Traceback" not in response.text
    assert upstream.served == before


def test_a_50_mb_body_is_refused_by_its_size(fence: tuple[FakeServer, Proxy, Path]) -> None:
    upstream, proxy, _ = fence
    before = upstream.served
    raw = _body(messages=[{"role": "user", "content": "x" * MB50}])
    try:
        response = httpx.post(f"{proxy.base_url}/chat/completions", content=raw, timeout=120,
                              headers={"Content-Type": "application/json"})
    except httpx.TransportError as exc:  # pragma: no cover - what a proxy that dropped the upload gives
        pytest.fail(f"the proxy did not answer a 50 MB body (it must answer 413 naming its cap): {exc!r}")
    error = _error(response)
    assert response.status_code == 413, response.status_code
    assert "bytes" in error["message"] or "MB" in error["message"] or "MiB" in error["message"], error
    assert upstream.served == before


def test_the_proxy_keeps_serving_runs_after_the_hostile_requests(fence: tuple[FakeServer, Proxy, Path]) -> None:
    """A run begun before them goes on where it was; a new run starts and is served; every log
    the proxy left is readable (a refused request left no run behind)."""
    upstream, proxy, logs = fence
    for raw, _ in [h[1:] for h in HOSTILE[:5]]:
        httpx.post(f"{proxy.base_url}/chat/completions", content=raw, timeout=120)
    first = httpx.post(f"{proxy.base_url}/chat/completions", timeout=120, json={
        "model": "fake", "messages": [USER], "tools": TOOLS})
    assert first.status_code == 200, first.text
    asked = first.json()["choices"][0]["message"]
    assert asked["tool_calls"][0]["function"]["name"] == "read_file"
    for raw, _ in [h[1:] for h in HOSTILE[5:]]:
        httpx.post(f"{proxy.base_url}/chat/completions", content=raw, timeout=120)
    answered = httpx.post(f"{proxy.base_url}/chat/completions", timeout=120, json={
        "model": "fake", "tools": TOOLS, "messages": [
            USER, asked, {"role": "tool", "tool_call_id": asked["tool_calls"][0]["id"], "content": "hello"}]})
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "the notes say hello"
    assert answered.headers["x-loopfence-run"] == first.headers["x-loopfence-run"]  # the same run, continued
    assert httpx.get(f"{proxy.base_url}/models", timeout=120).json()["data"]
