"""Streaming through `loopfence proxy` ("streaming is for display, parsing is for completion", seed 000):

- text deltas pass through as they arrive: the upstream holds the rest of its stream until the
  client has shown it the first delta (a gate, not a clock), so a proxy that buffered the reply
  would leave the gate shut;
- a stream cut in the middle of a call's arguments ends the run `incomplete_stream`, and the client
  is told so in the answer;
- no partial tool call ever reaches a client, over any chunking of the upstream's SSE (hypothesis:
  text and arguments split anywhere, the stream cut anywhere or not at all, by a close or a reset):
  the client gets every call whole, exactly as the model sent it, or none.

The client reads the SSE itself (httpx), so every delta it is sent is seen; the upstream is the
real FakeServer, answering each request with the stream drawn for it.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopfence.runlog import read_log
from loopfence.testing import FakeServer, text_reply

from _proxy_support import Proxy, reconciles

TOOLS = [{"type": "function", "function": {"name": "record", "description": "Record a note.", "parameters": {
            "type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}}},
         {"type": "function", "function": {"name": "read_page", "description": "Read a page.", "parameters": {
             "type": "object", "properties": {"path": {"type": "string"}, "page": {"type": "integer"}},
             "required": ["path", "page"]}}}]
_TASKS = itertools.count()
GATE_S = 60.0  # how long the gated upstream waits for the client: bounds a failure, not a speed


class Drawn(FakeServer):
    """The FakeServer answering every request with the form the test set last (`form`)."""

    def __init__(self) -> None:
        super().__init__([text_reply("unused")])
        self.form: dict[str, Any] = text_reply("unused")

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(body)
        return self.form


class Gated(ThreadingHTTPServer):
    """An upstream that streams one text delta, then waits until `seen` is set (the client has shown
    the first delta), then streams the rest. `waited` records whether it was set in time."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _GatedHandler)
        self.seen = threading.Event()
        self.waited: list[bool] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"


class _GatedHandler(BaseHTTPRequestHandler):
    server: Gated

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self._event({"role": "assistant", "content": "first "})
        self.server.waited.append(self.server.seen.wait(GATE_S))
        for piece in ("second ", "third"):
            self._event({"content": piece})
        self._event({}, "stop")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, delta: dict[str, Any], finish: str | None = None) -> None:
        chunk = {"id": "g", "object": "chat.completion.chunk", "model": "fake",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Drawn, Proxy]]:
    tmp = tmp_path_factory.mktemp("proxy-stream")
    with Drawn() as upstream, Proxy("--upstream", upstream.base_url, "--logs", str(tmp / "logs"),
                                    stderr=tmp / "proxy.err") as proxy:
        yield upstream, proxy


def _request(task: str | None = None) -> dict[str, Any]:
    return {"model": "fake", "stream": True, "tools": TOOLS,
            "messages": [{"role": "system", "content": "Use the tools."},
                         {"role": "user", "content": task or f"Streamed task {next(_TASKS)}."}]}


class Seen:
    """What a client reading the proxy's SSE saw: every chunk, the text, the tool-call deltas
    assembled by index, the finish reason, and the response headers."""

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.deltas: list[dict[str, Any]] = []
        with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=120) as response:
            self.status, self.headers = response.status_code, response.headers
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.chunks.append(json.loads(line[len("data: "):]))  # every event whole JSON
        choices = [c for chunk in self.chunks for c in chunk.get("choices") or []]
        self.text = "".join(c["delta"].get("content") or "" for c in choices)
        self.finish = [c["finish_reason"] for c in choices if c.get("finish_reason")]
        calls: dict[int, dict[str, str]] = {}
        for c in choices:
            for d in c["delta"].get("tool_calls") or []:
                self.deltas.append(d)
                call = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] = d.get("id") or call["id"]
                fn = d.get("function") or {}
                call["name"] = fn.get("name") or call["name"]
                call["arguments"] += fn.get("arguments") or ""
        self.calls = [calls[i] for i in sorted(calls)]

    def stop(self, logs: Path) -> str | None:
        """The stop the run's log names (X-Loopfence-Run names the log); the log reconciles."""
        log = logs / f"{self.headers['x-loopfence-run']}.jsonl"
        reconciles(log)
        stop = read_log(log).stop
        return None if stop is None else stop.reason


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-drawn", "object": "chat.completion.chunk", "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _split(text: str, cuts: list[int]) -> list[str]:
    at = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(at) if b > a]


def _stream(text: str, calls: list[tuple[str, str, str]], cuts: list[int]) -> list[dict[str, Any]]:
    """The chunks of a reply: its text, then each call (id and name first) with its arguments, each
    split at `cuts`; then the finish reason."""
    out = [_chunk({"role": "assistant", "content": None})]
    out += [_chunk({"content": piece}) for piece in _split(text, cuts)]
    for i, (call_id, name, arguments) in enumerate(calls):
        out.append(_chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                           "function": {"name": name, "arguments": ""}}]}))
        out += [_chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                for piece in _split(arguments, cuts)]
    out.append(_chunk({}, "tool_calls" if calls else "stop"))
    return out


def test_text_deltas_reach_the_client_before_the_reply_ends(tmp_path: Path) -> None:
    gated = Gated()
    threading.Thread(target=gated.serve_forever, daemon=True).start()
    try:
        with Proxy("--upstream", gated.base_url, "--logs", str(tmp_path / "logs"), stderr=tmp_path / "err") as proxy:
            client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-client")
            text = ""
            for chunk in client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}],
                                                        stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                    gated.seen.set()  # the upstream goes on only now
    finally:
        gated.shutdown()
        gated.server_close()
    assert gated.waited == [True]  # the first delta reached the client while the upstream held the rest
    assert text == "first second third"


def test_a_stream_cut_mid_arguments_ends_incomplete_stream(drawn: tuple[Drawn, Proxy]) -> None:
    upstream, proxy = drawn
    chunks = _stream("Let me note it.", [("call_a", "record", '{"note": "the whole note"}')], [9])
    cut = next(i for i, c in enumerate(chunks) if c["choices"][0]["delta"].get("tool_calls")) + 2  # one fragment in
    for form in ({"chunks": chunks[:cut], "done": False}, {"fault": "reset", "after": cut, "chunks": chunks}):
        upstream.form = form
        seen = Seen(proxy.base_url, _request())
        assert seen.status == 200 and not seen.deltas, seen.chunks  # no piece of the call
        assert seen.finish == ["stop"] and "incomplete_stream" in seen.text, seen.chunks
        assert seen.stop(proxy.logs) == "incomplete_stream"


_NOTE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_CALL = st.one_of(st.builds(lambda n: ("record", json.dumps({"note": n})), _NOTE),
                  st.builds(lambda p, n: ("read_page", json.dumps({"path": p, "page": n}, separators=(",", ":"))),
                            _NOTE, st.integers(1, 99)))


@settings(max_examples=40)
@example(text="0\x85 \u2028 \u2029", calls=[], cuts=[], cut=None, reset=False)  # line breaks splitlines() sees
@given(text=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cs",)), min_size=1,
                    max_size=20).filter(str.strip), calls=st.lists(_CALL, max_size=3, unique=True),
       cuts=st.lists(st.integers(0, 200), max_size=6), cut=st.none() | st.integers(1, 60), reset=st.booleans())
def test_no_partial_tool_call_ever_reaches_a_client(drawn: tuple[Drawn, Proxy], text: str,
                                                    calls: list[tuple[str, str]], cuts: list[int],
                                                    cut: int | None, reset: bool) -> None:
    upstream, proxy = drawn
    sent = [(f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(calls)]
    chunks = _stream(text, sent, cuts)
    whole = cut is None or cut >= len(chunks)
    if whole:
        upstream.form = {"chunks": chunks, "done": True}
    elif reset:
        upstream.form = {"fault": "reset", "after": cut, "chunks": chunks}
    else:
        upstream.form = {"chunks": chunks[:cut], "done": False}
    seen = Seen(proxy.base_url, _request())
    assert seen.status == 200
    if whole and sent:  # released whole after the check, exactly as sent
        assert [(c["id"], c["name"], c["arguments"]) for c in seen.calls] == sent, seen.chunks
        assert (seen.text, seen.finish) == (text, ["tool_calls"])
    elif whole:
        assert (seen.text, seen.finish, seen.deltas) == (text, ["stop"], [])
    else:  # cut before its end: no call at all, the run stopped for it
        assert seen.deltas == [] and seen.finish == ["stop"], seen.chunks
        assert seen.stop(proxy.logs) == "incomplete_stream"
