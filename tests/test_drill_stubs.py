"""The stub tools and canned tools behave as documented; sleep is really stopped at its timeout."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from loopfence.drill import CannedTool, canned_tool, stub_tools
from loopfence.tools import Executor, ToolKind


def children() -> set[int]:
    """Live child processes of this test process (from /proc; zombies count as gone)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == me and fields[0] != "Z":
            out.add(int(entry.name))
    return out


@pytest.fixture
def stubs(tmp_path: Path) -> dict:
    return {t.name: t for t in stub_tools(tmp_path)}


def test_kinds_and_defaults(stubs: dict) -> None:
    assert {n: str(t.kind) for n, t in stubs.items()} == {
        "ok_forever": "side_effect", "big_output": "read_only", "sleep": "side_effect",
        "raise_after_write": "side_effect"}
    assert stubs["sleep"].isolation == "process"
    assert stubs["ok_forever"].validate({}) == {"n": 0}
    assert stubs["big_output"].validate({}) == {"kb": 300}
    assert stubs["sleep"].validate({}) == {"seconds": 300}
    assert stubs["raise_after_write"].validate({}) == {"path": "out.txt"}


def test_ok_forever_and_big_output(stubs: dict) -> None:
    ex = Executor(result_cap=None)
    assert ex.execute(stubs["ok_forever"], {"n": 7}, 5).content == "ok"
    assert len(ex.execute(stubs["big_output"], {"kb": 3}, 5).content) == 3 * 1024
    capped = Executor().execute(stubs["big_output"], {"kb": 300}, 5)
    assert capped.ok and "[truncated: 307,200 characters" in capped.content


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see child processes")
def test_sleep_is_stopped_at_its_timeout_and_leaves_no_process(stubs: dict) -> None:
    before = children()
    start = time.monotonic()
    res = Executor().execute(stubs["sleep"], {"seconds": 30.0}, 0.3)
    took = time.monotonic() - start
    assert not res.ok and res.error == "timeout" and "the work was stopped" in res.content
    assert took < 5
    assert children() - before == set(), "the sleeping tool process is still alive"


def test_sleep_finishes_when_given_time(stubs: dict) -> None:
    res = Executor().execute(stubs["sleep"], {"seconds": 0.05}, 5)
    assert res.ok and res.content == "slept 0.05s"


def test_raise_after_write_writes_then_fails(tmp_path: Path, stubs: dict) -> None:
    res = Executor().execute(stubs["raise_after_write"], {"path": "reports/out.txt"}, 5)
    assert not res.ok
    body = json.loads(res.content)
    assert body["side_effects"].startswith("may have happened")
    assert (tmp_path / "reports" / "out.txt").is_file()


def test_raise_after_write_does_not_write_outside_the_workspace(tmp_path: Path, stubs: dict) -> None:
    res = Executor().execute(stubs["raise_after_write"], {"path": "../escaped.txt"}, 5)
    assert not res.ok and "outside the workspace" in res.content
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_canned_results_come_in_order_and_the_last_repeats() -> None:
    t = canned_tool(CannedTool("poll_job", ("running", {"state": "done", "n": [1]}), ToolKind.POLL))
    ex = Executor()
    got = [ex.execute(t, {}, 5).content for _ in range(4)]
    assert got == ["running", '{"state": "done", "n": [1]}', '{"state": "done", "n": [1]}',
                   '{"state": "done", "n": [1]}']
    assert t.kind is ToolKind.POLL and t.parameters == {"type": "object"}


def test_canned_error_results_are_failures() -> None:
    t = canned_tool(CannedTool("deploy", ({"ok": False, "error": "unavailable"},)))
    res = Executor().execute(t, {"region": "x"}, 5)
    assert not res.ok and res.error == "unavailable"


def test_canned_result_schema_flags_an_extra_key() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    good = canned_tool(CannedTool("t", ({"ok": True},), result_schema=schema))
    bad = canned_tool(CannedTool("t", ({"ok": True, "extra": 1},), result_schema=schema))
    assert Executor().execute(good, {}, 5).violation is None
    violation = Executor().execute(bad, {}, 5).violation
    assert violation and "extra" in violation and "t_result_schema" in violation


def test_canned_parameters_are_validated_and_bound() -> None:
    params = {"type": "object", "properties": {"job": {"type": "string"}, "wait": {"type": "integer", "default": 0}},
              "required": ["job"], "additionalProperties": False}
    t = canned_tool(CannedTool("poll_job", ("running",), ToolKind.POLL, params))
    assert t.validate({"job": "42"}) == {"job": "42", "wait": 0}
    with pytest.raises(ValueError):
        t.validate({"job": 42})
