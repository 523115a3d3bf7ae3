"""Round trip on real material: recorded provider exchanges -> a scripted run -> a log -> replayed.

The multi-turn captures in the wire fixtures hold real chat.completions responses and, in the
requests that follow them, the tool results the client sent back. Each becomes a scripted run whose
tools answer with those recorded results; the run is logged, reconciled and replayed identically.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, RunLog, ScriptedModel, StopReason, Tool, run
from loopfence._json import canonical_json
from loopfence.runlog import reconcile, replay, to_atif

yaml = pytest.importorskip("yaml")

_HERE = Path(__file__).resolve().parent
WIRE = next((p for p in (_HERE / "data" / "wire", _HERE.parent.parent / "shared" / "fixtures" / "wire")
             if p.is_dir()), _HERE / "data" / "wire")


def _json(body: Any) -> Any:
    if isinstance(body, bytes):
        body = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
        body = body.decode("utf-8")
    return json.loads(body) if isinstance(body, str) else body


def _exchanges(name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request body, response body) of each chat.completions interaction in a cassette."""
    doc = yaml.safe_load((WIRE / name).read_text(encoding="utf-8"))
    out = []
    for it in doc["interactions"]:
        req, resp = it["request"], it["response"]
        if not req["uri"].endswith("/chat/completions"):
            continue  # e.g. Gemini's native API in the same file
        body = req.get("parsed_body") or _json(req["body"])
        answer = resp.get("parsed_body") or _json(resp["body"]["string"])
        out.append((body, answer))
    return out


def _scripted_run(name: str, log: Path) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    exchanges = _exchanges(name)
    first = exchanges[0][0]
    task = [m for m in first["messages"] if m["role"] == "user"][-1]["content"]
    # what the client sent back for each call: (name, canonical arguments) -> tool message content
    calls: dict[str, tuple[str, str]] = {}
    answers: dict[tuple[str, str], str] = {}
    for body, _ in exchanges:
        for m in body["messages"]:
            for c in m.get("tool_calls") or []:
                calls[c["id"]] = (c["function"]["name"], canonical_json(json.loads(c["function"]["arguments"])))
            if m["role"] == "tool":
                answers[calls[m["tool_call_id"]]] = m["content"]

    def make(tool_name: str) -> Any:
        def fn(**kwargs: Any) -> str:
            return answers[(tool_name, canonical_json(kwargs))]
        return fn

    tools = [Tool.from_schema(t["function"]["name"], make(t["function"]["name"]), t["function"]["parameters"],
                              description=t["function"].get("description", ""), kind="read_only")
             for t in first["tools"]]
    model = ScriptedModel([answer for _, answer in exchanges], repeat_last=False)
    result = run(task, model=model, tools=tools, limits=Limits(max_steps=len(exchanges) + 1), log=RunLog(log))
    return result, [body for body, _ in exchanges], model.requests


@pytest.mark.parametrize("name,calls", [
    ("pydantic-ai__test_multiple_agent_tool_calls.yaml", 1),
    ("simonw-llm__test_tool_use_chain_of_two_calls.yaml", 2),
])
def test_recorded_exchanges_round_trip(name: str, calls: int, tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    result, bodies, requests = _scripted_run(name, log)
    assert result.stop.reason is StopReason.FINAL_ANSWER, result.stop.detail
    assert result.ledger.tool_executions == calls and result.ledger.model_requests == len(bodies)
    assert reconcile(log).ok
    report = replay(log)
    assert report.ok, report.lines()
    assert report.replayed is not None and report.replayed.final_answer == result.final_answer
    assert report.replayed.ledger.prompt_tokens == result.ledger.prompt_tokens  # provider usage kept
    trajectory = to_atif(log)
    assert sum(len(s.get("tool_calls", [])) for s in trajectory["steps"]) == calls


def test_the_scripted_run_sent_what_the_client_sent(tmp_path: Path) -> None:
    """simonw/llm's chain: our ring's conversation is the recorded one, message for message."""
    result, bodies, requests = _scripted_run("simonw-llm__test_tool_use_chain_of_two_calls.yaml",
                                             tmp_path / "wire.jsonl")

    def strip(m: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in m.items() if v is not None}
        if "tool_calls" in out:
            out["tool_calls"] = [{"id": c["id"], "type": "function", "name": c["function"]["name"],
                                  "arguments": json.loads(c["function"]["arguments"])}  # llm re-spaces them
                                 for c in out["tool_calls"]]
        return out

    for body, sent in zip(bodies, requests, strict=True):
        assert [strip(m) for m in sent.messages] == [strip(m) for m in body["messages"]]
    assert result.final_answer is not None and result.final_answer.strip() == "YES"


def test_a_replay_of_the_wire_run_notices_a_changed_recorded_answer(tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    _scripted_run("simonw-llm__test_tool_use_chain_of_two_calls.yaml", log)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    reply = [e for e in events if e["event"] == "reply"][1]
    reply["raw"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"population": 1}'
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    report = replay(log)
    assert not report.ok and report.divergence is not None and report.divergence.step == 2


def test_a_recorded_stream_through_the_http_client_round_trips(fake_endpoint: Any, tmp_path: Path) -> None:
    """openai-python's capture of two parallel calls in one stream, served byte for byte over real
    HTTP, assembled by our client, run, logged, replayed: the assembled reply replays identically."""
    from loopfence import tool
    from loopfence.models._openai import OpenAIModel
    from loopfence.testing import text_reply

    def GetWeatherArgs(city: str, country: str, units: str = "c") -> str:  # noqa: N802 - recorded name
        """Weather for a city."""
        return f"sunny in {city}"

    def get_stock_price(ticker: str, exchange: str) -> str:
        """A stock price."""
        return f"{ticker} on {exchange}: 100"

    srv = fake_endpoint({"sse": (WIRE / "openai-python__two_parallel_calls.sse").read_text()},
                        text_reply("Sunny, and AAPL is at 100."))
    log = tmp_path / "stream.jsonl"
    result = run("Weather and a price.", model=OpenAIModel(srv.base_url, "fake", stream=True),
                 tools=[tool(GetWeatherArgs, kind="read_only"), tool(get_stock_price, kind="read_only")],
                 log=RunLog(log))
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.ledger.tool_executions == 2
    assert reconcile(log).ok and replay(log).ok
    calls = to_atif(log)["steps"][1]["tool_calls"]
    assert [c["arguments"] for c in calls] == [{"city": "Edinburgh", "country": "GB", "units": "c"},
                                               {"ticker": "AAPL", "exchange": "NASDAQ"}]
