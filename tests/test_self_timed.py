"""run_command stops its own work within the run's tool timeout, so its output is not lost."""

from __future__ import annotations

import json
import shutil

import pytest

from loopfence import Limits, ScriptedModel, run, workspace_tools
from loopfence.runlog import RunLog
from loopfence.testing import calls_reply, text_reply, tool_call


@pytest.mark.parametrize("sandbox", [False, pytest.param(True, marks=pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed"))])
def test_run_command_is_cut_at_the_runs_tool_timeout_and_reports_its_output(tmp_path, sandbox):
    replies = [calls_reply(tool_call("run_command", command="echo started; sleep 30; echo finished", timeout_s=30)),
               text_reply("done")]
    log = RunLog(None)
    result = run("t", model=ScriptedModel(replies), tools=workspace_tools(tmp_path, ["run_command"], sandbox=sandbox),
                 limits=Limits(tool_timeout_s=1.0), log=log)
    res = next(e for e in log.events if e["event"] == "result")
    body = json.loads(res["content"])
    assert body["error"] == "timeout"
    assert "started" in body.get("stdout", "")  # the command's own report, not the executor's
    assert "finished" not in body.get("stdout", "")  # cut mid-sleep: it never got to the end
    assert "may still be running" not in res["content"]
    assert "lowered" in body.get("timeout_note", "")
    assert result.stop.reason.value == "final_answer"


def test_where_tools_and_sync_models_run_and_bad_isolation_is_refused():
    """run(): the ring runs on a loop of its own on the caller's thread; a sync model and a "thread"
    tool go to the worker pool, an "inline" tool runs on the loop itself."""
    import threading

    from loopfence import tool

    seen: list[tuple[str, int]] = []

    class Where(ScriptedModel):
        def complete(self, request):
            seen.append(("model", threading.get_ident()))
            return super().complete(request)

    def where() -> str:
        seen.append(("tool", threading.get_ident()))
        return "here"

    replies = [calls_reply(tool_call("where", "{}")), text_reply("done")]
    for isolation in ("inline", "thread"):
        seen.clear()
        run("t", model=Where(replies), tools=[tool(where, isolation=isolation)], log=RunLog(None))
        assert [k for k, _ in seen] == ["model", "tool", "model"], isolation
        here = threading.get_ident()
        assert all(ident != here for k, ident in seen if k == "model"), (isolation, seen)
        assert (seen[1][1] == here) == (isolation == "inline"), (isolation, seen)
    with pytest.raises(ValueError, match="isolation"):
        tool(where, isolation="fiber")
