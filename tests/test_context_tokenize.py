"""The server's own count before sending: OpenAIModel.count_tokens against a loopback llama.cpp look-alike.

The server below answers like llama.cpp's: GET /props, POST /apply-template, POST /tokenize, and
POST /v1/chat/completions, which refuses a prompt over its n_ctx with HTTP 400 the way llama.cpp
does. The fence must count with the server, stop before sending, and never meet that 400.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loopfence import Limits, StopReason, run, tool
from loopfence.models._openai import OpenAIModel
from loopfence.runlog import RunLog, reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import Executor

N_CTX = 4_096
PAGE = "<style>" + ".a{margin:0 auto}" * 8_000 + "</style><p>Pi is a small coding agent.</p>"


def render(body: dict[str, Any]) -> str:
    parts = [json.dumps(t, sort_keys=True) for t in body.get("tools") or []]
    for m in body["messages"]:
        parts.append(f"<|{m['role']}|>{m.get('content') or ''}{json.dumps(m.get('tool_calls') or '')}")
    return "\n".join(parts)


def tokens(text: str) -> list[int]:  # a toy tokenizer: one token per 4 characters
    return list(range(-(-len(text) // 4)))


class Server:
    def __init__(self, llama: bool) -> None:
        self.llama = llama
        self.replies = [calls_reply(tool_call("read_file", path="pages/pi.html")), text_reply("a note")]
        self.hits: list[str] = []
        self.chat_prompts: list[int] = []


def handler(srv: Server) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            srv.hits.append(f"GET {self.path}")
            if self.path == "/props" and srv.llama:
                self._send(200, {"default_generation_settings": {"n_ctx": N_CTX}})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            srv.hits.append(f"POST {self.path}")
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/apply-template" and srv.llama:
                self._send(200, {"prompt": render(body)})
            elif self.path == "/tokenize" and srv.llama:
                self._send(200, {"tokens": tokens(body["content"])})
            elif self.path == "/v1/chat/completions":
                n = len(tokens(render(body)))
                srv.chat_prompts.append(n)
                if n > N_CTX:
                    self._send(400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                               "message": f"request ({n} tokens) exceeds the available "
                                                          f"context size ({N_CTX} tokens), try increasing it"}})
                    return
                reply = dict(srv.replies[min(len(srv.chat_prompts) - 1, len(srv.replies) - 1)])
                self._send(200, {**reply, "usage": {"prompt_tokens": n, "completion_tokens": 9}})
            else:
                self._send(404, {"error": "not found"})

    return H


@pytest.fixture(params=[True, False], ids=["llama.cpp", "other"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Server, str]]:
    srv = Server(request.param)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler(srv))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def page_tool():
    return tool(lambda path: PAGE, name="read_file", kind="read_only")


def test_the_page_overflows_and_is_never_sent(server):
    srv, base = server
    log = RunLog(None)
    with OpenAIModel(base, "m", max_retries=0) as model:
        r = run("Make a note from pages/pi.html", model=model, tools=[page_tool()], log=log,
                limits=Limits(context_window=N_CTX, max_prompt_tokens=None), executor=Executor(result_cap=None))
    assert r.stop.reason is StopReason.CONTEXT_OVERFLOW, r.stop.detail
    assert len(srv.chat_prompts) == 1 and srv.chat_prompts[0] <= N_CTX  # the 400 was never met
    estimates = [e["prompt_estimate"] for e in log.events if e["event"] == "request"]
    if srv.llama:  # the server's own numbers: the first estimate is exactly what it then counted
        assert estimates == srv.chat_prompts and r.stop.data["value"] == len(tokens(render(
            {"messages": list(r.messages), "tools": [page_tool().schema()]})))
        assert srv.hits.count("GET /props") == 1 and srv.hits.count("POST /tokenize") == 2
    else:  # no llama.cpp here: probed once, then the estimate
        assert srv.hits.count("GET /props") == 1 and "POST /tokenize" not in srv.hits
        assert "POST /apply-template" not in srv.hits


def test_the_servers_count_is_what_replay_and_reconcile_judge(server, tmp_path):
    """The unsent prompt's count came from /tokenize: the stop records it, and the log replays and
    reconciles offline, with no server to count (issue 30, defect 8)."""
    srv, base = server
    path = tmp_path / "overflow.jsonl"
    with OpenAIModel(base, "m", max_retries=0) as model:
        r = run("Make a note from pages/pi.html", model=model, tools=[page_tool()], log=RunLog(path),
                limits=Limits(context_window=N_CTX, max_prompt_tokens=None), executor=Executor(result_cap=None))
    assert r.stop.reason is StopReason.CONTEXT_OVERFLOW
    rec = reconcile(path)
    assert rec.ok, [c.detail for c in rec.failed]
    report = replay(path)
    assert report.ok, report.lines()
    assert r.stop.data["prompt_estimate"] == r.stop.data["value"]


def test_without_the_fence_the_server_refuses_it(server):
    srv, base = server
    with OpenAIModel(base, "m", max_retries=0) as model:
        r = run("Make a note", model=model, tools=[page_tool()], log=RunLog(None), executor=Executor(result_cap=None),
                limits=Limits(context_window=None, max_prompt_tokens=None))
    assert len(srv.chat_prompts) == 2 and srv.chat_prompts[1] > N_CTX  # this is what the fence prevents
    assert r.stop.reason in (StopReason.CONTEXT_OVERFLOW, StopReason.ENDPOINT_ERROR)


def test_count_tokens_is_none_when_the_server_is_gone():
    model = OpenAIModel("http://127.0.0.1:9/v1", "m", max_retries=0)
    assert model.count_tokens([{"role": "user", "content": "hi"}], []) is None
    assert model._counter is not None and model._counter.available is False
    model.close()
