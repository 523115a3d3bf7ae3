"""Every fault the fake server injects ends a full `loopfence.run` in a retry or a named stop, with a
valid log whose last line is the stop. None crashes or hangs (short timeouts, a wall budget)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _local_support import read_valid_log

from loopfence import Limits, StopReason, run, workspace_tools
from loopfence.models import OpenAIModel, Timeouts
from loopfence.testing import FAULTS, FakeServer, text_reply

S = StopReason
OK = text_reply("all done")
CHUNKS = [{"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": None}]},
          {"choices": [{"index": 0, "delta": {"content": "tial"}, "finish_reason": None}]},
          {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {
              "name": "read_file", "arguments": '{"path": "no'}}]}}]},
          {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'tes.txt"}'}}]}}]},
          {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]

# id -> (reply forms, stream, expected stop, expected number of requests (None: not checked))
CASES: dict[str, tuple[list, bool, StopReason, int | None]] = {
    "slow_stream": ([{"fault": "slow_stream", "chunks": CHUNKS, "delay_s": 0.4}], True, S.INCOMPLETE_STREAM, 1),
    "slow_stream-json": ([{"fault": "slow_stream", "reply": OK, "delay_s": 0.4}, OK], False, S.FINAL_ANSWER, 2),
    "stall-retried": ([{"fault": "stall", "delay_s": 0.4}, OK], False, S.FINAL_ANSWER, 2),
    "stall-forever": ([{"fault": "stall", "delay_s": 0.4}], True, S.ENDPOINT_ERROR, 3),
    "reset-stream": ([{"fault": "reset", "chunks": CHUNKS, "after": 3}, OK], True, S.INCOMPLETE_STREAM, 1),
    "reset-json-retried": ([{"fault": "reset", "reply": OK}, OK], False, S.FINAL_ANSWER, 2),
    "truncated-stream": ([{"fault": "truncated", "chunks": CHUNKS}, OK], True, S.INCOMPLETE_STREAM, 1),
    "truncated-json-retried": ([{"fault": "truncated", "reply": OK}, OK], False, S.FINAL_ANSWER, 2),
    "truncated-json-forever": ([{"fault": "truncated", "reply": OK}], False, S.ENDPOINT_ERROR, 3),
    "missing_done": ([{"fault": "missing_done", "chunks": CHUNKS[:-1]}, OK], True, S.INCOMPLETE_STREAM, 1),
    "empty_stream": ([{"fault": "empty_stream"}, OK], True, S.INCOMPLETE_STREAM, 1),
    "error_event": ([{"fault": "error_event", "chunks": CHUNKS[:3]}, OK], True, S.ENDPOINT_ERROR, 1),
    "close-retried": ([{"fault": "close"}, OK], False, S.FINAL_ANSWER, 2),
    "close-forever": ([{"fault": "close"}], True, S.ENDPOINT_ERROR, 3),
    "rate_limit-retried": ([{"status": 429, "body": {}, "headers": {"retry-after-ms": "50"}}, OK], True,
                           S.FINAL_ANSWER, 2),
    "rate_limit-over-cap": ([{"fault": "rate_limit", "retry_after": 60}, OK], False, S.ENDPOINT_ERROR, 1),
    "server_error-retried": ([{"fault": "server_error"}, OK], True, S.FINAL_ANSWER, 2),
    "server_error-forever": ([{"fault": "server_error", "status": 502}], False, S.ENDPOINT_ERROR, 3),
    "invalid_json": ([{"fault": "invalid_json"}, OK], False, S.ENDPOINT_ERROR, 1),
    "invalid_chunk": ([{"chunks": [CHUNKS[0], '{"choices": [{"index": 0, "delta": {"cont', CHUNKS[-1]]}, OK], True,
                      S.INCOMPLETE_STREAM, 1),
    "overflow-llama.cpp": ([{"fault": "overflow", "shape": "llama.cpp"}], True, S.CONTEXT_OVERFLOW, 1),
    "overflow-openai": ([{"fault": "overflow", "shape": "openai"}], False, S.CONTEXT_OVERFLOW, 1),
    "overflow-vllm": ([{"fault": "overflow", "shape": "vllm"}], False, S.CONTEXT_OVERFLOW, 1),
    "overflow-vllm_flat": ([{"fault": "overflow", "shape": "vllm_flat"}], True, S.CONTEXT_OVERFLOW, 1),
    "tool_use_failed": ([{"fault": "tool_use_failed", "failed_generation":
                          '{"name": "read_file", "arguments": {"paht": "x"}}'}], False, S.SCHEMA_MISMATCH, 1),
    "empty_choices": ([{"fault": "empty_choices"}, OK], False, S.ENDPOINT_ERROR, 1),
    "empty_choices-stream": ([{"fault": "empty_choices"}, OK], True, S.ENDPOINT_ERROR, 1),
    "anonymous_call": ([{"fault": "anonymous_call", "name": "read_file", "arguments": {"path": "notes.txt"}}, OK],
                       False, S.FINAL_ANSWER, 2),
    "anonymous_call-stream": ([{"fault": "anonymous_call", "name": "read_file", "arguments": {"path": "notes.txt"}},
                               OK], True, S.FINAL_ANSWER, 2),
}


def test_every_fault_has_a_case():
    covered = {f["fault"] for forms, *_ in CASES.values() for f in forms if "fault" in f}
    assert covered == set(FAULTS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fault_ends_in_a_retry_or_a_named_stop_with_a_valid_log(case, tmp_path: Path):
    forms, stream, expected, n_requests = CASES[case]
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    log = tmp_path / "run.jsonl"
    t = time.monotonic()
    with FakeServer(forms) as srv, OpenAIModel(srv.base_url, "fake", stream=stream, max_retries=2, backoff_base=0.01,
                                               retry_after_cap=5, timeout=Timeouts(connect=1, read=0.25, write=1,
                                                                                   pool=1)) as model:
        result = run("Read notes.txt and answer.", model=model, tools=workspace_tools(tmp_path),
                     limits=Limits(max_wall_seconds=10, max_steps=4), log=log)
        served = len(srv.requests)
    assert time.monotonic() - t < 8, "took too long"
    assert result.stop.reason is expected, result.stop
    if n_requests is not None:
        assert served == n_requests, (served, result.stop)
    events = read_valid_log(log)
    assert events[-1]["reason"] == str(expected)
    executed = [e for e in events if e["event"] == "result" and e["decision"] == "executed"]
    if expected is not S.FINAL_ANSWER:
        assert not executed, "a broken reply must never run a call"
    if case.startswith("anonymous_call"):
        (call,) = [e for e in events if e["event"] == "call"]
        assert (call["name"], call["tool_call_id"], json.loads(call["raw_arguments"])) == \
            ("read_file", "call_0", {"path": "notes.txt"})
        assert executed and "remember the milk" in executed[0]["content"]


def test_an_incomplete_stream_keeps_its_partial_text_in_the_log(tmp_path: Path):
    log = tmp_path / "run.jsonl"
    with FakeServer([{"fault": "missing_done", "chunks": CHUNKS[:2]}]) as srv, \
            OpenAIModel(srv.base_url, "fake", stream=True) as model:
        result = run("x", model=model, log=log)
    assert result.stop.reason is S.INCOMPLETE_STREAM and result.partial_text == "partial"
    reply = [e for e in read_valid_log(log) if e["event"] == "reply"][0]
    assert reply["complete"] is False and "without [DONE]" in reply["problem"]
