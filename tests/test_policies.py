"""Issue 19: a cost budget, one nudge before a repetition stop, a last answer on a budget stop.

Each run writes its log to a file (the suite's conftest checks every written line against the
published event schema), and the logs are reconciled and replayed where the policy must survive both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from loopfence import Limits, Policy, Reply, Request, ScriptedModel, StopReason, Verdict, run, tool
from loopfence._guards import CostLimit
from loopfence._prices import Price, PriceBook, PriceError, load_prices
from loopfence._state import RunState
from loopfence.cli import cli
from loopfence.runlog import read_log, reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import Registry

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the bench's scripts and its loopfence adapter
    sys.path.insert(0, str(ROOT))

from bench.common import Workspace  # noqa: E402
from bench.frameworks import loopfence_fw  # noqa: E402
from bench.scripts import RUNAWAY  # noqa: E402


def ping(n: int = 0) -> str:
    return "pong"


def record(note: str) -> str:
    return "ok"


TOOLS = [tool(ping), tool(record)]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def checked(path: Path) -> list[dict[str, Any]]:
    """The log's lines, after reconcile and replay both pass on it."""
    rec = reconcile(path)
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    rep = replay(path)
    assert rep.ok, rep.divergence.describe() if rep.divergence else rep.past_end
    return lines(path)


class Named(ScriptedModel):
    """A scripted model whose describe() names a model (as an endpoint adapter's does)."""

    def __init__(self, name: str, replies: list[dict[str, Any]], **kw: Any) -> None:
        super().__init__(replies, **kw)
        self.name = name

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": self.name}


# ------------------------------------------------------------------------------------------ cost
def test_a_cost_budget_stops_before_the_request_that_would_cross_it(tmp_path: Path) -> None:
    """Output at $10/MTok, 100 completion tokens a reply and 100 reserved a request: $0.001 each.
    Three requests fit $0.0035 ($0.003 spent + $0.001 reserved would not): the fourth is never sent."""
    log = tmp_path / "cost.jsonl"
    model = ScriptedModel([calls_reply(tool_call("ping", n=i), usage=(500, 100)) for i in range(10)])
    result = run("t", model=model, tools=TOOLS, log=log, prices={"*": (0.0, 10.0)},
                 limits=Limits(max_cost_usd=0.0035, max_tokens_per_request=100))
    assert result.stop.reason is StopReason.MAX_COST_USD and result.verdict is Verdict.KILL
    assert model.served == 3 == result.ledger.model_requests  # the fourth was never sent
    assert result.ledger.cost_usd == pytest.approx(0.003)
    assert "max_cost_usd=0.0035" in result.stop.detail and "not sent" in result.stop.detail
    data = dict(result.stop.data)
    assert data.pop("prompt_estimate") > 500  # the unsent prompt: the last one counted (500), and more
    assert data == {"limit": 0.0035, "value": pytest.approx(0.004)}
    events = checked(log)
    assert events[0]["prices"]["table"] == {"*": [0.0, 10.0]}
    costs = [e["usage"]["cost_usd"] for e in events if e["event"] == "reply"]
    assert costs == [pytest.approx(0.001)] * 3
    assert events[-1]["ledger"]["cost_usd"] == pytest.approx(0.003)  # dollars next to tokens


def test_the_cost_check_counts_the_prompt_estimate_and_the_reserved_output() -> None:
    s = RunState(Limits(max_cost_usd=1.0, max_tokens_per_request=1000), Policy(), Registry([]),
                 messages=[{"role": "user", "content": "x" * 4000}])
    s.price = Price("m", 100.0, 200.0, "prices")
    est = s.next_prompt_estimate()
    s.ledger.cost_usd = 1.0 - (est * 100.0 + 1000 * 200.0) / 1e6  # exactly what the next request may cost
    assert CostLimit(1.0).before_request(s) is None
    s.ledger.cost_usd += 1e-6
    stop = CostLimit(1.0).before_request(s)
    assert stop is not None and stop.reason is StopReason.MAX_COST_USD
    assert f"~{est} tokens" in stop.detail and "1000 reserved completion tokens" in stop.detail
    assert CostLimit(None).before_request(s) is None


def test_an_unknown_model_with_a_cost_budget_is_refused_at_start(tmp_path: Path) -> None:
    log = tmp_path / "never.jsonl"
    model = Named("no-such-model-19", [text_reply("x")])
    with pytest.raises(PriceError) as err:
        run("t", model=model, log=log, limits=Limits(max_cost_usd=1.0))
    message = str(err.value)
    assert "'no-such-model-19'" in message and "prices=" in message and "--prices" in message
    assert model.served == 0 and not log.exists()  # nothing sent, nothing written
    with pytest.raises(PriceError, match=r"names no model.*'\*'"):  # a model that does not say its name
        run("t", model=ScriptedModel([text_reply("x")]), log=log, limits=Limits(max_cost_usd=1.0))
    result = run("t", model=Named("no-such-model-19", [text_reply("x")]), log=log,  # no budget: runs, no dollars
                 limits=Limits())
    assert result.verdict is Verdict.SHIP and result.ledger.cost_usd is None


def test_genai_prices_price_a_known_model_and_the_user_table_wins(tmp_path: Path) -> None:
    from genai_prices import Usage, calc_price

    expected = float(calc_price(Usage(input_tokens=1000, output_tokens=100), "gpt-4o").total_price)
    replies = [calls_reply(tool_call("ping"), usage=(1000, 100)), text_reply("done", usage=(1000, 100))]
    result = run("t", model=Named("gpt-4o", replies), tools=TOOLS, log=tmp_path / "a.jsonl",
                 limits=Limits(max_cost_usd=5.0))
    assert result.ledger.cost_usd == pytest.approx(2 * expected)
    header = checked(tmp_path / "a.jsonl")[0]
    assert header["prices"]["model"] == "gpt-4o" and header["prices"]["rates"][2].startswith("genai-prices")
    result = run("t", model=Named("gpt-4o", replies), tools=TOOLS, log=tmp_path / "b.jsonl",
                 prices={"gpt-4o": (1.0, 1.0)})  # a table alone counts dollars too
    assert result.ledger.cost_usd == pytest.approx(2 * 1100 / 1e6)
    checked(tmp_path / "b.jsonl")


def test_a_reply_naming_its_model_is_charged_at_that_price(tmp_path: Path) -> None:
    reply = calls_reply(tool_call("ping"), usage=(1_000_000, 0))
    reply["model"] = "cheap"
    result = run("t", model=Named("dear", [reply, text_reply("done", usage=(0, 0))]), tools=TOOLS,
                 log=tmp_path / "r.jsonl", prices={"dear": (5.0, 5.0), "cheap": (1.0, 1.0)})
    assert result.ledger.cost_usd == pytest.approx(1.0)
    checked(tmp_path / "r.jsonl")


def test_price_tables_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    good = tmp_path / "p.toml"
    good.write_text('"gpt-4o" = [2.5, 10]\n"local" = { input = 0, output = 0 }\n"*" = [0.1, 0.4]\n')
    assert load_prices(good) == {"gpt-4o": (2.5, 10.0), "local": (0.0, 0.0), "*": (0.1, 0.4)}
    for bad, why in (({"m": (1, -1)}, "output price must be"), ({"m": (1,)}, "must be \\(input, output\\)"),
                     ({"m": {"input": 1}}, "exactly `input` and `output`"), ({"m": ("a", 1)}, "input price")):
        with pytest.raises(PriceError, match=why):
            load_prices(bad)
    (tmp_path / "broken.toml").write_text("= nope")
    with pytest.raises(PriceError, match="not TOML"):
        load_prices(tmp_path / "broken.toml")
    (tmp_path / "negative.toml").write_text('"*" = [-1, 2]\n')
    with pytest.raises(PriceError, match=r"^prices file .*negative\.toml: '\*' input price must be"):
        load_prices(tmp_path / "negative.toml")  # a value the file holds: the file is named
    assert PriceBook({"*": (1.0, 2.0)}).price("anything-19") == Price("anything-19", 1.0, 2.0, "prices:*")
    with pytest.raises(PriceError, match="max_tokens bounded"):
        run("t", model=ScriptedModel([text_reply("x")]), prices={"*": (1, 1)},
            limits=Limits(max_cost_usd=1.0, max_tokens_per_request=None, max_completion_tokens=None))


def test_the_run_command_takes_a_prices_file_and_shows_dollars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text("\n".join(json.dumps(calls_reply(tool_call("list_dir", path="."), usage=(1000, 50)))
                                for _ in range(1)) + "\n")
    prices = tmp_path / "prices.toml"
    prices.write_text('"*" = [2.0, 8.0]\n')
    log = tmp_path / "run.jsonl"
    code = cli(["run", "t", "--script", str(script), "--workspace", str(tmp_path), "--log", str(log),
                "--prices", str(prices), "--limit", "max_cost_usd=1"])  # (--quiet prints no summary)
    err = capsys.readouterr().err
    assert code == 1 and "no_progress" in err  # the same listing twice
    assert "│ cost" in err and "$0.004800" in err  # (1000 x $2 + 50 x $8) per million, twice
    assert lines(log)[-1]["ledger"]["cost_usd"] == pytest.approx(0.0048)
    prices.write_text('"gpt-19-nonexistent" = [1, 1]\n')
    code = cli(["run", "t", "--script", str(script), "--workspace", str(tmp_path), "--log",
                str(tmp_path / "no.jsonl"), "--prices", str(prices), "--limit", "max_cost_usd=0.01"])
    err = capsys.readouterr().err
    assert code == 2 and "has no known price" in err and not (tmp_path / "no.jsonl").exists()


# ----------------------------------------------------------------------------------------- nudge
@pytest.mark.parametrize("name", ["retry_storm", "duplicate_args", "ok_forever", "unknown_tool",
                                  "truncated_json"])
def test_a_nudge_costs_at_most_one_request_and_no_execution_on_the_runaways(name: str) -> None:
    script = next(s for s in RUNAWAY if s.name == name)
    outcomes = {}
    for nudge in (False, True):
        with Workspace() as ws:
            outcomes[nudge] = loopfence_fw.run_script(script, ws, cap=200, nudge=nudge)
            log = ws.root / "loopfence-run.jsonl"
            events = checked(log)
            assert sum(e["event"] == "nudge" for e in events) <= int(nudge)
    off, on = outcomes[False], outcomes[True]
    assert on.executions == off.executions
    assert off.model_calls <= on.model_calls <= off.model_calls + 1
    assert on.ended.endswith("(KILL)") and on.answer is None


class Recovering:
    """Asks for `call` until it is told what happened (a nudge in the newest messages), then answers."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.requests: list[Request] = []

    def complete(self, request: Request) -> Reply:
        self.requests.append(request)
        told = any("loopfence:" in str(m.get("content") or "") for m in request.messages[-2:])
        return Reply.from_response(text_reply("changed course") if told else
                                   calls_reply(tool_call(*self.call(len(self.requests)))))

    def describe(self) -> dict[str, Any]:
        return {"kind": "recovering"}


@pytest.mark.parametrize("call, stop", [
    (lambda i: ("ping", {"n": 1}), StopReason.REPEATED_CALL),  # the same call, nothing changed
    (lambda i: ("record", {"note": f"step {i}"}), StopReason.REPEATED_RESULT),  # fresh calls, one result
])
def test_a_recovering_model_ships_with_a_nudge_and_is_killed_without(tmp_path: Path, call: Any,
                                                                     stop: StopReason) -> None:
    off = run("t", model=Recovering(call), tools=TOOLS, log=tmp_path / "off.jsonl")
    assert off.stop.reason is stop and off.ledger.nudges == 0
    model = Recovering(call)
    on = run("t", model=model, tools=TOOLS, log=tmp_path / "on.jsonl", policy=Policy(nudge=True))
    assert on.stop.reason is StopReason.FINAL_ANSWER and on.final_answer == "changed course"
    assert on.ledger.nudges == 1 and on.ledger.tool_executions <= off.ledger.tool_executions
    events = checked(tmp_path / "on.jsonl")
    nudge = next(e for e in events if e["event"] == "nudge")
    assert nudge["reason"] == str(stop) and nudge["message"].startswith("loopfence: ")
    if stop is StopReason.REPEATED_CALL:  # refused, with the nudge as its one result
        name, args = call(0)
        assert nudge["delivered"] == "refusal" and nudge["key"] == f'{name}:{json.dumps(args, separators=(",", ":"))}'
        result = next(e for e in events if e["event"] == "result" and e["decision"] == "refused")
        assert json.loads(result["content"])["message"] == nudge["message"]
        assert 'ping {"n":1} in 3 replies' in nudge["message"]
        assert on.ledger.tool_executions == off.ledger.tool_executions == 2 and on.ledger.refused == 1
    else:  # after the fifth identical result, one short of the stop: a message after the results
        assert nudge["delivered"] == "message" and nudge["data"]["warning"] is True
        assert model.requests[-1].messages[-1] == {"role": "user", "content": nudge["message"]}
        assert on.ledger.tool_executions == 5 and off.ledger.tool_executions == 6
    earlier = next(e for e in events if e["event"] == "result" and e["decision"] == "executed")
    assert f"fingerprint {earlier['fingerprint']}" in nudge["message"]  # the earlier result, named


def test_there_is_one_nudge_and_the_next_repetition_stops(tmp_path: Path) -> None:
    model = ScriptedModel([calls_reply(tool_call("ping", n=1))])  # never changes course
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "r.jsonl", policy=Policy(nudge=True))
    assert result.stop.reason is StopReason.REPEATED_CALL and result.ledger.nudges == 1
    assert model.served == 4  # one more request than without the nudge (3), no more executions
    assert result.ledger.tool_executions == 2
    checked(tmp_path / "r.jsonl")


def test_reconcile_counts_the_nudges(tmp_path: Path) -> None:
    run("t", model=ScriptedModel([calls_reply(tool_call("ping", n=1))]), tools=TOOLS,
        log=tmp_path / "r.jsonl", policy=Policy(nudge=True))
    events = lines(tmp_path / "r.jsonl")
    events[-1]["ledger"]["nudges"] = 0
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rec = reconcile(tmp_path / "e.jsonl")
    assert {c.name for c in rec.failed} == {"reuses"} and "ledger nudges=0, nudge events: 1" in rec.check("reuses").detail


# ----------------------------------------------------------------------------------- last answer
def _steps(n: int) -> list[dict[str, Any]]:
    return [calls_reply(tool_call("ping", n=i)) for i in range(n)]


def test_a_max_steps_stop_asks_one_last_answer_with_tools_disabled(tmp_path: Path) -> None:
    off_model = ScriptedModel([*_steps(2), text_reply("my best answer")])
    off = run("t", model=off_model, tools=TOOLS, log=tmp_path / "off.jsonl", limits=Limits(max_steps=2))
    assert off.stop.reason is StopReason.MAX_STEPS and off.last_answer is None and off_model.served == 2
    model = ScriptedModel([*_steps(2), text_reply("my best answer")])
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "on.jsonl",
                 limits=Limits(max_steps=2, last_answer_tokens=64), policy=Policy(last_answer=True))
    assert model.served == 3  # exactly one more request
    last = model.requests[-1]
    assert last.params["tool_choice"] == "none" and last.max_tokens == 64
    assert all("tool_choice" not in r.params for r in model.requests[:-1])
    assert result.stop.reason is StopReason.MAX_STEPS and result.verdict is Verdict.KILL
    assert result.last_answer == "my best answer" and result.final_answer is None
    assert result.ledger.model_requests == 3
    events = checked(tmp_path / "on.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[-4:] == ["last_answer", "request", "reply", "stop"]
    assert events[-4]["decision"] == "asked" and events[-3]["params"]["tool_choice"] == "none"
    assert events[-1]["last_answer"] == "my best answer" and events[-1]["final_answer"] is None
    assert "max_steps=2" in last.messages[-1]["content"]
    assert read_log(tmp_path / "on.jsonl").stop.verdict == Verdict.KILL


def test_a_last_answer_that_does_not_fit_is_skipped_and_the_log_says_why(tmp_path: Path) -> None:
    model = ScriptedModel([calls_reply(tool_call("ping", n=i), usage=(10, 10)) for i in range(3)])
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "r.jsonl", policy=Policy(last_answer=True),
                 limits=Limits(max_steps=3, max_completion_tokens=100, last_answer_tokens=80))
    assert result.stop.reason is StopReason.MAX_STEPS and model.served == 3 and result.last_answer is None
    events = checked(tmp_path / "r.jsonl")
    skipped = events[-2]
    assert skipped["event"] == "last_answer" and skipped["decision"] == "skipped"
    assert skipped["reason"] == "max_completion_tokens" and "30 used + 80 reserved" in skipped["detail"]
    model = ScriptedModel([calls_reply(tool_call("ping", n=i), usage=(0, 100)) for i in range(3)])
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "c.jsonl", policy=Policy(last_answer=True),
                 prices={"*": (0.0, 10.0)},
                 limits=Limits(max_steps=3, max_cost_usd=0.0035, max_tokens_per_request=100, last_answer_tokens=80))
    assert result.stop.reason is StopReason.MAX_STEPS and model.served == 3  # $0.003 + $0.0008 > $0.0035
    assert checked(tmp_path / "c.jsonl")[-2]["reason"] == "max_cost_usd"


def test_a_failed_last_answer_keeps_the_stop_and_says_why(tmp_path: Path) -> None:
    model = ScriptedModel(_steps(2), repeat_last=False)  # the third request raises endpoint_error
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "e.jsonl", limits=Limits(max_steps=2),
                 policy=Policy(last_answer=True))
    assert result.stop.reason is StopReason.MAX_STEPS and result.last_answer is None
    events = checked(tmp_path / "e.jsonl")
    assert events[-2]["decision"] == "failed" and events[-2]["reason"] == "endpoint_error"
    model = ScriptedModel(_steps(3))  # ignores tool_choice: its calls are answered, not run
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "t.jsonl", limits=Limits(max_steps=2),
                 policy=Policy(last_answer=True))
    assert result.last_answer is None and result.ledger.tool_executions == 2 and result.ledger.refused == 1
    events = checked(tmp_path / "t.jsonl")
    assert events[-4]["detail"] == "the reply asked for tools (they are not run)"
    assert events[-2]["event"] == "result" and json.loads(events[-2]["content"])["error"] == "not_executed"


def test_a_last_answer_follows_a_repetition_stop_and_not_a_final_answer(tmp_path: Path) -> None:
    model = ScriptedModel([*[calls_reply(tool_call("ping", n=1))] * 3, text_reply("salvaged")])
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "r.jsonl", policy=Policy(last_answer=True))
    assert result.stop.reason is StopReason.REPEATED_CALL and result.last_answer == "salvaged"
    checked(tmp_path / "r.jsonl")
    model = ScriptedModel([text_reply("done")])
    result = run("t", model=model, log=tmp_path / "f.jsonl", policy=Policy(last_answer=True))
    assert model.served == 1 and result.final_answer == "done" and result.last_answer is None
    model = ScriptedModel([calls_reply(tool_call("nope"))])  # unknown_tool: not a budget, no last answer
    result = run("t", model=model, tools=TOOLS, log=tmp_path / "u.jsonl", policy=Policy(last_answer=True))
    assert result.stop.reason is StopReason.UNKNOWN_TOOL and model.served == 1


def test_reconcile_refuses_a_last_answer_no_request_gave(tmp_path: Path) -> None:
    run("t", model=ScriptedModel([*_steps(2), text_reply("real")]), tools=TOOLS, log=tmp_path / "r.jsonl",
        limits=Limits(max_steps=2), policy=Policy(last_answer=True))
    events = lines(tmp_path / "r.jsonl")
    events[-1]["last_answer"] = "edited"
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert {c.name for c in reconcile(tmp_path / "e.jsonl").failed} == {"no_overwritten_answer"}


def test_reconcile_asks_the_ring_whether_the_last_answer_was_due(tmp_path: Path) -> None:
    """The ring, fed the log, weighs the last answer again: under a header whose completion budget
    leaves no room for it, the ring skips it where the log asked it."""
    run("t", model=ScriptedModel([*_steps(2), text_reply("real")]), tools=TOOLS, log=tmp_path / "r.jsonl",
        limits=Limits(max_steps=2), policy=Policy(last_answer=True))
    events = lines(tmp_path / "r.jsonl")
    spent = events[-1]["ledger"]["completion_tokens"]
    events[0]["limits"]["max_completion_tokens"] = spent + 100  # < what the last answer reserves (512)
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rec = reconcile(tmp_path / "e.jsonl")
    assert {c.name for c in rec.failed} == {"limit_reached"}
    assert "the last answer does not follow the ring" in rec.check("limit_reached").detail
    assert '"decision": "skipped"' in rec.check("limit_reached").detail


# ---------------------------------------------------------------------------------------- schema
def test_the_new_events_match_the_published_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["schema", "events"]) == 0
    schema = json.loads(capsys.readouterr().out)
    run("t", model=ScriptedModel([calls_reply(tool_call("ping", n=1))]), tools=TOOLS, log=tmp_path / "a.jsonl",
        policy=Policy(nudge=True, last_answer=True), prices={"*": (1.0, 2.0)})
    events = lines(tmp_path / "a.jsonl")
    kinds = {e["event"] for e in events}
    assert {"nudge", "last_answer"} <= kinds
    for e in events:
        jsonschema.validate(e, schema)
    nudge = next(e for e in events if e["event"] == "nudge")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**nudge, "delivered": "shouted"}, schema)
