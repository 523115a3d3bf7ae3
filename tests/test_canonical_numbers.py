"""RFC 8785 numbers in canonical keys: `30` and `30.0` are one call; logs with run_command replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopfence import Limits, ScriptedModel, run
from loopfence._contract import canonical_key
from loopfence._json import canonical_json
from loopfence.runlog import replay
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import workspace_tools

_SAFE = 2 ** 53


@given(st.integers(-_SAFE, _SAFE), st.text(max_size=5))
def test_an_int_and_its_integral_float_are_one_key(n: int, name: str) -> None:
    as_int = canonical_key("t", {"x": n, "nested": [n, {name: n}]})
    as_float = canonical_key("t", {"x": float(n), "nested": [float(n), {name: float(n)}]})
    assert as_int == as_float
    assert canonical_json(float(n)) == str(n)


@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()))
def test_a_fractional_float_keeps_its_value(f: float) -> None:
    assert json.loads(canonical_json({"x": f}))["x"] == f
    assert canonical_key("t", {"x": f}) != canonical_key("t", {"x": int(f)})  # 2.5 is not 2


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_log_with_run_command_replays(tmp_path: Path) -> None:
    """The live key binds the float default (`timeout_s: 30.0`); replay rebuilds the tool from the
    header's schema, where the default is `30`: the same key."""
    log = tmp_path / "run.jsonl"
    model = ScriptedModel([calls_reply(tool_call("run_command", command="echo hi")),
                           calls_reply(tool_call("run_command", command="echo hi", timeout_s=30)),
                           text_reply("done")])
    result = run("t", model=model, tools=workspace_tools(tmp_path, ["run_command"]), log=log,
                 limits=Limits(max_steps=5))
    assert result.stop.reason == "final_answer"
    keys = [e["key"] for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == "gate"]
    assert keys == ['run_command:{"command":"echo hi","timeout_s":30}'] * 2
    report = replay(log)
    assert report.ok, report
