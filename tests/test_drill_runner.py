"""run_scenario: the calls list follows the run log; HTTP-only scenarios need the endpoint pieces."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from loopfence.drill import DrillSetupError, run_scenario
from loopfence.drill._load import parse_scenario
from loopfence.testing import calls_reply, text_reply, tool_call


def make(**over: Any) -> Any:
    data = {"name": "s", "task": "t", "workspace": {"a.py": "A\n", "b.py": "B\n"}, "tools": ["read_file"],
            "replies": [text_reply("done")]}
    data.update(over)
    return parse_scenario(data, "<test>")


def test_calls_are_in_reply_order_with_their_decisions(tmp_path: Path) -> None:
    # fail closed: the valid first call does not run because the second is unknown
    s = make(replies=[calls_reply(tool_call("read_file", path="a.py"), tool_call("cat", path="b.py"))])
    row = run_scenario(s, tmp_path)
    assert row.stop == "unknown_tool"
    assert [(c.name, c.decision, c.ok) for c in row.calls] == [("read_file", "refused", False),
                                                                ("cat", "rejected", False)]


def test_reused_and_refused_calls_show_bound_arguments(tmp_path: Path) -> None:
    s = make(limits={"max_tool_calls": 1, "no_progress": False}, replies=[
        calls_reply(tool_call("read_file", path="a.py")),
        calls_reply(tool_call("read_file", '{"encoding": "utf-8", "path": "a.py"}'), tool_call("read_file", path="b.py"))])
    row = run_scenario(s, tmp_path)
    assert row.stop == "max_tool_calls"
    assert [(c.decision, c.arguments) for c in row.calls] == [
        ("executed", {"path": "a.py", "page": 1, "encoding": "utf-8"}),
        ("reused", {"path": "a.py", "page": 1, "encoding": "utf-8"}),
        ("refused", {"path": "b.py"})]


def test_invalid_json_arguments_are_kept_raw(tmp_path: Path) -> None:
    row = run_scenario(make(replies=[calls_reply(tool_call("read_file", '{"path": '))]), tmp_path)
    assert row.stop == "invalid_json" and row.calls[0].arguments == '{"path": '


def test_workspace_files_and_symlinks_are_created_fresh(tmp_path: Path) -> None:
    s = make(symlinks={"up": ".."}, tools=["list_dir"], replies=[
        calls_reply(tool_call("list_dir", path=".")), text_reply("listed")])
    row = run_scenario(s, tmp_path / "one")
    assert row.stop == "final_answer" and row.calls[0].ok
    again = run_scenario(make(tools=["raise_after_write", "list_dir"], replies=[
        calls_reply(tool_call("raise_after_write")), text_reply("x")]), tmp_path / "two")
    assert again.calls[0].ok is False
    # a fresh workspace each time: the first run's out.txt does not leak into another run
    third = run_scenario(make(tools=["read_file"], replies=[
        calls_reply(tool_call("read_file", path="out.txt")), text_reply("x")]), tmp_path / "three")
    assert third.calls[0].ok is False


def test_a_factory_that_cannot_serve_fails_the_row(tmp_path: Path) -> None:
    @contextmanager
    def broken(_s: Any) -> Any:
        raise DrillSetupError("needs the HTTP endpoint: test")
        yield

    row = run_scenario(make(expect={"stop": "final_answer"}), tmp_path, broken)
    assert row.failed and row.error and "needs the HTTP endpoint: test" in row.error
    assert row.to_json()["pass"] is False


def test_http_forms_without_the_endpoint_modules_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "loopfence.models._openai", None)  # import raises ImportError
    s = make(replies=[{"chunks": [], "done": False}], expect={"stop": "incomplete_stream"})
    assert s.needs_http
    row = run_scenario(s, tmp_path)
    assert row.failed and "needs the HTTP endpoint" in (row.error or "")


def test_stream_true_needs_http() -> None:
    assert make(stream=True).needs_http and not make().needs_http
