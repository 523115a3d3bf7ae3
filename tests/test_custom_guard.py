"""The README's custom guard runs as written, with only public imports, and stops the run."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from loopfence import Guard, Limits, RunLog, RunView, ScriptedModel, StopReason, Verdict, run, tool
from loopfence.runlog import read_log, reconcile

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_snippet() -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- custom-guard -->\n```python\n(.*?)```\n<!-- /custom-guard -->", text, re.S)
    assert found, "README.md lost its <!-- custom-guard --> python block"
    return found.group(1)


def test_snippet_imports_only_public_names() -> None:
    for node in ast.walk(ast.parse(readme_snippet())):
        if isinstance(node, ast.ImportFrom):
            assert node.module == "loopfence" and node.level == 0, ast.unparse(node)
        assert not isinstance(node, ast.Import), ast.unparse(node)


def calls(*names_args: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}
                           for i, (name, args) in enumerate(names_args)]}}]}


def _tools(deleted: list[str]) -> list[Any]:
    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"deleted {path}"

    def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path}"

    return [tool(delete_file, kind="side_effect"), tool(read_file)]


ANSWER = {"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}]}


def _readme_guard() -> type:
    namespace: dict[str, Any] = {}
    exec(compile(readme_snippet(), str(README), "exec"), namespace)  # noqa: S102
    return namespace["DeleteTwice"]  # type: ignore[no-any-return]


def test_readme_guard_stops_the_second_delete(tmp_path: Path) -> None:
    guard = _readme_guard()
    deleted: list[str] = []
    model = ScriptedModel([calls(("delete_file", {"path": "a.txt"})), calls(("read_file", {"path": "b.txt"})),
                           calls(("delete_file", {"path": "b.txt"})), ANSWER])
    path = tmp_path / "run.jsonl"
    result = run("tidy up", model=model, tools=_tools(deleted), limits=Limits(), guards=[guard()], log=path)
    assert result.stop.reason is StopReason.GUARD
    assert result.stop.data == {"guard": "DeleteTwice", "limit": 1, "value": 2}
    assert "delete_file: a second delete_* call" in result.stop.detail
    assert result.verdict is Verdict.KILL
    assert deleted == ["a.txt"]  # the second delete never ran
    events = read_log(path).events
    notes = [e.record for e in events if e.event == "guard"]
    assert [(n["guard"], n["message"], n["data"]) for n in notes] == [
        ("DeleteTwice", "delete number 1", {"path": "a.txt"}), ("DeleteTwice", "delete number 2", {"path": "b.txt"})]
    assert events[-1].record["reason"] == "guard"
    # reconcile re-checks the stop with the guard it is given; without it, it says whose stop it was
    assert reconcile(path, guards=[guard()]).ok
    without = reconcile(path)  # the stop's check cannot be made without it: unchecked, naming it, not failed
    assert without.holds and not without.ok  # what was checked holds; not all of it could be
    assert without.unchecked == ("limit_reached",) and without.custom_guards == ("DeleteTwice",)
    assert "limit_reached" not in {c.name for c in without.checks}
    assert "custom guard DeleteTwice" in without.why_unchecked("limit_reached")


def test_refuse_refuses_one_call_and_the_run_goes_on() -> None:
    class NoDeletes(Guard):
        name = "no-deletes"

        def before_execution(self, s: RunView, c: Any, reuse: bool) -> Any:
            return self.refuse("deleting is not allowed here") if c.tool.name == "delete_file" else None

    deleted: list[str] = []
    log = RunLog()
    model = ScriptedModel([calls(("delete_file", {"path": "a.txt"})), ANSWER])
    result = run("tidy up", model=model, tools=_tools(deleted), guards=[NoDeletes()], log=log)
    assert result.stop.reason is StopReason.FINAL_ANSWER and deleted == []
    refused = [e for e in log.events if e["event"] == "result"]
    assert refused[0]["decision"] == "refused" and refused[0]["error"] == "guard:no-deletes"
    assert json.loads(refused[0]["content"])["message"] == "deleting is not allowed here"
    assert result.ledger.refused == 1 and result.ledger.tool_executions == 0
