"""Context that fits: the next prompt is counted before it is sent; an oversize one is never sent.

Seed 003, break 3: a 144 KB page (103 KB of inline CSS) read whole into a 32k window. The server in
these tests is a model that refuses an oversize request exactly as llama.cpp does (an endpoint
error): the fence must stop first, by name, with the request unsent.
"""

from __future__ import annotations

import pytest

from loopfence import Limits, Policy, ScriptedModel, StopReason, run, tool
from loopfence._compact import Compaction
from loopfence._json import canonical_json
from loopfence._messages import Request
from loopfence._state import RunState
from loopfence._stops import StopError
from loopfence._tokens import text_units
from loopfence.runlog import RunLog
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import Executor, Registry

CHARS_PER_TOKEN = 2.93  # seed 003: 144 KB of HTML were 49,185 tokens


def big_page(css_kb: int = 103, text_chars: int = 6_400, total_kb: int = 144) -> str:
    css = "<style>" + (".c{margin:0 auto;padding:1px 2px;color:#333}" * (css_kb * 1024 // 44)) + "</style>"
    text = "".join(f"<p>Pi is a small coding agent. Sentence {i} of the article.</p>"
                   for i in range(text_chars // 45))
    pad = total_kb * 1024 - len(css) - len(text) - 60
    return f"<html><head>{css}</head><body>{text}<div hidden>{'x' * max(pad, 0)}</div></body></html>"


PAGE = big_page()


def fetch_page(path: str) -> str:
    """Return the whole file (break 3's plain read_file)."""
    return PAGE


REG = Registry([tool(fetch_page, kind="read_only")])


class WindowModel:
    """Scripted replies behind a context window that refuses oversize prompts like a server does."""

    def __init__(self, replies: list[dict], window: int, exact: bool = False) -> None:
        self.inner = ScriptedModel(replies)
        self.window = window
        self.requests: list[Request] = []
        self.counts = 0
        if exact:
            self.count_tokens = self._count

    def _count(self, messages: list[dict], tools: list[dict]) -> int:
        self.counts += 1
        return int(len(canonical_json(messages)) / CHARS_PER_TOKEN) + len(canonical_json(tools)) // 3

    def complete(self, request: Request):
        self.requests.append(request)
        n = self._count(request.messages, request.tools)
        if n > self.window:
            raise StopError(StopReason.ENDPOINT_ERROR, f"HTTP 400: request ({n} tokens) exceeds the "
                            f"available context size ({self.window} tokens)", status=400)
        return self.inner.complete(request)


def replies() -> list[dict]:
    return [calls_reply(tool_call("fetch_page", path="pages/pi.html"), usage=(312, 20)),
            text_reply("a note")]


def test_the_page_is_144_kb():
    assert 140_000 < len(PAGE) < 150_000 and PAGE.count("<style>") == 1


@pytest.mark.parametrize("exact", [False, True], ids=["estimated", "counted"])
def test_144kb_page_in_a_32k_window_stops_before_sending(exact):
    model = WindowModel(replies(), 32_768, exact=exact)
    log = RunLog(None)
    r = run("Make a note from pages/pi.html", model=model, tools=REG, log=log,
            limits=Limits(context_window=32_768, max_prompt_tokens=None), executor=Executor(result_cap=None))
    assert r.stop.reason is StopReason.CONTEXT_OVERFLOW, r.stop.detail
    assert len(model.requests) == 1  # the second request was never sent
    assert "context_window=32768" in r.stop.detail and "not sent" in r.stop.detail
    assert r.stop.data["limit"] == 32_768 and r.stop.data["value"] > 32_768
    assert [e["event"] for e in log.events].count("request") == 1
    assert log.events[-1]["event"] == "stop" and log.events[-1]["reason"] == "context_overflow"
    if exact:  # the model's own count of the unsent prompt is what the stop names
        assert r.stop.data["value"] == model._count(r.messages, REG.schemas())


def test_144kb_page_capped_result_still_overflows_a_4k_window_before_sending():
    model = WindowModel(replies(), 4_096)
    r = run("note", model=model, tools=REG, log=RunLog(None), limits=Limits(context_window=4_096))
    assert r.stop.reason is StopReason.CONTEXT_OVERFLOW and len(model.requests) == 1


def test_max_prompt_tokens_stops_before_sending_the_page():
    model = WindowModel(replies(), 10**9)
    r = run("note", model=model, tools=REG, log=RunLog(None), executor=Executor(result_cap=None),
            limits=Limits(max_prompt_tokens=30_000))
    assert r.stop.reason is StopReason.MAX_PROMPT_TOKENS and len(model.requests) == 1
    assert "max_prompt_tokens=30000" in r.stop.detail and "312 used" in r.stop.detail


def test_count_tokens_is_used_when_the_model_offers_it_and_asked_once_per_step():
    model = WindowModel(replies(), 10**9, exact=True)
    log = RunLog(None)
    r = run("note", model=model, tools=REG, log=log, executor=Executor(result_cap=None))
    assert r.stop.reason is StopReason.FINAL_ANSWER
    assert model.counts == 2 + 2  # once per step for the state (memoized), once per step in complete()
    estimates = [e["prompt_estimate"] for e in log.events if e["event"] == "request"]
    assert estimates == [model._count(q.messages, q.tools) for q in model.requests]


def test_count_tokens_none_or_raising_falls_back_to_the_estimate():
    for counted in (None, 0, True, "12"):  # what the ring sets when the count is missing or raised
        s = RunState(Limits(), Policy(), REG,
                     messages=[{"role": "user", "content": "x" * 300}], counts_tokens=True)
        s.set_count(counted)
        plain = RunState(Limits(), Policy(), REG,
                         messages=[{"role": "user", "content": "x" * 300}])
        assert s.next_prompt_estimate() == plain.next_prompt_estimate() > 100


@pytest.mark.parametrize("counter", [lambda m, t: None, lambda m, t: 1 // 0])
def test_a_model_count_that_fails_leaves_the_estimate_in_a_run(counter):
    class Counting(ScriptedModel):
        def count_tokens(self, messages, tools):
            return counter(messages, tools)

    log = RunLog(None)
    r = run("x" * 300, model=Counting([text_reply("ok")]), tools=REG, log=log)
    assert r.stop.reason is StopReason.FINAL_ANSWER
    assert [e["prompt_estimate"] for e in log.events if e["event"] == "request"][0] > 100


def test_estimate_starts_from_the_last_reported_prompt_plus_what_came_since():
    model = ScriptedModel([calls_reply(tool_call("fetch_page", path="p"), usage=(100, 5)), text_reply("ok")])
    log = RunLog(None)
    short = Registry([tool(lambda path: "short", name="fetch_page", kind="read_only")])
    r = run("a task of some length " * 10, model=model, tools=short, log=log)
    first, second = [e["prompt_estimate"] for e in log.events if e["event"] == "request"]
    sent = text_units(canonical_json({"role": "user", "content": "a task of some length " * 10})) + \
        text_units(canonical_json(short.schemas()))
    assert first == int(sent / 3.0) + 1  # nothing counted yet: units over the starting ratio
    since = sum(text_units(canonical_json(m)) for m in r.messages[1:3])  # the reply and the result
    # 100 tokens counted by the endpoint; new content at the cautious ratio (never leaner than 3.0)
    assert second == 100 + int(since / 3.0) + 1


def test_an_unreported_markup_page_is_not_estimated_at_the_prose_ratio():
    # calibrated on prose (~4.5 units/token); the 144 KB page is still estimated at >= 1 token per 3 units
    model = ScriptedModel([calls_reply(tool_call("fetch_page", path="p"), usage=(40, 5)), text_reply("ok")])
    log = RunLog(None)
    run("Pi is a small coding agent. " * 5, model=model, tools=REG, log=log,
        executor=Executor(result_cap=None), limits=Limits(max_prompt_tokens=None))
    second = [e["prompt_estimate"] for e in log.events if e["event"] == "request"][1]
    assert second > text_units(PAGE) / 3.0 > len(PAGE) / CHARS_PER_TOKEN


def test_compaction_can_make_a_long_run_fit():
    pages = Registry([tool(lambda path, page=1: f"page {page} " + "z" * 1300, name="fetch_page",
                           kind="read_only")])
    script = [calls_reply(tool_call("fetch_page", path="p", page=n)) for n in range(1, 9)] + [text_reply("ok")]
    for compaction, expected in [(Compaction.off(), StopReason.CONTEXT_OVERFLOW),
                                 (Compaction(keep_turns=2), StopReason.FINAL_ANSWER)]:
        model = WindowModel(list(script), 3_000)
        r = run("t", model=model, tools=pages, log=RunLog(None), compaction=compaction,
                limits=Limits(context_window=3_000))
        assert r.stop.reason is expected
        assert all(model._count(q.messages, q.tools) <= 3_000 for q in model.requests)


def test_units_weigh_symbols_so_markup_is_not_taken_for_prose():
    assert text_units("hello world") == 11
    assert text_units("a1{}") == 4 + 2 * 3
    assert text_units("é") == 1 + 2 * 2  # two UTF-8 bytes, both non-ASCII
    css = ".c1{margin:0 3px;padding:2px;color:#123}" * 10
    prose = "Pi is a small coding agent with four tools and a loop. " * 8
    # per character, CSS now weighs ~1.7x what prose does (it costs ~2.2x the tokens)
    assert text_units(css) / len(css) > 1.6 * text_units(prose) / len(prose)
