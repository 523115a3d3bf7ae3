"""What a budget judged live is what replay and reconcile judge (issue 30, defects 8 and 9).

8. A prompt a budget refuses is never sent, so no request line records its tokens. A model that
   counts prompts itself (the embedded llama.cpp model, a server's /tokenize) gave the live check
   an exact figure; offline the ring has only its heuristic. The stop (or the skipped last answer)
   records the figure, and playback counts with it.
9. A reply cut at the tokens loopfence reserved for it (what was left of max_completion_tokens) is
   that budget's stop, naming the limit and the value, not `incomplete_stream`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence import Limits, Policy, ScriptedModel, StopReason, run, tool, workspace_tools
from loopfence._json import canonical_json
from loopfence._messages import Reply, Request
from loopfence.runlog import RunLog, read_log, reconcile, replay
from loopfence.testing import calls_reply, text_reply, tool_call

from _local_support import SAMPLE_SYSTEM, SAMPLE_WORKSPACE, needs_local_model
from _runlog_support import edit_events, read_lines


def fetch_page(path: str) -> str:
    """Return a page."""
    return "<p>" + "Pi is a small coding agent. " * 60 + "</p>"


TOOLS = [tool(fetch_page, kind="read_only")]


def exact(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """A tokenizer's count by a rule the ring's heuristic does not share."""
    return len(canonical_json(messages)) // 2 + len(canonical_json(tools)) // 5 + 11


class Counting(ScriptedModel):
    """Scripted replies from a model that counts its prompts exactly (`exact`)."""

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        return exact(messages, tools)


def script() -> list[dict[str, Any]]:
    return [calls_reply(tool_call("fetch_page", path="pages/pi.html")), text_reply("a note")]


def second_prompt(log: Path) -> int:
    """The exact count of the prompt after the tool's result (a run without the budget sends it)."""
    run("Make a note of pages/pi.html", model=Counting(script()), tools=TOOLS, log=RunLog(log),
        limits=Limits(max_prompt_tokens=None))
    return [e["prompt_estimate"] for e in read_lines(log) if e["event"] == "request"][1]


def _budget(kind: str, full: int) -> dict[str, Any]:
    if kind == "context_window":
        return {"limits": Limits(context_window=full - 1, max_prompt_tokens=None)}
    if kind == "max_prompt_tokens":
        return {"limits": Limits(max_prompt_tokens=full)}
    # $1/MTok in and out: the first request fits, the second (its prompt and 100 reserved) does not
    return {"limits": Limits(max_cost_usd=(full + 100) / 1e6, max_tokens_per_request=100,
                             max_prompt_tokens=None), "prices": {"*": (1.0, 1.0)}}


@pytest.mark.parametrize("kind, reason", [("context_window", "context_overflow"),
                                          ("max_prompt_tokens", "max_prompt_tokens"),
                                          ("max_cost_usd", "max_cost_usd")])
def test_a_stop_before_sending_replays_and_reconciles_with_the_models_own_count(tmp_path: Path, kind: str,
                                                                                reason: str) -> None:
    full = second_prompt(tmp_path / "full.jsonl")
    path = tmp_path / "stopped.jsonl"
    r = run("Make a note of pages/pi.html", model=Counting(script()), tools=TOOLS, log=RunLog(path),
            **_budget(kind, full))
    assert r.stop.reason == reason and r.ledger.model_requests == 1, r.stop.detail
    rec = reconcile(path)
    assert rec.ok, [c.detail for c in rec.failed]
    report = replay(path)
    assert report.ok, report.lines()
    assert r.stop.data["prompt_estimate"] == full  # the model's count of the prompt it never sent


def test_a_last_answer_skipped_by_the_prompt_budget_replays_with_the_models_count(tmp_path: Path) -> None:
    path = tmp_path / "last.jsonl"
    first = exact([{"role": "user", "content": "Make a note of pages/pi.html"}], [t.schema() for t in TOOLS])
    r = run("Make a note of pages/pi.html", model=Counting(script()), tools=TOOLS, log=RunLog(path),
            limits=Limits(max_steps=1, max_prompt_tokens=first + 50), policy=Policy(last_answer=True))
    assert r.stop.reason is StopReason.MAX_STEPS
    skipped = [e for e in read_lines(path) if e["event"] == "last_answer"]
    assert [(e["decision"], e["reason"]) for e in skipped] == [("skipped", "max_prompt_tokens")]
    rec = reconcile(path)
    assert rec.ok, [c.detail for c in rec.failed]
    assert replay(path).ok, replay(path).lines()
    assert skipped[0]["prompt_estimate"] > first


@settings(max_examples=15, deadline=None)
@given(per=st.integers(1, 6), extra=st.integers(0, 400), budget=st.integers(50, 3_000),
       kind=st.sampled_from(["max_prompt_tokens", "context_window"]))
def test_any_exact_count_and_budget_give_a_log_that_reconciles_and_replays(
        tmp_path_factory: pytest.TempPathFactory, per: int, extra: int, budget: int, kind: str) -> None:
    """Whatever the model's tokenizer says and wherever the budget falls, the run's own log holds."""

    class Rule(ScriptedModel):
        def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
            return len(canonical_json(messages)) // per + extra

    path = tmp_path_factory.mktemp("any") / "run.jsonl"
    limits = Limits(max_prompt_tokens=budget) if kind == "max_prompt_tokens" else \
        Limits(context_window=budget, max_prompt_tokens=None)
    run("Make a note of pages/pi.html", model=Rule(script()), tools=TOOLS, log=RunLog(path), limits=limits)
    rec = reconcile(path)
    assert rec.ok, [c.detail for c in rec.failed]
    assert replay(path).ok, replay(path).lines()


def test_an_older_log_without_the_figure_still_replays_and_reconciles(tmp_path: Path) -> None:
    """A log written before the stop recorded its figure: the ring estimates, as it always did (a
    model without a count of its own: the heuristic both times)."""
    full = second_prompt(tmp_path / "full.jsonl")
    path = tmp_path / "new.jsonl"
    run("Make a note of pages/pi.html", model=ScriptedModel(script()), tools=TOOLS, log=RunLog(path),
        limits=Limits(max_prompt_tokens=full // 3))

    def forget(events: list[dict[str, Any]]) -> None:
        assert events[-1]["data"].pop("prompt_estimate") > 0

    old = edit_events(path, tmp_path / "old.jsonl", forget)
    assert "prompt_estimate" not in json.dumps(read_log(old).stop.data)
    assert read_log(old).stop.reason == StopReason.MAX_PROMPT_TOKENS
    assert reconcile(old).ok
    assert replay(old).ok, replay(old).lines()


class Capped:
    """A model that generates each scripted reply's `tokens` tokens, cut at the request's
    `max_tokens` as an endpoint cuts it (finish_reason "length"); `own`: a cap of its own."""

    def __init__(self, replies: list[tuple[dict[str, Any] | str, int]], own: int | None = None) -> None:
        self.replies = list(replies)
        self.own = own
        self.sent: list[int | None] = []

    def complete(self, request: Request) -> Reply:
        self.sent.append(request.max_tokens)
        body, tokens = self.replies.pop(0)
        cap = min(c for c in (request.max_tokens, self.own, 10**9) if c is not None)
        if tokens <= cap:
            return Reply.from_response(body if isinstance(body, dict) else text_reply(body, usage=(40, tokens)))
        text = str(body)[: cap * 2]  # what it had generated when it was cut
        return Reply.from_response(text_reply(text, usage=(40, cap), finish_reason="length"))


def reading(tokens: int) -> tuple[dict[str, Any], int]:
    return calls_reply(tool_call("fetch_page", path="pages/pi.html"), usage=(40, tokens)), tokens


NOTE = "Pi is a small coding agent with four tools. " * 10


def test_a_reply_cut_at_the_tokens_left_of_the_budget_is_that_budgets_stop(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    model = Capped([reading(25), (NOTE, 40)])
    r = run("Make a note of pages/pi.html", model=model, tools=TOOLS, log=RunLog(path),
            limits=Limits(max_completion_tokens=50))
    assert model.sent == [50, 25]  # the ring lowered the second request's max_tokens to what was left
    assert r.stop.reason is StopReason.MAX_COMPLETION_TOKENS, r.stop.detail
    assert "the reply was cut at the 25 tokens left of max_completion_tokens=50" in r.stop.detail
    assert r.stop.data == {"limit": 50, "value": 50, "left": 25}
    assert r.partial_text == NOTE[:50] and r.final_answer is None
    rec = reconcile(path)
    assert rec.ok, [c.detail for c in rec.failed]
    assert replay(path).ok, replay(path).lines()


def test_a_log_before_version_4_keeps_its_cut_named_incomplete_stream(tmp_path: Path, monkeypatch: Any) -> None:
    """Logs before version 4 named a cut at the reservation incomplete_stream: their replay and
    reconcile follow the log's version, while a version-4 log with that stop diverges."""
    import loopfence._steps as steps

    with monkeypatch.context() as m:  # the ring as it was: no budget's name for the cut
        m.setattr(steps, "_cut_by_budget", lambda s, reply: None)
        r = run("Make a note of pages/pi.html", model=Capped([reading(25), (NOTE, 40)]), tools=TOOLS,
                log=RunLog(tmp_path / "as-written.jsonl"), limits=Limits(max_completion_tokens=50))
    assert r.stop.reason is StopReason.INCOMPLETE_STREAM

    def version(n: int) -> Callable[[list[dict[str, Any]]], None]:
        def edit(events: list[dict[str, Any]]) -> None:
            events[0]["version"] = n
        return edit

    old = edit_events(tmp_path / "as-written.jsonl", tmp_path / "v3.jsonl", version(3))
    assert reconcile(old).ok and replay(old).ok, replay(old).lines()
    new = edit_events(tmp_path / "as-written.jsonl", tmp_path / "v4.jsonl", version(4))
    assert not replay(new).ok


@pytest.mark.parametrize("how, limits, params, own", [
    ("the user's max_tokens", Limits(max_completion_tokens=50), {"max_tokens": 20}, None),
    ("max_tokens_per_request", Limits(max_completion_tokens=50, max_tokens_per_request=20), {}, None),
    ("the server's own cap", Limits(max_completion_tokens=50), {}, 15),
])
def test_a_cut_the_user_asked_for_or_the_server_made_stays_incomplete_stream(
        tmp_path: Path, how: str, limits: Limits, params: dict[str, Any], own: int | None) -> None:
    path = tmp_path / "cut.jsonl"
    r = run("Make a note of pages/pi.html", model=Capped([reading(10), (NOTE, 40)], own=own), tools=TOOLS,
            log=RunLog(path), limits=limits, params=params)
    assert r.stop.reason is StopReason.INCOMPLETE_STREAM, (how, r.stop.detail)
    assert "finish_reason is 'length'" in r.stop.detail
    assert reconcile(path).ok and replay(path).ok


@pytest.fixture(scope="module")
def local_model() -> Any:
    from loopfence.models._local import LocalModel

    return LocalModel()


class TestEmbedded:
    """The same on the embedded model (SmolLM2 in llama.cpp), which counts with its tokenizer."""

    pytestmark = needs_local_model
    TASK = 'Read "pages/tl-intro.html" and make a note of it.'

    def _run(self, model: Any, tmp_path: Path, limits: Limits) -> tuple[Any, Path]:
        shutil.copytree(SAMPLE_WORKSPACE, tmp_path / "ws")
        path = tmp_path / "run.jsonl"
        r = run(self.TASK, model=model, tools=workspace_tools(tmp_path / "ws"), system=SAMPLE_SYSTEM,
                limits=limits, log=RunLog(path))
        return r, path

    @pytest.mark.parametrize("limits, reason", [(Limits(max_prompt_tokens=200), "max_prompt_tokens"),
                                                (Limits(context_window=200), "context_overflow")])
    def test_a_prompt_refused_before_sending_replays_with_the_tokenizers_count(
            self, local_model: Any, tmp_path: Path, limits: Limits, reason: str) -> None:
        r, path = self._run(local_model, tmp_path, limits)
        assert r.stop.reason == reason and r.ledger.model_requests == 0, r.stop.detail
        rec = reconcile(path)
        assert rec.ok, [c.detail for c in rec.failed]
        assert replay(path).ok, replay(path).lines()
        assert r.stop.data["prompt_estimate"] == local_model.count_tokens(list(r.messages), [
            t.schema() for t in workspace_tools(tmp_path / "ws")])

    def test_a_reply_cut_at_the_budget_left_names_the_budget(self, local_model: Any, tmp_path: Path) -> None:
        r, path = self._run(local_model, tmp_path, Limits(max_completion_tokens=5))
        assert r.stop.reason is StopReason.MAX_COMPLETION_TOKENS, r.stop.detail
        assert "the reply was cut at the 5 tokens left of max_completion_tokens=5" in r.stop.detail
        rec = reconcile(path)
        assert rec.ok, [c.detail for c in rec.failed]
        assert replay(path).ok, replay(path).lines()
