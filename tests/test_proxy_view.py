"""The proxy's normalised view of a conversation (`proxy._view`): a request extends its run's latest
request whatever the client did to its history, and text actions are read from the reply's text."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from loopfence.proxy._view import action_of, call_ids_in, calls_in_text, digests, program_of, view

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40).filter(str.strip)
_args = st.dictionaries(st.sampled_from(["path", "city", "n"]), st.one_of(st.integers(-5, 5), _text), max_size=3)


@st.composite
def _turns(draw: Any) -> list[tuple[str, str | None, list[tuple[str, dict[str, Any]]], str]]:
    """(thought, None, calls, result) per turn, or (thought, text, [], result) for a text turn."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        calls = draw(st.lists(st.tuples(st.sampled_from(["get", "read_file"]), _args), min_size=1, max_size=2))
        out.append((draw(_text), None, calls, draw(_text)))
    return out


def _as_tool_calls(task: str, turns: list[Any]) -> list[dict[str, Any]]:
    """The conversation as an OpenAI client keeps it: tool_calls, tool messages, string content."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": task}]
    for t, (thought, _, calls, result) in enumerate(turns):
        ids = [f"c{t}_{j}" for j in range(len(calls))]
        msgs.append({"role": "assistant", "content": thought, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in zip(ids, calls, strict=True)]})
        msgs.append({"role": "user", "content": result})
    return msgs


def _rerendered(task: str, turns: list[Any]) -> list[dict[str, Any]]:
    """The same conversation as smolagents re-renders it: parts lists, the calls as "Calling tools:"
    text (a Python literal, arguments as objects), the thought as a message of its own."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": "sys"}]},
                                  {"role": "user", "content": [{"type": "text", "text": task}]}]
    for t, (thought, _, calls, result) in enumerate(turns):
        listed = [{"id": f"c{t}_{j}", "type": "function", "function": {"name": n, "arguments": a}}
                  for j, (n, a) in enumerate(calls)]
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": thought}]})
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"Calling tools:\n{listed!r}"}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": result}]})
    return msgs


@given(_text, _turns())
def test_a_rerendered_history_has_the_view_of_the_original(task: str, turns: list[Any]) -> None:
    assert digests(_as_tool_calls(task, turns))[0] == digests(_rerendered(task, turns))[0]
    assert view(_as_tool_calls(task, turns)) == view(_rerendered(task, turns))


@given(_text, _turns(), _turns())
def test_a_request_extends_every_earlier_request_of_its_conversation(task: str, a: list[Any], b: list[Any]) -> None:
    whole = _rerendered(task, a + b)
    for k in range(1, len(a + b) + 1):
        earlier = _as_tool_calls(task, (a + b)[:k])[:-2]  # the request that turn k's reply answered
        full, bare = digests(earlier)[0].split()
        cuts = digests(whole)[1]
        assert full in cuts and bare in cuts
        assert cuts.index(full) < cuts.index(bare)  # with the system messages first
    other = digests(_rerendered(task + " (another task)", a + b))[1]
    assert not set(other) & {d for d in cuts}


def test_without_the_system_messages_the_last_answer_under_another_prompt_extends_the_run() -> None:
    run = [{"role": "system", "content": "agent prompt"}, {"role": "user", "content": "task"},
           {"role": "assistant", "content": "a1"}, {"role": "user", "content": "o1"}]
    last = [{"role": "system", "content": "give the final answer"}, *run[1:],
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "o2"}, {"role": "user", "content": "now answer"}]
    full, bare = digests(run)[0].split()
    assert full not in digests(last)[1] and bare in digests(last)[1]


def test_actions_are_read_from_blocks_tags_call_text_or_the_text() -> None:
    assert action_of("THOUGHT: a\n\n```mswea_bash_command\nls -la\n```") == "ls -la"
    assert action_of("```bash\ncd src\n```\nand\n~~~\nmake\n~~~") == "cd src\n\nmake"
    assert action_of("Thought: x\n<code>\nprint(1)\n</code>") == "print(1)"
    assert action_of("Thought: x\n<code>\nprint(1)\n") == "print(1)"  # cut at its stop sequence
    assert action_of("run it:\n```bash\npytest -q\n") == "pytest -q"
    assert action_of("Calling tools:\n[{'id': 'c', 'type': 'function', 'function': {'name': 'get', "
                     "'arguments': {'b': 1, 'a': 2}}}]") == '[["get",{"a":2,"b":1}]]'
    assert action_of("  just\n words ") == "just words"
    assert action_of("") is None and action_of(None) is None and action_of(" \n") is None


def test_call_text_that_is_not_a_list_of_calls_is_text() -> None:
    assert calls_in_text("Calling tools:\n[1, 2]") == ("Calling tools:\n[1, 2]", [])
    assert calls_in_text("Calling tools:\n[{'id': ") == ("Calling tools:\n[{'id': ", [])
    assert calls_in_text("no calls here") == ("no calls here", [])


def test_program_names_and_call_ids() -> None:
    assert program_of("/usr/bin/curl -s x") == "curl" and program_of("poll_job {}") == "poll_job"
    assert program_of("  ") == ""
    assert call_ids_in("Call id: call_7\nObservation:\nok") == ["call_7"]
