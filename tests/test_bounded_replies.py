"""Issue 31, section 5: a hostile endpoint cannot make a log that cannot be read back.

A response body is read within `OpenAIModel(max_response_bytes=...)` (32 MiB by default), counted as
it arrives: a 55 MB reply, streamed or not, ends with a named endpoint_error that gives the size and
the cap, and the log reconciles. A reply under the cap with large arguments is stored once (in the
reply event; the call, gate and nudge events hold a digest of the key and leave the rest out,
_log/_large.py): the log stays about the size of the arguments, and reconcile, replay, resume,
the report and the drill table read it, as they read logs written whole."""

from __future__ import annotations

import json
import string
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence import Limits, RunLog, StopReason, run, workspace_tools
from loopfence.drill._calls import calls_from_events
from loopfence.models import OpenAIModel, Timeouts
from loopfence.runlog import read_log, reconcile, replay, resume
from loopfence._log import _writer
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call
from loopfence._report._run import read_run

MB = 1_000_000
CAP = 32 << 20  # OpenAIModel's default max_response_bytes


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def _run(ws: Path, base_url: str, stream: bool, log: Path, **model: Any) -> Any:
    with OpenAIModel(base_url, "m", None, max_retries=0, stream=stream, **model) as m:
        return run("write it", model=m, tools=workspace_tools(ws, sandbox=False), log=RunLog(log),
                   header={"workspace": str(ws)},
                   limits=Limits(max_prompt_tokens=None, max_completion_tokens=None))


def _holds(log: Path) -> None:
    rec = reconcile(log)
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    rep = replay(log)
    assert rep.ok, rep.divergence and rep.divergence.describe()


# ------------------------------------------------------------------ the cap


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_55_mb_reply_ends_named_and_the_log_reconciles(ws: Path, stream: bool) -> None:
    log = ws.parent / "run.jsonl"
    big = calls_reply(tool_call("write_file", path="big.txt", content="x" * (55 * MB)))
    with FakeServer([big, text_reply("done")]) as srv:
        result = _run(ws, srv.base_url, stream, log)
    stop = result.stop
    assert stop.reason is StopReason.ENDPOINT_ERROR
    assert f"over max_response_bytes={CAP:,}" in stop.detail
    assert stop.data["limit"] == CAP and stop.data["value"] > CAP
    if not stream:  # its Content-Length says so: stopped before the body is read
        assert "declares (Content-Length)" in stop.detail and stop.data["value"] > 55 * MB
    assert not (ws / "big.txt").exists()
    assert log.stat().st_size < 1 * MB
    assert read_log(log).stop is not None
    assert reconcile(log).ok


class _Endless(BaseHTTPRequestHandler):
    """200, a chunked body (no Content-Length) that sends `total` bytes and then never ends."""

    total = 0
    ctype = "application/json"
    release: threading.Event

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", self.ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = b'data: {"choices":[{"index":0,"delta":{"content":"' if "event-stream" in self.ctype \
            else b'{"choices":[{"index":0,"message":{"role":"assistant","content":"'
        sent, piece = 0, b"x" * (256 << 10)
        try:
            for part in (head, *[piece] * (self.total // len(piece))):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                sent += len(part)
            self.wfile.flush()
            self.release.wait(60)  # the body goes on: only a client that stops reading ends it
        except OSError:
            pass


@pytest.fixture
def endless() -> Iterator[type[_Endless]]:
    handler = type("H", (_Endless,), {"release": threading.Event()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"  # type: ignore[attr-defined]
    yield handler
    handler.release.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("ctype", ["application/json", "text/event-stream"])
def test_the_cap_counts_bytes_as_they_are_read(ws: Path, endless: Any, ctype: str) -> None:
    """A body with no length that never ends: only a reader that counts as it reads stops (one that
    reads the whole body first would wait for the read timeout and say so)."""
    cap = 2 << 20
    endless.ctype, endless.total = ctype, cap + (1 << 20)
    log = ws.parent / "run.jsonl"
    result = _run(ws, endless.url, ctype != "application/json", log, max_response_bytes=cap,
                  timeout=Timeouts(read=20))
    assert result.stop.reason is StopReason.ENDPOINT_ERROR, result.stop.detail
    assert f"is at least {result.stop.data['value']:,} bytes, over max_response_bytes={cap:,}" in result.stop.detail
    assert cap < result.stop.data["value"] <= cap + (1 << 20)
    assert reconcile(log).ok


def test_an_error_body_over_the_cap_is_not_read_nor_retried(ws: Path) -> None:
    log = ws.parent / "run.jsonl"
    with FakeServer([{"status": 503, "body": "e" * (3 << 20)}]) as srv:
        with OpenAIModel(srv.base_url, "m", max_retries=3, max_response_bytes=2 << 20) as m:
            result = run("t", model=m, tools=workspace_tools(ws, sandbox=False), log=RunLog(log))
        assert srv.served == 1
    assert result.stop.reason is StopReason.ENDPOINT_ERROR
    assert result.stop.detail.startswith("HTTP 503: the response from ")
    assert f"over max_response_bytes={2 << 20:,}" in result.stop.detail and result.stop.data["status"] == 503
    assert reconcile(log).ok


def test_the_cap_is_a_setting_recorded_in_the_header(ws: Path) -> None:
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(ValueError, match=f"max_response_bytes must be a positive integer or None, got {bad!r}"):
            OpenAIModel("http://127.0.0.1:1/v1", max_response_bytes=bad)
    assert OpenAIModel("http://127.0.0.1:1/v1").describe()["max_response_bytes"] == CAP
    log = ws.parent / "run.jsonl"
    with FakeServer([calls_reply(tool_call("write_file", path="a.txt", content="y" * 5_000))]) as srv:
        result = _run(ws, srv.base_url, False, log, max_response_bytes=4_000)  # the cap is any size
        assert result.stop.reason is StopReason.ENDPOINT_ERROR and "max_response_bytes=4,000" in result.stop.detail
        result = _run(ws, srv.base_url, False, log, max_response_bytes=None)  # None: unbounded
    assert read_log(log).header.model["max_response_bytes"] is None
    assert (ws / "a.txt").read_text() == "y" * 5_000


# ------------------------------------------------------------------ large values stored once

ARGS = 5 * MB


def _big_run(ws: Path, log: Path, stream: bool) -> str:
    content = (string.ascii_lowercase * (ARGS // 26 + 1))[:ARGS]
    with FakeServer([calls_reply(tool_call("write_file", path="big.txt", content=content)),
                     text_reply("done")]) as srv:
        result = _run(ws, srv.base_url, stream, log)
    assert result.stop.reason is StopReason.FINAL_ANSWER, result.stop.detail
    assert (ws / "big.txt").read_text() == content
    return content


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_large_arguments_are_stored_once_and_the_log_reads_back(ws: Path, stream: bool) -> None:
    log = ws.parent / "run.jsonl"
    content = _big_run(ws, log, stream)
    size = log.stat().st_size
    assert ARGS < size < 1.2 * ARGS, f"{size:,} bytes of log for {ARGS:,} characters of arguments"
    records = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()]
    call = next(r for r in records if r["event"] == "call")
    assert "raw_arguments" not in call and "arguments" not in call
    assert call["key"].startswith("write_file:sha256:") and len(call["key"]) < 100
    gate = next(r for r in records if r["event"] == "gate")
    assert gate["key"] == call["key"]
    # the readers rebuild the text from the reply
    from loopfence._log._large import call_text

    assert json.loads(call_text(records)[call["seq"]])["content"] == content
    view = read_run(log)
    assert json.loads(view.steps[0].calls[0].call.raw_arguments or "")["content"] == content
    (row,) = [c for c in calls_from_events(read_log(log).all_events)]
    assert row.arguments["content"] == content
    _holds(log)


def test_a_log_with_large_arguments_resumes(ws: Path) -> None:
    log = ws.parent / "run.jsonl"
    _big_run(ws, log, False)
    lines = log.read_bytes().splitlines(keepends=True)
    cut = next(i for i, x in enumerate(lines) if b'"event":"result"' in x) + 1
    log.write_bytes(b"".join(lines[:cut]))  # killed after the call's result
    with FakeServer([text_reply("resumed")]) as srv, OpenAIModel(srv.base_url, "m", max_retries=0) as m:
        outcome = resume(log, model=m, tools=workspace_tools(ws, sandbox=False))
    assert outcome.result.stop.reason is StopReason.FINAL_ANSWER and outcome.result.final_answer == "resumed"
    assert log.stat().st_size < 1.2 * ARGS
    _holds(log)


def test_a_log_written_whole_still_replays(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Older logs hold every copy: the readers take either shape."""
    log = ws.parent / "run.jsonl"
    monkeypatch.setattr(_writer, "shrink", lambda event, fields, raw: fields)  # as loopfence wrote before
    _big_run(ws, log, False)
    monkeypatch.undo()
    call = next(json.loads(x) for x in log.read_text(encoding="utf-8").splitlines() if '"event":"call"' in x)
    assert len(call["raw_arguments"]) > ARGS and len(call["key"]) > ARGS  # the whole shape
    assert log.stat().st_size > 4 * ARGS
    _holds(log)


# ------------------------------------------------------------------ the rule, as a property

LARGE = 64 << 10  # _log/_large.py's LARGE_CHARS
_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=60, deadline=None)
@given(pad=st.integers(LARGE - 40, LARGE + 40), tail=_TEXT, same=st.booleans(),
       cid=st.sampled_from(["call_0", "c1"]))
def test_shrink_keeps_exactly_what_the_readers_cannot_rebuild(pad: int, tail: str, same: bool, cid: str) -> None:
    from loopfence._log._large import LARGE_CHARS, call_text, compared, shrink, short_key

    assert LARGE_CHARS == LARGE
    raw_args = json.dumps({"s": "z" * pad + tail})
    sent = raw_args if same else raw_args + " "
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": sent}}]}}]}
    key = "f:" + raw_args
    fields = {"step": 1, "tool_call_id": cid, "name": "f", "raw_arguments": raw_args,
              "arguments": json.loads(raw_args), "key": key, "decision": "executed"}
    out = shrink("call", fields, reply)
    # what was left out is rebuilt exactly, and only what can be
    rebuilt = out.get("raw_arguments") or call_text([{"event": "reply", "raw": reply},
                                                     {"event": "call", "seq": 2, **out}]).get(2)
    assert rebuilt == raw_args
    dropped = "raw_arguments" not in out
    assert dropped == (len(raw_args) > LARGE_CHARS and same and cid == "call_0")
    assert (out["key"] == key) == (len(key) <= LARGE_CHARS)
    assert ("arguments" in out) == (len(key) <= LARGE_CHARS)
    assert out["key"] == short_key(key) and short_key(out["key"]) == out["key"]
    # replay compares either shape alike
    whole, stored = json.loads(json.dumps(fields)), json.loads(json.dumps(out))
    compared(whole)
    compared(stored)
    assert whole == stored
