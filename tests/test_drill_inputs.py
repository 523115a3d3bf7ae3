"""Scenario files whose workspace cannot be built are scenario errors (exit 2), not failed runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfence.cli import cli
from loopfence.drill import ScenarioError, load_scenario
from loopfence.testing import text_reply


def scenario(**over: Any) -> dict[str, Any]:
    return {"name": "ws", "task": "t", "replies": [text_reply("done")], **over}


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    p = tmp_path / "s.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


@pytest.mark.parametrize("over, field", [
    ({"workspace": {"a": "x", "a/b": "y"}}, "workspace.a/b"),
    ({"workspace": {"a/b/c.txt": "y", "a/b": "x"}}, "workspace.a/b/c.txt"),
    ({"workspace": {"a/b": "x", "a//b": "y"}}, "workspace.a//b"),
    ({"workspace": {"a": "x"}, "symlinks": {"a/l": "t"}}, "symlinks.a/l"),
    ({"workspace": {"l/f.txt": "x"}, "symlinks": {"l": "elsewhere"}}, "workspace.l/f.txt"),
    ({"workspace": {"l": "x"}, "symlinks": {"l": "elsewhere"}}, "symlinks.l"),
])
def test_conflicting_workspace_entries_name_the_field(tmp_path: Path, over: dict[str, Any],
                                                      field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, scenario(**over)))
    assert info.value.field == field


def test_a_file_and_a_folder_of_the_same_name_is_exit_2(tmp_path: Path, capsys: Any) -> None:
    p = write(tmp_path, scenario(workspace={"a": "x", "a/b": "y"}))
    rc = cli(["drill", str(p), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{p}: workspace.a/b:" in err and "Traceback" not in err
    [row] = json.loads((tmp_path / "out" / "results.json").read_text())["scenarios"]  # an error row
    assert row["pass"] is False and f"{p}: workspace.a/b:" in row["error"]


def test_siblings_and_nested_files_are_fine(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, scenario(workspace={"a/b.txt": "1", "a/c/d.txt": "2", "ab": "3"},
                                               symlinks={"a/l": "b.txt"})))
    assert set(s.workspace) == {"a/b.txt", "a/c/d.txt", "ab"} and s.symlinks == {"a/l": "b.txt"}
