"""Every request is bounded (issue 15, part 2), seen in the request bodies a real loopback HTTP
server (FakeServer) received: `tool_choice` goes with tools (the user's wins), every request carries
`max_tokens` = min(what is left of max_completion_tokens, max_tokens_per_request, the user's own),
streams ask for their usage, an under-reported completion is charged at the reply's own size (and
the log says so), and a reply that generated nothing is charged nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _wire_support import load_exchanges, wire_files

from loopfence import Limits, StopReason, run, tool
from loopfence._commands.run import params_from_flags
from loopfence._commands._common import UsageError
from loopfence._limits import parse_limit
from loopfence._messages import Reply, Usage
from loopfence._state import LEAN_UNITS_PER_TOKEN, generated_text, least_tokens
from loopfence.cli import cli
from loopfence.models._openai import OpenAIModel
from loopfence.models._stream import assemble_sse, reply_from_response
from loopfence.runlog import replay
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

PROSE = ("The fence held, the loop ended, and every call that was asked for was either run once or "
         "answered with a reason. ") * 40  # ~4,300 characters: well over a thousand tokens of text


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _run(srv: FakeServer, tmp_path: Path, *, tools: Any = (lookup,), stream: bool = False,
         name: str = "run", model: OpenAIModel | None = None, **kwargs: Any) -> tuple[Any, list[dict]]:
    log = tmp_path / f"{name}.jsonl"
    with model or OpenAIModel(srv.base_url, "fake", stream=stream, max_retries=0) as m:
        result = run("look it up", model=m, tools=tools, log=log, **kwargs)
    events = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return result, events


def _replies(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "reply"]


# -- tool_choice -----------------------------------------------------------------------------------
def test_tool_choice_auto_goes_with_tools_and_not_without(tmp_path: Path) -> None:
    with FakeServer([text_reply("done")]) as srv:
        _run(srv, tmp_path, name="with")
        _run(srv, tmp_path, tools=(), name="without")
    with_tools, without = srv.requests
    assert with_tools["tools"] and with_tools["tool_choice"] == "auto"
    assert "tools" not in without and "tool_choice" not in without


@pytest.mark.parametrize("choice", ["none", "required",
                                    {"type": "function", "function": {"name": "lookup"}}])
def test_the_users_tool_choice_wins(tmp_path: Path, choice: Any) -> None:
    with FakeServer([text_reply("done")]) as srv:
        _run(srv, tmp_path, params={"tool_choice": choice})
        _run(srv, tmp_path, name="extra",  # the adapter's extra_params are the user's too
             model=OpenAIModel(srv.base_url, "fake", max_retries=0, extra_params={"tool_choice": choice}))
    assert [r["tool_choice"] for r in srv.requests] == [choice, choice]


def test_a_tool_choice_of_none_sends_none(tmp_path: Path) -> None:
    with FakeServer([text_reply("done")]) as srv:
        _run(srv, tmp_path, params={"tool_choice": None})
        _run(srv, tmp_path, name="model", model=OpenAIModel(srv.base_url, "fake", tool_choice=None))
    assert all("tool_choice" not in r and r["tools"] for r in srv.requests)


def test_cli_param_sets_tool_choice(tmp_path: Path) -> None:
    log = tmp_path / "cli.jsonl"
    with FakeServer([text_reply("done")]) as srv:
        code = cli(["run", "say done", "--base-url", srv.base_url, "--model", "fake", "--quiet",
                    "--workspace", str(tmp_path), "--log", str(log), "--param", "tool_choice=none",
                    "--param", "temperature=0"])
    assert code == 0
    body = srv.requests[0]
    assert body["tools"] and body["tool_choice"] == "none" and body["temperature"] == 0
    header = json.loads(log.read_text(encoding="utf-8").splitlines()[0])
    assert header["params"] == {"tool_choice": "none", "temperature": 0}  # recorded, so replay sends it


def test_params_from_flags() -> None:
    assert params_from_flags(["tool_choice=auto", "max_tokens=256", "seed=-1", "stop=[\"\\n\"]",
                              'tool_choice={"type": "function", "function": {"name": "f"}}',
                              "x=NaN"]) == {
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "max_tokens": 256, "seed": -1,
        "stop": ["\n"], "x": "NaN"}
    for bad in ("tool_choice", "=1", "stream=true", "messages=[]"):
        with pytest.raises(UsageError):
            params_from_flags([bad])


# -- max_tokens ------------------------------------------------------------------------------------
def _call(key: str, completion: int) -> dict[str, Any]:
    return calls_reply(tool_call("lookup", key=key), usage=(50, completion))


def test_max_tokens_is_the_smaller_of_the_budget_left_and_the_per_request_cap(tmp_path: Path) -> None:
    replies = [_call("a", 500), _call("b", 350), _call("c", 100), text_reply("done", usage=(50, 5))]
    with FakeServer(replies) as srv:
        result, events = _run(srv, tmp_path, limits=Limits(max_completion_tokens=1000,
                                                           max_tokens_per_request=300))
    assert result.stop.reason is StopReason.FINAL_ANSWER, result.stop
    # 1000 left > 300: the cap; 500 left: the cap; 150 left: 150; 50 left: 50
    assert [r["max_tokens"] for r in srv.requests] == [300, 300, 150, 50]
    assert "max_completion_tokens" not in srv.requests[0]
    assert [e["params"] for e in events if e["event"] == "request"] == [{}] * 4  # params as given


def test_the_users_max_tokens_wins_when_smaller_and_keeps_its_name(tmp_path: Path) -> None:
    replies = [_call("a", 900), text_reply("done", usage=(50, 5))]
    with FakeServer(replies) as srv:
        _run(srv, tmp_path, params={"max_tokens": 200}, limits=Limits(max_completion_tokens=2000))
    assert [r["max_tokens"] for r in srv.requests] == [200, 200]
    with FakeServer(replies) as srv:
        _run(srv, tmp_path, name="newer", params={"max_completion_tokens": 5000},
             limits=Limits(max_completion_tokens=None, max_tokens_per_request=700))
    assert [r["max_completion_tokens"] for r in srv.requests] == [700, 700]  # the name given, capped
    assert all("max_tokens" not in r for r in srv.requests)


@pytest.mark.parametrize("given", [0, -1, "64", 12.5, True])
def test_a_users_max_tokens_that_is_no_cap_gets_the_runs_bound(tmp_path: Path, given: Any) -> None:
    # llama.cpp reads 0 or -1 as "no limit": never sent as given
    with FakeServer([text_reply("done")]) as srv:
        _run(srv, tmp_path, params={"max_tokens": given}, limits=Limits(max_tokens_per_request=123))
    assert srv.requests[0]["max_tokens"] == 123


def test_a_users_max_tokens_over_the_budget_left_is_stopped_before_sending(tmp_path: Path) -> None:
    # the completion guard reserves the user's max_tokens: 900 used + 200 > 1000 is not sent
    with FakeServer([_call("a", 900), text_reply("done")]) as srv:
        result, _ = _run(srv, tmp_path, params={"max_tokens": 200}, limits=Limits(max_completion_tokens=1000))
    assert result.stop.reason is StopReason.MAX_COMPLETION_TOKENS and srv.served == 1


def test_a_spent_completion_budget_stops_before_sending(tmp_path: Path) -> None:
    with FakeServer([_call("a", 1000), text_reply("done")]) as srv:
        result, _ = _run(srv, tmp_path, limits=Limits(max_completion_tokens=1000))
    assert result.stop.reason is StopReason.MAX_COMPLETION_TOKENS
    assert srv.served == 1  # never a request with max_tokens 0 (llama.cpp reads 0 as "no limit")
    assert result.stop.data["value"] == 1000


def test_unlimited_everywhere_sends_no_max_tokens(tmp_path: Path) -> None:
    with FakeServer([text_reply("done")]) as srv:
        _run(srv, tmp_path, limits=Limits(max_completion_tokens=None, max_tokens_per_request=None))
    assert "max_tokens" not in srv.requests[0] and "max_completion_tokens" not in srv.requests[0]


def test_the_default_per_request_cap_bounds_every_request(tmp_path: Path) -> None:
    with FakeServer([text_reply("done")]) as srv:
        _run(srv, tmp_path, limits=Limits(max_completion_tokens=None))
    assert srv.requests[0]["max_tokens"] == Limits().max_tokens_per_request == 4096


def test_the_limit_is_declared_like_the_others() -> None:
    assert Limits().to_json()["max_tokens_per_request"] == 4096
    assert Limits.from_json({"max_tokens_per_request": None}).max_tokens_per_request is None
    assert parse_limit("max_tokens_per_request=512") == ("max_tokens_per_request", 512)
    assert parse_limit("max_tokens_per_request=none") == ("max_tokens_per_request", None)
    for bad in ("max_tokens_per_request=0", "max_tokens_per_request=1.5", "max_tokens_per_request=-3"):
        with pytest.raises(ValueError):
            parse_limit(bad)


def test_cli_limit_sets_the_cap(tmp_path: Path) -> None:
    with FakeServer([text_reply("done")]) as srv:
        assert cli(["run", "say done", "--base-url", srv.base_url, "--quiet", "--workspace", str(tmp_path),
                    "--log", str(tmp_path / "l.jsonl"), "--limit", "max_tokens_per_request=99"]) == 0
    assert srv.requests[0]["max_tokens"] == 99


# -- what is charged -------------------------------------------------------------------------------
def test_an_under_reported_completion_is_charged_at_the_replys_own_size_and_logged(tmp_path: Path) -> None:
    replies = [calls_reply(tool_call("lookup", key="a"), usage=(40, 30)),  # honest
               text_reply(PROSE, usage=(60, 24))]  # ~4,300 characters "in 24 tokens"
    with FakeServer(replies) as srv:
        result, events = _run(srv, tmp_path)
    assert result.stop.reason is StopReason.FINAL_ANSWER
    honest, low = _replies(events)
    assert honest["usage"] == {"prompt_tokens": 40, "completion_tokens": 30, "reported": True}
    floor = least_tokens(PROSE)
    assert floor > 24 * 20  # not a rounding matter
    assert low["usage"] == {"prompt_tokens": 60, "completion_tokens": floor, "reported": True,
                            "charged": "estimate", "completion_reported": 24}
    assert result.ledger.completion_tokens == 30 + floor
    assert events[-1]["per_step"] == [[40, 30], [60, floor]]
    assert cli(["reconcile", str(tmp_path / "run.jsonl")]) == 0
    report = replay(tmp_path / "run.jsonl")  # the same charge, the same note: the log replays
    assert report.ok, report.divergence and report.divergence.describe()


def test_an_under_reported_completion_counts_against_the_budget(tmp_path: Path) -> None:
    replies = [calls_reply(tool_call("lookup", key=PROSE), usage=(40, 3)), text_reply("done", usage=(50, 2))]
    with FakeServer(replies) as srv:
        result, events = _run(srv, tmp_path, limits=Limits(max_completion_tokens=3000))
    charged = _replies(events)[0]["usage"]["completion_tokens"]
    assert charged == least_tokens("lookup" + json.dumps({"key": PROSE})) > 3
    assert srv.requests[1]["max_tokens"] == 3000 - charged  # the next request gets what is left


def test_honest_reports_are_never_raised() -> None:
    """Every reply in the recorded wire captures (real providers) reported at least the floor."""
    seen = 0
    for f in wire_files():
        for ex in load_exchanges(f):
            if ex.status != 200:
                continue
            try:
                reply = assemble_sse(ex.body) if ex.streamed else reply_from_response(ex.body)
            except Exception:  # noqa: BLE001 - error exchanges are other tests' business
                continue
            if reply.usage is None or reply.usage.completion_tokens is None:
                continue
            seen += 1
            assert least_tokens(generated_text(reply)) <= reply.usage.completion_tokens, (f, ex.n)
    assert seen >= 30


def test_least_tokens() -> None:
    assert least_tokens("") == 0
    assert least_tokens("x" * LEAN_UNITS_PER_TOKEN * 10) == 10
    assert least_tokens(" " * 10_000) == 0  # a run of spaces can be one token
    reply = Reply("hi", (), "stop", Usage(1, 1))
    assert generated_text(reply) == "hi"


# -- streams ---------------------------------------------------------------------------------------
def test_a_stream_asks_for_its_usage(tmp_path: Path) -> None:
    with FakeServer([text_reply("done", usage=(10, 2))]) as srv:
        _, events = _run(srv, tmp_path, stream=True, params={"stream_options": {"include_usage": False}})
        _run(srv, tmp_path, name="plain")
    streamed, plain = srv.requests
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    assert "stream_options" not in plain and "stream" not in plain
    assert _replies(events)[0]["usage"] == {"prompt_tokens": 10, "completion_tokens": 2, "reported": True}


def test_a_stream_without_usage_is_charged_an_estimate_logged_as_one(tmp_path: Path) -> None:
    chunks = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "done"}}]},
              {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    with FakeServer([{"chunks": chunks, "done": True}]) as srv:
        result, events = _run(srv, tmp_path, stream=True)
    usage = _replies(events)[0]["usage"]
    assert usage["reported"] is False and "charged" not in usage
    assert 0 < usage["completion_tokens"] == result.ledger.completion_tokens


def test_a_zero_chunk_stream_is_charged_zero_completion_tokens(tmp_path: Path) -> None:
    # llama-cpp-python's server answers a streamed tool_choice "auto" with an empty event stream
    with FakeServer([{"fault": "empty_stream"}]) as srv:
        result, events = _run(srv, tmp_path, stream=True)
    assert result.stop.reason is StopReason.INCOMPLETE_STREAM
    reply = _replies(events)[0]
    assert reply["raw"]["stream"]["chunks"] == 0
    assert reply["usage"]["completion_tokens"] == 0 and reply["usage"]["reported"] is False
    assert result.ledger.completion_tokens == 0 and events[-1]["per_step"][0][1] == 0
    assert srv.requests[0]["tool_choice"] == "auto" and srv.requests[0]["stream_options"]["include_usage"]
    assert cli(["reconcile", str(tmp_path / "run.jsonl")]) == 0
    assert replay(tmp_path / "run.jsonl").ok


def test_an_older_log_without_the_new_limit_still_replays(tmp_path: Path) -> None:
    with FakeServer([_call("a", 20), text_reply("done", usage=(50, 5))]) as srv:
        _run(srv, tmp_path)
    lines = (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    del header["limits"]["max_tokens_per_request"]  # as a log written before the limit existed
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    report = replay(old)
    assert report.ok, report.divergence and report.divergence.describe()
