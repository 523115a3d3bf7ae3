"""Issue 30, items 4 and 5: a bad argument from Python raises before the run starts (no log file, no
model request), naming the argument and what it wants; a cost budget prices by the request's `model`
parameter where the adapter names none, and replay and reconcile charge the run as it was charged.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence import Limits, Reply, ScriptedModel, StopReason, ToolKind, arun, batch, run, stream, tool
from loopfence._prices import PriceError
from loopfence.runlog import LogWriteError, reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call


def ping(n: int = 0) -> str:
    """Ping."""
    return "pong"


def looping() -> ScriptedModel:
    return ScriptedModel([calls_reply(tool_call("ping", n=i)) for i in range(50)])


def raises_before_the_run(error: type[BaseException], match: str, log: Path, **kwargs: Any) -> None:
    """run(), arun() and stream() all raise `error` and leave no log file behind."""
    with pytest.raises(error, match=match):
        run("t", log=log, **kwargs)
    with pytest.raises(error, match=match):
        asyncio.run(arun("t", log=log, **kwargs))
    with pytest.raises(error, match=match):
        list(stream("t", log=log, **kwargs))
    assert not log.exists()


# -- limits= ---------------------------------------------------------------------------------------
def test_a_dict_of_limits_is_the_limits_it_names(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    result = run("t", model=looping(), tools=[tool(ping)], limits={"max_steps": 3, "max_repeats": None}, log=log)
    assert result.stop.reason is StopReason.MAX_STEPS and result.ledger.model_requests == 3
    header = json.loads(log.read_text().splitlines()[0])
    assert header["limits"] == Limits(max_steps=3, max_repeats=None).to_json()  # the rest: the defaults
    assert replay(log).ok and reconcile(log).ok
    result = run("t", model=looping(), tools=[tool(ping)], policy={"nudge": True}, limits={"max_steps": 2})
    assert result.stop.reason is StopReason.MAX_STEPS


names = st.text(st.characters(codec="ascii"), min_size=1, max_size=12).filter(lambda k: k not in Limits.names())


@settings(max_examples=40, deadline=None)
@given(st.lists(names, min_size=1, max_size=3, unique=True), st.sampled_from(Limits.names()))
def test_every_unknown_limit_is_named_before_the_run(unknown: list[str], known: str) -> None:
    model = ScriptedModel([text_reply("x")])
    with pytest.raises(ValueError) as err:
        run("t", model=model, limits={known: None if known != "no_progress" else True, **dict.fromkeys(unknown, 1)})
    message = str(err.value)
    assert message.startswith("limits: unknown field")
    assert all(repr(k) in message for k in unknown) and f"known: {', '.join(Limits.names())}" in message
    assert model.served == 0


def test_limits_of_another_type_is_a_type_error_naming_limits(tmp_path: Path) -> None:
    model = ScriptedModel([text_reply("x")])
    raises_before_the_run(TypeError, r"^limits must be a Limits or a dict of its fields.*got int", tmp_path / "l.jsonl",
                          model=model, limits=3)
    raises_before_the_run(ValueError, r"^limit max_steps must be a number", tmp_path / "l.jsonl",
                          model=model, limits={"max_steps": "3"})
    raises_before_the_run(TypeError, r"^policy must be a Policy", tmp_path / "l.jsonl", model=model, policy="feedback")
    assert model.served == 0


# -- model= ----------------------------------------------------------------------------------------
def test_a_model_name_for_model_is_refused_saying_what_to_pass(tmp_path: Path) -> None:
    raises_before_the_run(TypeError, r"model= takes a model adapter, not a name.*OpenAIModel\(base_url=.*"
                          r"model='gpt-4o'\)", tmp_path / "m.jsonl", model="gpt-4o")
    raises_before_the_run(TypeError, r"model= must have complete\(request\) or async acomplete\(request\).*"
                          r"got dict", tmp_path / "m.jsonl", model={"model": "gpt-4o"})


# -- ScriptedModel ---------------------------------------------------------------------------------
def test_a_scripted_reply_that_is_not_a_response_object_is_refused_by_its_position() -> None:
    with pytest.raises(TypeError, match=r"^scripted reply 1 is not a chat.completions response object .* got str "
                       r"'hi'; for a text reply: loopfence.testing.text_reply"):
        ScriptedModel(["hi"])
    with pytest.raises(TypeError, match=r"^scripted reply 3 .* got int 42$"):
        ScriptedModel([text_reply("a"), Reply.from_response(text_reply("b")), 42])
    with pytest.raises(TypeError, match=r"takes a list of replies, got one dict"):
        ScriptedModel(text_reply("a"))  # type: ignore[arg-type]
    broken = ScriptedModel([{"choices": []}])  # a malformed response object: an endpoint's fault, served as one
    assert run("t", model=broken).stop.reason is StopReason.ENDPOINT_ERROR


# -- tool() ----------------------------------------------------------------------------------------
def test_a_tool_without_a_valid_name_is_refused_suggesting_name() -> None:
    with pytest.raises(ValueError, match=r"tool name '<lambda>' is not a valid function name .*name="):
        tool(lambda x: x)
    assert tool(lambda x: x, name="echo").name == "echo"
    with pytest.raises(ValueError, match="tool name 'read file' is not a valid"):
        tool(ping, name="read file")


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(codec="ascii"), max_size=70) | st.text(max_size=4))
def test_a_tool_name_is_taken_exactly_when_openai_takes_it(name: str) -> None:
    valid = re.fullmatch(r"^[a-zA-Z0-9_-]{1,64}$", name) is not None
    try:
        made = tool(ping, name=name)
    except ValueError as exc:
        assert not valid and repr(name) in str(exc)
    else:
        assert valid and made.name == name


def test_an_unknown_kind_lists_the_kinds() -> None:
    with pytest.raises(ValueError, match=r"^tool kind must be one of 'read_only', 'side_effect', 'poll', got "
                       r"'readonly'$"):
        tool(ping, kind="readonly")
    with pytest.raises(ValueError, match="one of 'read_only', 'side_effect', 'poll'"):
        tool(kind="readonly")  # as a decorator: at once, not when it is applied
    assert tool(ping, kind="poll").kind is ToolKind.POLL


# -- log= ------------------------------------------------------------------------------------------
def test_a_log_that_cannot_be_opened_is_a_log_write_error_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    for bad in ("/proc/nope/x.jsonl", str(tmp_path / "a-file" / "run.jsonl"), str(tmp_path)):
        model = ScriptedModel([text_reply("x")])
        with pytest.raises(LogWriteError, match=f"^cannot open the run log {re.escape(bad)}: .* \\(nothing was run\\)$"):
            run("t", model=model, log=bad)
        assert model.served == 0


# -- FenceCapability(kinds=) -----------------------------------------------------------------------
def test_a_fence_kind_for_a_tool_the_agent_lacks_is_refused_before_any_request(tmp_path: Path) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from loopfence.integrations.pydantic_ai import FenceCapability

    asked: list[Any] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        asked.append(messages)
        return ModelResponse(parts=[TextPart("done")])

    def read_file(path: str) -> str:
        """Read a file."""
        return "x"

    log = tmp_path / "run.jsonl"
    fence = FenceCapability(kinds={"read_fil": "read_only"}, log=str(log))
    agent = Agent(FunctionModel(respond), tools=[read_file], capabilities=[fence])
    with pytest.raises(ValueError, match=r"kinds= names 'read_fil', which no tool of this run has \(its tools: "
                       r"read_file\)"):
        agent.run_sync("Read a.py")
    assert not asked and not log.exists()
    fence = FenceCapability(kinds={"read_file": "read_only"}, log=str(log))
    assert Agent(FunctionModel(respond), tools=[read_file], capabilities=[fence]).run_sync("t").output == "done"


# -- the cost budget's price: the request's model --------------------------------------------------
def test_a_cost_budget_prices_the_model_the_params_name_and_replay_agrees(tmp_path: Path) -> None:
    from genai_prices import Usage, calc_price

    mini = "gpt-4o-mini"
    replies = [{**calls_reply(tool_call("ping"), usage=(1000, 100)), "model": mini},
               {**text_reply("done", usage=(1000, 100)), "model": mini}]
    log = tmp_path / "a.jsonl"
    result = run("t", model=ScriptedModel(replies), tools=[tool(ping)], params={"model": mini},
                 limits=Limits(max_cost_usd=0.07), log=log)
    each = float(calc_price(Usage(input_tokens=1000, output_tokens=100), mini).total_price)
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.ledger.cost_usd == pytest.approx(2 * each)
    header = json.loads(log.read_text().splitlines()[0])
    assert header["prices"]["model"] == mini and header["params"] == {"model": mini}
    assert reconcile(log).ok
    again = replay(log)
    assert again.ok and again.replayed is not None and again.replayed.ledger.cost_usd == result.ledger.cost_usd


def test_a_params_model_with_no_price_is_named_in_the_error(tmp_path: Path) -> None:
    model = ScriptedModel([text_reply("x")])
    with pytest.raises(PriceError) as err:
        run("t", model=model, params={"model": "my-private-model-xyz"}, limits=Limits(max_cost_usd=0.07),
            log=tmp_path / "n.jsonl")
    assert "model 'my-private-model-xyz' has no known price" in str(err.value)
    assert "prices={'my-private-model-xyz': " in str(err.value) and "ScriptedModel" not in str(err.value)
    assert model.served == 0 and not (tmp_path / "n.jsonl").exists()


def test_a_batch_prices_its_episodes_by_the_model_its_params_name(tmp_path: Path) -> None:
    reply = {**text_reply("done", usage=(1000, 10)), "model": "gpt-4o-mini"}
    result = batch([{"id": "e1", "task": "t"}], model=ScriptedModel([reply]), out=tmp_path / "job",
                   params={"model": "gpt-4o-mini"}, limits=Limits(max_cost_usd=0.07))
    assert [r.stop for r in result.rows] == ["final_answer"] and (result.rows[0].cost_usd or 0) > 0
