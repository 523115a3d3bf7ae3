"""OpenAIModel against a real loopback server: the request it sends, retries, time, error mapping."""

from __future__ import annotations

import time

import pytest

from loopfence import Request, StopReason
from loopfence._stops import StopError
from loopfence.models import OpenAIModel, Timeouts
from loopfence.models._retry import backoff_delay, parse_retry_after
from loopfence.testing import FakeServer, calls_reply, overflow_body, text_reply, tool_call

KEY = "sk-test-0123456789abcdef"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
FAST = Timeouts(connect=2, read=2, write=2, pool=2)
OK = text_reply("ok", usage=(5, 1))


def req(deadline: float | None = None, **params) -> Request:
    return Request([{"role": "user", "content": "hi"}], TOOLS, params, deadline)


def model(srv: FakeServer, **kw) -> OpenAIModel:
    kw.setdefault("timeout", FAST)
    kw.setdefault("backoff_base", 0.01)
    return OpenAIModel(srv.base_url, kw.pop("name", "m"), kw.pop("api_key", None), **kw)


def stop_of(m: OpenAIModel, request: Request | None = None) -> StopError:
    with pytest.raises(StopError) as e:
        m.complete(request or req())
    return e.value


# -- what is sent ------------------------------------------------------------------------------
def test_request_body_and_headers():
    with FakeServer([OK]) as srv, model(srv, name="qwen", api_key=KEY, stream=True, tool_choice="required",
                                        extra_params={"temperature": 0.5, "seed": 1}) as m:
        reply = m.complete(req(max_tokens=64, temperature=0, model="other", stream=False))
        assert reply.content == "ok" and reply.complete
        body, headers = srv.requests[0], srv.headers[0]
    assert body["model"] == "qwen"  # params cannot override model, messages, tools or stream
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["tools"] == TOOLS
    assert body["tool_choice"] == "required" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (64, 0, 1)
    assert headers["authorization"] == f"Bearer {KEY}"
    assert srv.requests[0]["stream"] is True


def test_a_lone_surrogate_in_the_conversation_is_sent_escaped():
    """"\\ud800" is valid JSON a reply or a tool result may carry; UTF-8 cannot hold it. It goes out
    as its escape (httpx's own `json=` raises UnicodeEncodeError) and the server reads the same text."""
    text = "before \ud800 after"
    with FakeServer([OK]) as srv, model(srv) as m:
        m.complete(Request([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c",
                                                                  "content": text}], TOOLS, {}))
        assert srv.requests[0]["messages"][1]["content"] == text
        assert srv.headers[0]["content-type"] == "application/json"


def test_a_body_that_cannot_be_decoded_is_a_named_stop():
    bad = {"status": 200, "body": "not gzip at all", "headers": {"Content-Encoding": "gzip"}}
    with FakeServer([bad]) as srv, model(srv) as m:
        e = stop_of(m)
    assert e.stop.reason is StopReason.ENDPOINT_ERROR
    assert "could not be decoded (Content-Encoding: gzip)" in e.stop.detail, e.stop


def test_no_tools_means_no_tool_choice_and_no_key_means_no_authorization():
    with FakeServer([OK]) as srv, model(srv, tool_choice="auto") as m:
        m.complete(Request([{"role": "user", "content": "hi"}], [], {}))
        assert "tools" not in srv.requests[0] and "tool_choice" not in srv.requests[0]
        assert "stream" not in srv.requests[0]
        assert "authorization" not in srv.headers[0]


def test_assistant_null_content_is_sent_as_empty_string_without_touching_the_run():
    calls = [{"id": "c", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c", "content": "x"}]
    with FakeServer([OK]) as srv, model(srv) as m:
        m.complete(Request(messages, TOOLS, {}))
        sent = srv.requests[0]["messages"]
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": calls}
    assert messages[1]["content"] is None and sent[0] == messages[0] and sent[2] == messages[2]


def test_base_url_forms():
    assert OpenAIModel("http://h:1/v1/chat/completions/").url == "http://h:1/v1/chat/completions"
    assert OpenAIModel("http://h:1/v1/").url == "http://h:1/v1/chat/completions"
    for bad in ("ftp://h/v1", "h:1/v1", ""):
        with pytest.raises(ValueError):
            OpenAIModel(bad)


def test_from_env(monkeypatch):
    for k in ("LOOPFENCE_BASE_URL", "LOOPFENCE_MODEL", "LOOPFENCE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="LOOPFENCE_BASE_URL"):
        OpenAIModel.from_env()
    monkeypatch.setenv("LOOPFENCE_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LOOPFENCE_MODEL", "envmodel")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback-key")
    m = OpenAIModel.from_env(stream=True)
    assert (m.base_url, m.model, m._key, m.stream) == ("http://127.0.0.1:9/v1", "envmodel", "sk-fallback-key", True)
    monkeypatch.setenv("LOOPFENCE_API_KEY", "sk-primary-key")
    assert OpenAIModel.from_env()._key == "sk-primary-key"
    assert OpenAIModel.from_env("http://other:1/v1", "argmodel", "sk-arg")._key == "sk-arg"


def test_the_key_never_shows(tmp_path):
    from loopfence import run

    echo = {"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {KEY}.",
                                              "code": "invalid_api_key"}}}
    with FakeServer([echo]) as srv, model(srv, api_key=KEY) as m:
        assert KEY not in repr(m.describe()) and m.describe()["api_key"] == "set"
        e = stop_of(m)
        assert e.stop.reason is StopReason.ENDPOINT_ERROR and e.stop.data["status"] == 401
        assert KEY not in e.stop.detail and KEY not in repr(e.stop.data) and "***" in e.stop.detail
        log = tmp_path / "run.jsonl"
        result = run("hi", model=m, log=log)
    assert result.stop.reason is StopReason.ENDPOINT_ERROR
    assert KEY not in log.read_text()
    assert "http://user:pw@" not in OpenAIModel("http://user:pw@h:1/v1?key=s").describe()["base_url"]


# -- retries -----------------------------------------------------------------------------------
def test_5xx_is_retried_with_backoff_then_succeeds():
    with FakeServer([{"status": 500, "body": "boom"}, {"status": 503, "body": {"error": "busy"}}, OK]) as srv, \
            model(srv) as m:
        assert m.complete(req()).content == "ok"
        assert len(srv.requests) == 3 and m.retries == 2


@pytest.mark.parametrize("status", [408, 409, 429, 502])
def test_retryable_statuses(status):
    with FakeServer([{"status": status, "body": {}}, OK]) as srv, model(srv) as m:
        assert m.complete(req()).content == "ok" and len(srv.requests) == 2


def test_retry_after_is_honoured():
    with FakeServer([{"status": 429, "body": {}, "headers": {"Retry-After": "1"}}, OK]) as srv, \
            model(srv, retry_after_cap=2) as m:
        t = time.monotonic()
        assert m.complete(req()).content == "ok"
        assert time.monotonic() - t >= 0.95 and len(srv.requests) == 2


def test_retry_after_over_the_cap_stops_at_once():
    with FakeServer([{"fault": "rate_limit", "retry_after": 120}, OK]) as srv, model(srv, retry_after_cap=30) as m:
        e = stop_of(m)
        assert e.stop.reason is StopReason.ENDPOINT_ERROR and "retry_after_cap=30" in e.stop.detail
        assert len(srv.requests) == 1


def test_retries_run_out_with_a_named_stop():
    with FakeServer([{"fault": "server_error"}]) as srv, model(srv, max_retries=2) as m:
        e = stop_of(m)
        assert e.stop.reason is StopReason.ENDPOINT_ERROR and "gave up after 3 attempts" in e.stop.detail
        assert e.stop.data["status"] == 500 and len(srv.requests) == 3


def test_a_retry_wait_past_the_runs_deadline_is_cut_by_the_run():
    """The adapter never decides the run is over: the run's clock cancels its wait for a retry."""
    from loopfence import Limits, RunLog, run

    with FakeServer([{"status": 429, "body": {}, "headers": {"Retry-After": "5"}}, OK]) as srv, \
            model(srv, retry_after_cap=10) as m:
        t = time.monotonic()
        result = run("t", model=m, limits=Limits(max_wall_seconds=1.0), log=RunLog(None))
        assert result.stop.reason is StopReason.MAX_WALL_SECONDS, result.stop
        assert len(srv.requests) == 1  # the retry was never sent
        assert time.monotonic() - t < 5  # (had it slept the 5 s, this could not hold)


def test_connection_refused_is_retried_then_named():
    with FakeServer([OK]) as srv:
        url = srv.base_url
    with OpenAIModel(url, "m", timeout=FAST, backoff_base=0.01, max_retries=2) as m:
        e = stop_of(m)
    assert e.stop.reason is StopReason.ENDPOINT_ERROR and "connection error" in e.stop.detail


def test_a_cut_non_streamed_body_is_retried():
    with FakeServer([{"fault": "truncated", "reply": calls_reply(tool_call("read_file", path="a"))}, OK]) as srv, \
            model(srv) as m:
        assert m.complete(req()).content == "ok" and len(srv.requests) == 2


def test_a_broken_stream_is_never_retried():
    chunks = [{"choices": [{"index": 0, "delta": {"content": "a"}}]}] * 4
    for fault in ({"fault": "reset", "chunks": chunks}, {"fault": "truncated", "chunks": chunks},
                  {"fault": "missing_done", "chunks": chunks}):
        with FakeServer([fault, OK]) as srv, model(srv, stream=True) as m:
            reply = m.complete(req())
            assert not reply.complete and reply.problem, fault
            assert len(srv.requests) == 1, fault


# -- time --------------------------------------------------------------------------------------
def test_read_timeout_between_chunks_is_an_incomplete_stream():
    chunks = [{"choices": [{"index": 0, "delta": {"content": "a"}}]}] * 3
    with FakeServer([{"fault": "slow_stream", "chunks": chunks, "delay_s": 0.5}]) as srv, \
            model(srv, stream=True, timeout=Timeouts(read=0.2)) as m:
        reply = m.complete(req())
        assert not reply.complete and "read timeout" in reply.problem and len(srv.requests) == 1


@pytest.mark.parametrize("fault,server_s", [
    ({"fault": "slow_stream", "delay_s": 0.2,
      "chunks": [{"choices": [{"index": 0, "delta": {"content": "a"}}]}] * 50}, 10.0),
    ({"fault": "stall", "delay_s": 5}, 5.0)])
def test_the_request_never_outlives_the_run_deadline(fault, server_s):
    """Order, not speed: the run's clock cuts the request at the deadline (not before), before the
    server is done."""
    from loopfence import Limits, RunLog, run

    with FakeServer([fault]) as srv, model(srv, stream=True, timeout=Timeouts(read=30)) as m:
        t = time.monotonic()
        result = run("t", model=m, limits=Limits(max_wall_seconds=0.6), log=RunLog(None))
        took = time.monotonic() - t
    assert result.stop.reason is StopReason.MAX_WALL_SECONDS and "the model request" in result.stop.detail
    assert 0.6 <= took + 0.01 and took < server_s, took


@pytest.mark.parametrize("fault,limits,kw,reason", [
    ({"fault": "stall", "delay_s": 5}, {"max_wall_seconds": 0.6}, {}, StopReason.MAX_WALL_SECONDS),
    ({"fault": "slow_stream", "delay_s": 0.2,
      "chunks": [{"choices": [{"index": 0, "delta": {"content": "a"}}]}] * 50},
     {"max_wall_seconds": 0.6}, {"stream": True}, StopReason.MAX_WALL_SECONDS),
    ({"fault": "stall", "delay_s": 5}, {}, {"request_timeout": 0.3}, StopReason.ENDPOINT_ERROR),
])
def test_inside_a_run_the_deadline_is_kept_without_a_thread_per_request(fault, limits, kw, reason,
                                                                        monkeypatch):
    """In a run, the request is cancelled at the deadline without a thread per request; the log is complete."""
    import threading

    from loopfence import Limits, RunLog, run

    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self):
        started.append(self.name)
        real_start(self)

    log = RunLog(None)
    with FakeServer([fault]) as srv, model(srv, timeout=Timeouts(read=30), **kw) as m:
        monkeypatch.setattr(threading.Thread, "start", counting_start)
        t = time.monotonic()
        result = run("t", model=m, limits=Limits(**limits), log=log)
        took = time.monotonic() - t
    assert result.stop.reason is reason, result.stop
    assert took < 5, took  # before the server's 5 s stall (or 10 s stream) was over
    assert log.events[-1]["event"] == "stop"
    assert "loopfence-http" not in started, started


def test_request_timeout_is_an_endpoint_error():
    with FakeServer([{"fault": "stall", "delay_s": 5}]) as srv, \
            model(srv, request_timeout=0.3, timeout=Timeouts(read=30)) as m:
        e = stop_of(m, req(deadline=time.monotonic() + 10))
    assert e.stop.reason is StopReason.ENDPOINT_ERROR and "request_timeout" in e.stop.detail


# -- error mapping -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["llama.cpp", "openai", "vllm", "vllm_flat"])
def test_context_overflow_in_every_shape(shape):
    with FakeServer([{"status": 400, "body": overflow_body(shape, 5000, 4096)}]) as srv, model(srv) as m:
        e = stop_of(m)
    assert e.stop.reason is StopReason.CONTEXT_OVERFLOW, e.stop
    assert (e.stop.data["limit"], e.stop.data["value"], e.stop.data["status"]) == (4096, 5000, 400)
    assert "5000" in e.stop.detail and "4096" in e.stop.detail and len(srv.requests) == 1


def test_vllm_input_plus_max_tokens_message():
    body = {"error": {"message": "This model's maximum context length is 2048 tokens. However, your request has "
                                 "8 input tokens plus 2045 'max_tokens'. Please reduce one or the other.",
                      "type": "BadRequestError", "code": 400}}
    with FakeServer([{"status": 400, "body": body}]) as srv, model(srv) as m:
        e = stop_of(m)
    assert e.stop.reason is StopReason.CONTEXT_OVERFLOW
    assert (e.stop.data["limit"], e.stop.data["value"], e.stop.data["prompt_tokens"]) == (2048, 2053, 8)


@pytest.mark.parametrize("generation,reason", [
    ('{"name": "read_file", "arguments": {"nope": 1}}', StopReason.SCHEMA_MISMATCH),
    ('{"name": "delete_everything", "arguments": {}}', StopReason.UNKNOWN_TOOL),
    ("maybe", StopReason.INVALID_JSON)])
def test_tool_use_failed_names_the_contract_violation(generation, reason):
    form = {"fault": "tool_use_failed", "failed_generation": generation, "message": "validation failed"}
    with FakeServer([form]) as srv, model(srv) as m:
        e = stop_of(m)
    assert e.stop.reason is reason
    assert e.stop.data["failed_generation"] == generation and e.stop.data["status"] == 400
    assert len(srv.requests) == 1


@pytest.mark.parametrize("form,words", [
    ({"status": 404, "body": "<html>Not Found</html>"}, "HTTP 404: <html>Not Found</html>"),
    ({"status": 400, "body": {"error": {"message": "bad temperature"}}}, "HTTP 400: bad temperature"),
    ({"fault": "invalid_json"}, "not valid JSON"),
    ({"fault": "empty_choices"}, "empty choices"),
    ({"choices": [{"index": 0}]}, "no message")])
def test_other_failures_are_endpoint_errors_with_status_and_message(form, words):
    with FakeServer([form]) as srv, model(srv) as m:
        e = stop_of(m)
    assert e.stop.reason is StopReason.ENDPOINT_ERROR and words in e.stop.detail, e.stop
    assert len(srv.requests) == 1


def test_a_json_reply_to_a_streaming_request_is_read():
    with FakeServer([{"status": 200, "body": calls_reply(tool_call("read_file", path="a"))}]) as srv, \
            model(srv, stream=True) as m:
        reply = m.complete(req())
    assert reply.complete and reply.tool_calls[0].name == "read_file"


def test_sse_reply_to_a_plain_request_is_read():
    chunks = [{"choices": [{"index": 0, "delta": {"content": "streamed"}, "finish_reason": "stop"}]}]
    with FakeServer([{"chunks": chunks}]) as srv, model(srv, stream=False) as m:
        assert m.complete(req()).content == "streamed"


# -- pure pieces -------------------------------------------------------------------------------
def test_parse_retry_after():
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0) == 10.0
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after({}) is None


def test_backoff_grows_with_jitter_and_a_cap():
    import random

    rng = random.Random(0)
    for n, (lo, hi) in enumerate([(0.25, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 4.0), (2.0, 4.0)], 1):
        d = backoff_delay(n, 0.5, 4.0, rng)
        assert lo <= d <= hi, (n, d)


def test_timeouts_are_capped_by_what_is_left():
    t = Timeouts(connect=10, read=None, write=3, pool=1).bounded(2.0)
    assert (t.connect, t.read, t.write, t.pool) == (2.0, 2.0, 2.0, 1)
    assert Timeouts(read=None).bounded(None).read is None
