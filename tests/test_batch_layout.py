"""Where a batch folder sits (issue 30, item 1): an `--out` inside an episode's workspace is left out of
each episode's copy (the copy never holds the batch folder, its logs or another episode's copy), and a
workspace that is the batch folder itself is refused with one line before anything is written.
Through the CLI (the issue's repro), the Python `batch()` API, and (tests/test_batch_ray.py) Ray.
And (item 11) the progress line after `--resume` counts every row, not only this run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfence import ScriptedModel, batch
from loopfence._batch import BatchError, Episode
from loopfence.cli import cli
from loopfence.testing import calls_reply, text_reply, tool_call

OK = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_issue_repro_runs_and_the_copy_leaves_the_batch_folder_out(tmp_path: Path, monkeypatch: Any,
                                                                       capsys: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "config.py").write_text("DEBUG=False\n")
    (tmp_path / "r.jsonl").write_text(json.dumps(OK) + "\n")
    (tmp_path / "eps.jsonl").write_text(json.dumps({"id": "e1", "task": "t", "workspace": "."}) + "\n")
    rc = cli(["batch", "eps.jsonl", "--out", "runs/job", "--script", "r.jsonl", "--keep-workspaces", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert [json.loads(x)["stop"] for x in cap.out.splitlines()] == ["final_answer"]
    assert len(cap.err.splitlines()) < 40  # a summary, not a traceback
    copy = tmp_path / "runs" / "job" / "workspaces" / "e1"
    assert _files(copy) == {"app", "app/config.py", "r.jsonl", "eps.jsonl", "runs"}  # runs/ holds only the job
    assert _files(tmp_path / "runs") >= {"job/results.jsonl", "job/episodes/e1.jsonl"}


def test_the_python_api_copies_each_workspace_without_the_batch_or_the_other_copies(tmp_path: Path) -> None:
    ws = tmp_path / "repo"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print(1)\n")
    out = ws / "runs" / "job"  # inside the workspace both episodes copy, while both run
    eps = [{"id": name, "task": "list", "workspace": "repo", "tools": ["list_dir", "write_file"]}
           for name in ("a", "b")]
    (tmp_path / "eps.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))

    def model(ep: Episode) -> ScriptedModel:
        return ScriptedModel([calls_reply(tool_call("write_file", path="mine.txt", content=ep.id)),
                              calls_reply(tool_call("list_dir", path=".")), text_reply("done")])

    result = batch(tmp_path / "eps.jsonl", model=model, out=out, keep_workspaces=True, concurrency=2)
    assert [r.stop for r in result.rows] == ["final_answer", "final_answer"], result.rows
    for name in ("a", "b"):
        assert _files(out / "workspaces" / name) == {"src", "src/main.py", "runs", "mine.txt"}
    assert _files(ws) - {p for p in _files(ws) if p.startswith("runs/job/")} == {"src", "src/main.py", "runs",
                                                                                  "runs/job"}


@pytest.mark.parametrize("where", ["itself", "copies"])
def test_a_workspace_that_is_the_batch_folder_or_inside_its_copies_is_refused(tmp_path: Path, where: str,
                                                                              capsys: Any) -> None:
    out = tmp_path / "job"
    ws = out if where == "itself" else out / "workspaces" / "x"
    ws.mkdir(parents=True)
    eps = tmp_path / "eps.jsonl"
    eps.write_text(json.dumps({"id": "e1", "task": "t", "workspace": str(ws)}) + "\n")
    with pytest.raises(BatchError) as caught:
        batch(eps, model=ScriptedModel([text_reply("done")]), out=out)
    message = str(caught.value)
    assert "'e1' (line 1): workspace:" in message and str(ws) in message and f"--out {out}" in message
    assert not (out / "job.json").exists() and not (out / "episodes").exists()  # nothing written
    script = tmp_path / "r.jsonl"
    script.write_text(json.dumps(OK) + "\n")
    assert cli(["batch", str(eps), "--out", str(out), "--script", str(script)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "each copy would hold itself" in err, err


def test_the_progress_line_after_resume_counts_every_row(tmp_path: Path, capsys: Any) -> None:
    eps = tmp_path / "eps.jsonl"
    eps.write_text("".join(json.dumps({"id": f"e{i}", "task": "t"}) + "\n" for i in range(5)))
    script = tmp_path / "r.jsonl"
    script.write_text(json.dumps(OK) + "\n")
    out = tmp_path / "job"
    assert cli(["batch", str(eps), "--out", str(out), "--script", str(script)]) == 0
    rows = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("".join(x + "\n" for x in rows[:3]))  # two rows lost to a kill
    for ident in ("e3", "e4"):
        (out / "episodes" / f"{ident}.jsonl").unlink()
    capsys.readouterr()
    assert cli(["batch", "--resume", str(out)]) == 0
    err = capsys.readouterr().err
    progress = [x for x in err.splitlines() if x.startswith("batch: 5/5 done")]
    assert progress and progress[-1].endswith("; final_answer 5"), err  # not "final_answer 2"
    assert json.loads((out / "summary.json").read_text())["by_stop"] == {"final_answer": 5}
