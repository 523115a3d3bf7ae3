"""Compaction: old tool results go out as stubs; the state, the log and the fingerprint keep originals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence import Limits, Policy, ScriptedModel, StopReason, run, tool
from loopfence._compact import STUB_PREFIX, Compaction, OutgoingView
from loopfence._json import canonical_json, fingerprint
from loopfence._messages import Request
from loopfence._state import RunState
from loopfence._tokens import text_units
from loopfence.runlog import RunLog
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import Registry

PAGES = {n: f"Page {n}. " + ("lorem ipsum dolor sit amet " * 48)[: 1300] for n in range(1, 6)}


def read_file(path: str, page: int = 1) -> str:
    """Read one page of a file."""
    return PAGES[page]


REG = Registry([tool(read_file, kind="read_only")])


class Recorder:
    """Scripted replies; keeps every request it was sent."""

    def __init__(self, replies: list[dict]) -> None:
        self.inner = ScriptedModel(replies)
        self.requests: list[Request] = []

    def complete(self, request: Request):
        self.requests.append(request)
        return self.inner.complete(request)


def five_pages() -> list[dict]:
    return [calls_reply(tool_call("read_file", path="pi.txt", page=n)) for n in range(1, 6)] + \
        [text_reply("note: five pages read")]


def go(compaction: Compaction | None, log: RunLog | None = None):
    model = Recorder(five_pages())
    r = run("Make a note from pi.txt", model=model, tools=REG, compaction=compaction,
            log=log or RunLog(None))
    return r, model


def tool_contents(request: Request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


def test_default_keeps_the_last_turn_and_stubs_older_results():
    r, model = go(None)
    assert r.stop.reason is StopReason.FINAL_ANSWER
    last = tool_contents(model.requests[-1])
    assert last[4:] == [PAGES[5]]
    for n, stub in enumerate(last[:4], start=1):
        assert stub.startswith(STUB_PREFIX)
        assert f'read_file {{"path": "pi.txt", "page": {n}}}' in stub
        assert f"(step {n}, {len(PAGES[n]):,} characters, fingerprint {fingerprint(PAGES[n])})" in stub
        assert stub.endswith("Call it again to see it.]")  # read_only: asking again shows it
    # the state keeps the originals
    assert [m["content"] for m in r.messages if m["role"] == "tool"] == [PAGES[n] for n in range(1, 6)]


def test_off_sends_everything():
    r, model = go(Compaction.off())
    assert tool_contents(model.requests[-1]) == [PAGES[n] for n in range(1, 6)]


def test_the_log_keeps_originals_and_fingerprints_do_not_change():
    on, off = RunLog(None), RunLog(None)
    go(Compaction(keep_turns=1), on)
    go(Compaction.off(), off)

    def pick(log: RunLog, kind: str, key: str) -> list:
        return [e[key] for e in log.events if e["event"] == kind]

    assert pick(on, "result", "content") == pick(off, "result", "content") == [PAGES[n] for n in range(1, 6)]
    assert pick(on, "request", "fingerprint") == pick(off, "request", "fingerprint")
    est_on, est_off = pick(on, "request", "prompt_estimate"), pick(off, "request", "prompt_estimate")
    assert est_on[:2] == est_off[:2] and all(a < b for a, b in zip(est_on[2:], est_off[2:]))
    assert on.events[0]["compaction"] == {"keep_turns": 1, "min_chars": 300}


def test_estimate_is_over_the_outgoing_prompt():
    model = Recorder(five_pages())
    log = RunLog(None)
    run("t", model=model, tools=REG, log=log, compaction=Compaction(keep_turns=1))
    tools_units = text_units(canonical_json(REG.schemas()))
    for req, est in zip(model.requests, [e["prompt_estimate"] for e in log.events if e["event"] == "request"]):
        units = sum(text_units(canonical_json(m)) for m in req.messages) + tools_units
        assert est == int(units / 3.0) + 1  # no usage reported: the starting ratio


def test_short_results_are_never_stubbed():
    v = OutgoingView(Compaction(keep_turns=1, min_chars=300))
    for i in range(4):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for m in ({"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": f"c{i}", "content": "short"}):
            v.add(m, len(canonical_json(m)))
    assert v.elided == 0 and all(m.get("content") in (None, "short") for m in v.messages)


def test_keep_turns_must_be_positive_or_none():
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="keep_turns"):
            Compaction(keep_turns=bad)
    assert not Compaction.off().enabled and Compaction().enabled


def test_limits_see_the_compacted_prompt():
    # five 1,300-character pages: off, the 6th prompt is ~3k tokens (estimated); keep_turns=1: ~1.7k
    limits = Limits(max_prompt_tokens=None, context_window=2000)
    r_off, _ = (run("t", model=Recorder(five_pages()), tools=REG, limits=limits, log=RunLog(None),
                    compaction=Compaction.off()), None)
    assert r_off.stop.reason is StopReason.CONTEXT_OVERFLOW
    assert "context_window=2000" in r_off.stop.detail and "not sent" in r_off.stop.detail
    r_on = run("t", model=Recorder(five_pages()), tools=REG, limits=limits, log=RunLog(None),
               compaction=Compaction(keep_turns=1))
    assert r_on.stop.reason is StopReason.FINAL_ANSWER


# -- the view's accounting, for any conversation ------------------------------------------------------
turn = st.lists(st.text(min_size=0, max_size=700), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(turn, min_size=0, max_size=8), st.one_of(st.none(), st.integers(1, 4)),
       st.integers(0, 400))
def test_view_matches_messages_and_counts_its_own_characters(turns, keep, min_chars):
    policy = Compaction(keep_turns=keep, min_chars=min_chars)
    s = RunState(Limits(), Policy(), REG, messages=[{"role": "user", "content": "go"}], compaction=policy)
    plain = RunState(Limits(), Policy(), REG, messages=[{"role": "user", "content": "go"}],
                     compaction=Compaction.off())
    for t, results in enumerate(turns):
        calls = [{"id": f"t{t}c{i}", "type": "function",
                  "function": {"name": "read_file", "arguments": json.dumps({"path": f"{t}.{i}"})}}
                 for i in range(len(results))]
        for state in (s, plain):
            state.append({"role": "assistant", "content": None, "tool_calls": calls})
            for i, text in enumerate(results):
                state.append({"role": "tool", "tool_call_id": f"t{t}c{i}", "content": text})
    out = s.view.messages
    assert s.messages == plain.messages == plain.view.messages
    assert s.request_fingerprint() == plain.request_fingerprint()
    assert s.view.size == sum(text_units(canonical_json(m)) for m in out)
    assert len(out) == len(s.messages)
    n_turns = len(turns)
    kept_from = None if keep is None else n_turns - keep  # turns before this index may be stubbed
    tool_index = 0
    for orig, sent in zip(s.messages, out):
        assert (orig["role"], orig.get("tool_call_id")) == (sent["role"], sent.get("tool_call_id"))
        if orig["role"] != "tool":
            assert orig is sent
            continue
        t = int(orig["tool_call_id"][1:].split("c")[0])
        if sent["content"] != orig["content"]:
            assert sent["content"].startswith(STUB_PREFIX)
            assert kept_from is not None and t < kept_from and len(orig["content"]) >= min_chars
            assert text_units(canonical_json(sent)) < text_units(canonical_json(orig))
        tool_index += 1
    assert s.next_prompt_estimate() <= plain.next_prompt_estimate()


def test_asking_again_for_an_elided_page_runs_it_again_instead_of_no_progress():
    script = [calls_reply(tool_call("read_file", path="pi.txt", page=n)) for n in (1, 2, 3)] + \
        [calls_reply(tool_call("read_file", path="pi.txt", page=1)),  # elided by now: asks again
         calls_reply(tool_call("read_file", path="pi.txt", page=1)),  # a third time: max_repeats
         text_reply("note")]
    model = Recorder(list(script))
    log = RunLog(None)
    r = run("t", model=model, tools=REG, log=log, compaction=Compaction(keep_turns=1))
    decisions = [e["decision"] for e in log.events if e["event"] == "result"]
    assert decisions[:4] == ["executed"] * 4
    assert tool_contents(model.requests[4])[-1] == PAGES[1]  # page 1 is back in sight
    assert r.stop.reason is StopReason.REPEATED_CALL  # asking over and over is still bounded
    # without compaction the model still sees page 1: asking again learns nothing
    off = run("t", model=Recorder(list(script)), tools=REG, log=RunLog(None), compaction=Compaction.off())
    assert off.stop.reason is StopReason.NO_PROGRESS and off.ledger.reused == 1


def test_side_effect_stubs_do_not_invite_a_second_call():
    v = OutgoingView(Compaction(keep_turns=1, min_chars=10), rereadable=frozenset({"read_file"}))
    for i, name in enumerate(["run_command", "read_file", "x"]):
        call = {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for m in ({"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": f"c{i}", "content": "output " * 60}):
            v.add(m, text_units(canonical_json(m)))
    run_stub, read_stub = v.messages[1]["content"], v.messages[3]["content"]
    assert "run_command {}" in run_stub and run_stub.endswith("fingerprint " + fingerprint("output " * 60) + ").]")
    assert "again" not in run_stub and read_stub.endswith("Call it again to see it.]")
