"""The README's custom guard runs as written, with only public imports, and stops the run."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from loopfence import Limits, RunLog, ScriptedModel, StopReason, Verdict, run, tool

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


def test_readme_guard_stops_the_second_delete() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(readme_snippet(), str(README), "exec"), namespace)  # noqa: S102
    deleted: list[str] = []

    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"deleted {path}"

    def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path}"

    model = ScriptedModel([calls(("delete_file", {"path": "a.txt"})), calls(("read_file", {"path": "b.txt"})),
                           calls(("delete_file", {"path": "b.txt"})),
                           {"choices": [{"finish_reason": "stop", "message": {"role": "assistant",
                                                                              "content": "done"}}]}])
    log = RunLog()
    result = run("tidy up", model=model, tools=[tool(delete_file, kind="side_effect"), tool(read_file)],
                 limits=Limits(), guards=[namespace["DeleteTwice"]()], log=log)
    assert result.stop.reason is StopReason.REPEATED_CALL
    assert "delete_file: a second delete_* call" in result.stop.detail
    assert result.verdict is Verdict.KILL
    assert deleted == ["a.txt"]  # the second delete never ran
    assert log.events[-1]["event"] == "stop" and log.events[-1]["reason"] == "repeated_call"
