"""The OpenAI Responses wire (issue 56): `POST /v1/responses` through `loopfence proxy`, a real process,
in front of a real upstream on 127.0.0.1 that speaks the same wire, streamed and not: the bench's
scripts over raw HTTP (the whole input each turn, `store: false`, as Codex sends it), a stream cut
inside a function call, the stop's shape, hostile input in OpenAI's error shape, never forwarded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _proxy_support import (HONEST, RUNAWAY, Proxy, bench_run_ended, reconciles, replays, reset_all, stops_at_the_minimum,
                            wire_proxy)
from _responses_support import ResponsesReplies, ResponsesScripts, converse, post_responses, response_events, to_response
from bench.common import Workspace

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with wire_proxy(ResponsesScripts(), "responses", tmp_path_factory.mktemp("responses")) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("script", RUNAWAY + HONEST, ids=lambda s: s.name)
def test_the_bench_scripts_over_the_responses_wire(wire: Any, script: Any, stream: bool) -> None:
    up, proxy, logs = wire
    with Workspace() as ws:
        ended = converse(proxy.base_url, script.name, ws, tag=f"r-{stream}", stream=stream)
    bench_run_ended(script, ended, logs, "responses")


EXEC = {"type": "function", "name": "exec_command", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
OTHERS = [{"type": "web_search"}, {"type": "custom", "name": "apply_patch", "description": "a patch"}]


def test_a_stream_cut_inside_a_function_call_is_incomplete_stream(tmp_path: Path) -> None:
    cut = {"sse": response_events(to_response(calls_reply(tool_call("exec_command", {"cmd": "ls"}, id="call_1"))),
                                  cut_in_call=True)}
    with ResponsesReplies(lambda body: cut) as up, \
            Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r, resp = post_responses(proxy.base_url, {"model": "m", "stream": True, "tools": [EXEC, *OTHERS],
                                                  "input": "list the files"})
    assert r.headers["x-loopfence-stop"] == "incomplete_stream"
    assert [it["type"] for it in resp["output"]] == ["message"]
    assert resp["output"][0]["content"][0]["text"].startswith(STOP_MARKER)
    assert resp["events"][0] == "response.created" and resp["events"][-1] == "response.completed"


def test_a_stop_is_a_message_then_completed_and_error_mode_is_openais_400(tmp_path: Path) -> None:
    again = calls_reply(tool_call("exec_command", {"cmd": "cat status"}, id="call_x"))
    for mode in ("answer", "error"):
        with ResponsesReplies(lambda body: again) as up, \
                Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path / mode), "--on-stop", mode,
                      stderr=tmp_path / "err") as proxy:
            items: list[dict[str, Any]] = [{"role": "user", "content": f"wait for status ({mode})"},
                                           {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e=="}]
            for turn in range(5):
                r, resp = post_responses(proxy.base_url, {"model": "m", "tools": [EXEC, *OTHERS], "input": items,
                                                          "stream": turn % 2 == 1, "store": False})
                if "x-loopfence-stop" in r.headers:
                    break
                call = next(it for it in resp["output"] if it["type"] == "function_call")
                items += [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "pending"}]
            assert r.headers["x-loopfence-stop"] == "repeated_call" and len(up.requests) == 3
            assert up.requests[1]["input"][1] == {"type": "reasoning", "id": "rs_1", "summary": [],
                                                  "encrypted_content": "e=="}  # passed on untouched
            if mode == "answer":
                assert r.status_code == 200 and [it["type"] for it in resp["output"]] == ["message"]
                assert resp["output"][0]["content"][0]["text"].startswith(STOP_MARKER) and resp["status"] == "completed"
            else:
                assert r.status_code == 400 and resp["error"]["type"] == "loopfence_stop"
                assert resp["error"]["code"] == "repeated_call" and STOP_MARKER in resp["error"]["message"]
            reset_all(proxy.base_url)
        for log in (tmp_path / mode).glob("*.jsonl"):
            reconciles(log)


def test_max_output_tokens_is_capped_and_a_custom_tool_call_is_no_unknown_tool(tmp_path: Path) -> None:
    patch = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_p", "name": "apply_patch",
             "input": "*** Begin Patch\n*** End Patch"}
    served = [{"status": 200, "body": {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
                                       "output": [patch], "usage": {"input_tokens": 9, "output_tokens": 3}}},
              {"status": 200, "body": to_response(text_reply("patched"))}]
    with ResponsesReplies(lambda body: served[min(len(body["input"]) - 1, 1)]) as up, \
            Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path), "--limit", "max_tokens_per_request=300",
                  stderr=tmp_path / "err") as proxy:
        r1, resp1 = post_responses(proxy.base_url, {"model": "m", "max_output_tokens": 9000, "tools": [EXEC, *OTHERS],
                                                    "input": [{"role": "user", "content": "patch it"}]})
        assert r1.status_code == 200 and "x-loopfence-stop" not in r1.headers, resp1
        r2, resp2 = post_responses(proxy.base_url, {"model": "m", "tools": [EXEC, *OTHERS], "input": [
            {"role": "user", "content": "patch it"}, patch,
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"}]})
    assert up.requests[0]["max_output_tokens"] == 300 and up.requests[0]["tools"][1] == {"type": "web_search"}
    assert resp1["output"] == [{**patch, "status": "completed"}]  # released in its own item type
    assert r2.status_code == 200 and resp2["output"][0]["content"][0]["text"] == "patched"


@pytest.mark.parametrize(("raw", "field"), [
    (b"not json", None),
    (json.dumps({"model": "m", "input": 5}).encode(), "input"),
    (json.dumps({"input": "hi"}).encode(), "model"),
    (json.dumps({"model": "m", "input": "hi", "max_output_tokens": "9"}).encode(), "max_output_tokens"),
    (json.dumps({"model": "m", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}).encode(),
     "call_id"),
    (json.dumps({"model": "m", "input": "hi", "tools": [{"type": "function"}]}).encode(), "name"),
    (b"[" * 100_000 + b"]" * 100_000, None),
    (json.dumps({"model": "m", "input": "x" * (17 << 20)}).encode(), None),
])
def test_hostile_input_gets_openais_error_shape_and_is_never_forwarded(tmp_path: Path, raw: bytes,
                                                                       field: str | None) -> None:
    with ResponsesReplies(lambda body: text_reply("never")) as up, \
            Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r = httpx.post(f"{proxy.base_url}/responses", content=raw, headers={"content-type": "application/json"},
                       timeout=60)
    assert r.status_code in (400, 413), r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["type"] == "invalid_request_error"
    if field is not None:
        assert field in body["error"]["message"], body
    assert up.requests == []


@pytest.mark.parametrize(("name", "reason"), [("ok_forever", "repeated_result"), ("paging_5", "ship"),
                                              ("polling_8", "ship")])  # the scripts whose calls fit its strict schemas
def test_the_agents_sdk_default_responses_model(wire: Any, name: str, reason: str | None) -> None:
    """The OpenAI Agents SDK with its default model (Responses), pointed at the proxy by its default
    client: a runaway stops at the rules' minimum, a legitimate run finishes."""
    import asyncio

    import openai

    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # its exporter would call the OpenAI platform (loopback only here)
    up, proxy, logs = wire
    from agents.models import _openai_shared as shared  # the SDK's defaults: put back after the test

    was = shared.get_default_openai_client(), shared.get_use_responses_by_default()
    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-client"),
                                     use_for_tracing=False)
    agents.set_default_openai_api("responses")
    before = set(logs.glob("*.jsonl"))
    try:
        with Workspace() as ws:
            agent = agents.Agent(name="proxy", instructions="Use the tools.", model="fake",
                                 tools=[agents.function_tool(fn) for fn in ws.tools.values()])
            output = str(asyncio.run(agents.Runner.run(agent, f"Run the bench script {name}. sdk",
                                                       max_turns=50)).final_output)
            executions = ws.executions
    finally:
        shared.set_default_openai_client(was[0])
        shared.set_use_responses_by_default(was[1])
    new = set(logs.glob("*.jsonl")) - before
    assert len(new) == 1, new
    log = new.pop()
    if reason == "ship":
        script = next(s for s in HONEST if s.name == name)
        assert output == script.turn(executions) and read_log(log).stop.reason == "final_answer"
    else:
        stop = read_log(log).stop
        assert stop is not None and output.startswith(STOP_MARKER)
        stops_at_the_minimum(name, executions, str(stop.reason))
    reconciles(log)
    replays(log)


def test_previous_response_id_continues_the_run_its_response_belongs_to(tmp_path: Path) -> None:
    """A client that keeps its conversation on the server sends only the new items and names the
    response it follows: that response's run goes on (its repetition counts with it), and the id it
    names is the upstream's own, so the upstream finds its state too."""
    made = []

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        resp = {**to_response(calls_reply(tool_call("exec_command", {"cmd": "cat status"}, id=f"call_{len(made)}"))),
                "id": f"resp_{len(made)}"}
        made.append(body)
        return {"status": 200, "body": resp}

    with ResponsesReplies(reply) as up, \
            Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        r, resp = post_responses(proxy.base_url, {"model": "m", "tools": [EXEC], "input": "wait for status"})
        seen = [r]
        for _ in range(3):
            call = next(it for it in resp["output"] if it["type"] == "function_call")
            r, resp = post_responses(proxy.base_url, {"model": "m", "tools": [EXEC], "previous_response_id": resp["id"],
                                                      "input": [{"type": "function_call_output", "call_id": call["call_id"],
                                                                 "output": "pending"}]})
            seen.append(r)
            if "x-loopfence-stop" in r.headers:
                break
    assert [m.get("previous_response_id") for m in made] == [None, "resp_0", "resp_1"]  # the upstream's own ids
    assert len({r.headers["x-loopfence-run"] for r in seen}) == 1
    assert seen[-1].headers.get("x-loopfence-stop") == "repeated_call" and len(seen) == 3
