"""replay --execute-tools from what the workspace held at the start: the header's manifest, or the
run's snapshot archive; results name workspace-relative paths, so a replay elsewhere matches."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tarfile
from pathlib import Path
from typing import Any

import pytest

from loopfence import RunLog, ScriptedModel, StopReason, run, workspace_tools
from loopfence.cli import cli
from loopfence.runlog import LogError, read_log, replay
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools._manifest import (START_KEY, Manifest, compare, recorded_start, snapshot_path,
                                       workspace_manifest)
from loopfence._drivers._replay import WorkspaceDiffers

from _runlog_support import edit_events, make_workspace, read_lines

# Writes a new file, reads it, asks for a file that is not there (missing_file, with a similar
# name), lists the workspace, answers. Replayed where notes.txt already exists, write_file would say
# "created": false and the list would show it before the write: the run would diverge.
SCRIPT = [calls_reply(tool_call("write_file", path="notes.txt", content="a note\n")),
          calls_reply(tool_call("read_file", path="notes.txt"), tool_call("read_file", path="note.txt")),
          calls_reply(tool_call("list_dir")),
          text_reply("done")]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


def record(log: Path, ws: Path, script: list[Any] = SCRIPT, *, snapshot: bool = False,
           manifest: bool = True) -> Path:
    tools = workspace_tools(ws, sandbox=False, manifest=manifest, snapshot=snapshot_path(log) if snapshot else None)
    result = run("Write a note", model=ScriptedModel(list(script)), tools=tools, log=RunLog(log),
                 header={"workspace": str(ws.resolve())})
    assert result.stop.reason is StopReason.FINAL_ANSWER, result.stop
    return log


def header(log: Path) -> dict[str, Any]:
    return read_lines(log)[0]


def results(log: Path) -> list[dict[str, Any]]:
    return [e for e in read_lines(log) if e["event"] == "result"]


def replay_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli(["replay", *args])
    return code, capsys.readouterr().err


# -- the run that created a file ------------------------------------------------------------------
def test_a_run_that_created_a_file_replays_from_the_recorded_manifest(tmp_path: Path, ws: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log = record(tmp_path / "run.jsonl", ws)
    assert json.loads(results(log)[0]["content"])["created"] is True
    assert (ws / "notes.txt").read_text() == "a note\n"  # the workspace now holds what the run made
    start = recorded_start(header(log))
    assert start is not None and [e.path for e in start.entries] == ["README.md", "app", "app/config.py"]
    assert header(log)["tool_info"]["read_file"][START_KEY]["truncated"] is False

    code, err = replay_cli(capsys, str(log), "--execute-tools", "--workspace", str(ws))
    assert code == 0, err
    assert "replayed identically" in err and "write_file" in err  # it really ran
    assert "removed 1 entry it does not list (notes.txt)" in err
    assert (ws / "notes.txt").read_text() == "a note\n"  # the workspace itself is never touched


def test_a_log_without_a_manifest_keeps_the_old_behaviour(tmp_path: Path, ws: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = record(tmp_path / "run.jsonl", ws, manifest=False)
    assert recorded_start(header(log)) is None
    code, err = replay_cli(capsys, str(log), "--execute-tools")
    assert code == 1 and "replay diverges" in err and '\\"created\\": false' in err  # the copy had notes.txt


def test_the_run_replays_from_its_snapshot_even_without_the_workspace(tmp_path: Path, ws: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log = record(tmp_path / "run.jsonl", ws, snapshot=True)
    snap = recorded_start(header(log)).snapshot  # type: ignore[union-attr]
    archive = tmp_path / "run.workspace.tar.gz"
    assert snap is not None and snap["file"] == archive.name and snap["path"] == str(archive.resolve())
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["README.md", "app", "app/config.py"]
    (ws / "app" / "config.py").write_text("DEBUG = False\n")  # past what the manifest could put back
    (ws / "README.md").unlink()

    code, err = replay_cli(capsys, str(log), "--execute-tools", "--workspace", str(ws))
    assert code == 0, err
    assert "rebuilt from the run's snapshot" in err and "replayed identically" in err

    other = tmp_path / "elsewhere"  # another machine: the log and its archive, no workspace
    other.mkdir()
    for p in (log, archive):
        shutil.move(p, other / p.name)
    shutil.rmtree(ws)
    code, err = replay_cli(capsys, str(other / "run.jsonl"), "--execute-tools")
    assert code == 0, err
    assert f"snapshot {other / archive.name}" in err


def test_a_tampered_snapshot_is_refused_and_a_missing_one_falls_back(tmp_path: Path, ws: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    log = record(tmp_path / "run.jsonl", ws, snapshot=True)
    archive = tmp_path / "run.workspace.tar.gz"
    good = archive.read_bytes()
    archive.write_bytes(good[:-8] + bytes(8))
    code, err = replay_cli(capsys, str(log), "--execute-tools")
    assert code == 2 and "is not the one the run recorded" in err and "Traceback" not in err
    archive.unlink()
    code, err = replay_cli(capsys, str(log), "--execute-tools")
    assert code == 0, err
    assert "snapshot run.workspace.tar.gz is not here" in err and "checked against the recorded manifest" in err


# -- paths in results -----------------------------------------------------------------------------
def test_a_missing_file_result_names_no_absolute_host_path(tmp_path: Path, ws: Path) -> None:
    read_file = next(t for t in workspace_tools(ws, sandbox=False) if t.name == "read_file")
    body = read_file.fn(path="app/confg.py")
    assert body["error"] == "missing_file" and body["cwd"] == "." and body["similar"] == ["app/config.py"]
    text = json.dumps(body)
    assert str(ws) not in text and str(ws.resolve()) not in text and str(tmp_path) not in text

    log = record(tmp_path / "run.jsonl", ws)
    missing = json.loads(results(log)[2]["content"])
    assert missing["error"] == "missing_file" and missing["cwd"] == "." and missing["similar"] == ["notes.txt"]
    assert all(str(tmp_path) not in r["content"] for r in results(log))


def test_a_replay_in_another_folder_matches(tmp_path: Path, ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "other" / "place" / "copy-of-ws"
    shutil.copytree(ws, elsewhere)
    log = record(tmp_path / "run.jsonl", ws)
    shutil.rmtree(ws)
    code, err = replay_cli(capsys, str(log), "--execute-tools", "--workspace", str(elsewhere))
    assert code == 0, err
    assert "replayed identically" in err and "read_file" in err


# -- a workspace that is not the start ------------------------------------------------------------
def test_a_changed_file_is_refused_with_its_path(tmp_path: Path, ws: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    log = record(tmp_path / "run.jsonl", ws)
    (ws / "app" / "config.py").write_text("DEBUG = False\n")
    code, err = replay_cli(capsys, str(log), "--execute-tools")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert f"{ws.resolve()} is not the workspace the run started with: changed app/config.py " \
           "(14 bytes now, recorded 13)" in lines[0]
    assert "--workspace-as-is" in lines[0] and "--snapshot" in lines[0]
    with pytest.raises(WorkspaceDiffers) as info:
        replay(log, execute_tools=True)
    assert info.value.first == "app/config.py"

    code, err = replay_cli(capsys, str(log), "--execute-tools", "--workspace-as-is")
    assert code == 1 and "as it is (--workspace-as-is)" in err and "replay diverges" in err


def test_the_first_difference_is_named_missing_or_changed(tmp_path: Path, ws: Path) -> None:
    log = record(tmp_path / "run.jsonl", ws)
    (ws / "README.md").unlink()
    (ws / "app" / "config.py").write_text("DEBUG = None\n")  # same size, other content
    with pytest.raises(WorkspaceDiffers) as info:
        replay(log, execute_tools=True)
    msg = str(info.value)
    assert "missing README.md (recorded a file of 7 bytes) (and 1 more)" in msg
    (ws / "README.md").write_text("# demo\n")
    with pytest.raises(WorkspaceDiffers, match=r"changed app/config\.py \(same size, other content"):
        replay(log, execute_tools=True)


def test_what_the_manifest_alone_can_put_back_is_put_back(tmp_path: Path, ws: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "empty.txt").write_text("")
    (ws / "data").mkdir()
    (ws / "run.sh").write_text("echo hi\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("app/config.py", ws / "cfg")
    script = [calls_reply(tool_call("list_dir"), tool_call("list_dir", path="data"),
                          tool_call("read_file", path="empty.txt"), tool_call("read_file", path="cfg")),
              calls_reply(tool_call("write_file", path="empty.txt", content="filled\n")),
              text_reply("done")]
    log = record(tmp_path / "run.jsonl", ws, script)
    # after the run: the empty file was filled, the folder and the symlink went, an exec bit too
    (ws / "data").rmdir()
    (ws / "cfg").unlink()
    os.symlink("README.md", ws / "cfg")
    (ws / "run.sh").chmod(0o644)
    (ws / "later.txt").write_text("made after the run\n")
    differences = compare(recorded_start(header(log)), ws)  # type: ignore[arg-type]
    assert {(d.path, d.change) for d in differences} == {
        ("empty.txt", "changed"), ("data", "missing"), ("cfg", "changed"), ("run.sh", "changed"),
        ("later.txt", "created")}
    assert all(d.restorable for d in differences)
    code, err = replay_cli(capsys, str(log), "--execute-tools")
    assert code == 0, err
    assert "put back 4 entries as recorded" in err and "(later.txt)" in err


# -- the manifest itself --------------------------------------------------------------------------
def test_the_manifest_is_bounded_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    for i in range(6):
        (root / f"f{i}.txt").write_text("x" * 10)
    capped = workspace_manifest(root, max_entries=4).to_json()
    assert capped["truncated"] is True and len(capped["entries"]) == 4 and "only the first 4" in capped["cap"]
    few = workspace_manifest(root, max_hash_bytes=25).to_json()
    assert few["hashed_bytes"] == 20 and few["unhashed"] == 4 and "size only" in few["cap"]
    assert [e["sha256"] is None for e in few["entries"]] == [False, False, True, True, True, True]
    assert all(e["size"] == 10 for e in few["entries"])
    whole = workspace_manifest(root).to_json()
    assert whole["truncated"] is False and "cap" not in whole and whole["unhashed"] == 0


def test_the_manifest_skips_what_no_tool_can_use(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("do not copy me\n")
    os.symlink(outside, root / "leak")
    os.mkfifo(root / "pipe")
    (root / os.fsdecode(b"bad\xffname")).write_text("x")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "s.sock"))
        made = workspace_manifest(root, snapshot=tmp_path / "snap.tar.gz")
    finally:
        sock.close()
    data = made.to_json()
    assert {e["path"]: e.get("kind", "file") for e in data["entries"]} == {"leak": "symlink", "pipe": "fifo"}
    assert data["entries"][0]["target"] == str(outside)  # the link, never what it points at
    assert data["skipped"] == {"special_files": 1, "names_not_text": 1}
    with tarfile.open(tmp_path / "snap.tar.gz") as tar:
        assert all(m.issym() or m.isfifo() for m in tar.getmembers())
    assert b"do not copy me" not in (tmp_path / "snap.tar.gz").read_bytes()


def test_a_malformed_manifest_is_refused(tmp_path: Path, ws: Path) -> None:
    log = record(tmp_path / "run.jsonl", ws)

    def escape(events: list[dict[str, Any]]) -> None:
        events[0]["tool_info"]["read_file"][START_KEY]["entries"].append({"path": "../x", "size": 0, "sha256": None})

    def through_a_link(events: list[dict[str, Any]]) -> None:
        events[0]["tool_info"]["read_file"][START_KEY]["entries"][:0] = [
            {"path": "up", "kind": "symlink", "target": "/etc"}, {"path": "up/passwd", "size": 0, "sha256": None}]

    for change, why in ((escape, "not a relative path inside the workspace"),
                        (through_a_link, "its folder up is not listed before it as a folder")):
        bad = edit_events(log, tmp_path / "bad.jsonl", change)
        with pytest.raises(LogError, match=why):
            replay(bad, execute_tools=True)
        assert replay(bad).ok  # recorded results need no workspace


def test_hard_links_are_refused_again_in_the_replay(tmp_path: Path, ws: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    os.link(ws / "README.md", tmp_path / "other-name.md")
    log = record(tmp_path / "run.jsonl", ws, [calls_reply(tool_call("read_file", path="README.md")),
                                              text_reply("done")], snapshot=True)
    assert json.loads(results(log)[0]["content"])["error"] == "hardlinked_file"
    assert recorded_start(header(log)).entries[0].links == 2  # type: ignore[union-attr]
    code, err = replay_cli(capsys, str(log), "--execute-tools")  # from the snapshot
    assert code == 0, err
    (tmp_path / "run.workspace.tar.gz").unlink()
    code, err = replay_cli(capsys, str(log), "--execute-tools")  # from a copy (copies lose links)
    assert code == 0, err


# -- loopfence run --snapshot -----------------------------------------------------------------------
def test_loopfence_run_snapshot_next_to_a_log_inside_the_workspace(tmp_path: Path, ws: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in SCRIPT))
    log = ws / "runs" / "r.jsonl"
    code = cli(["run", "Write a note", "--script", str(script), "--workspace", str(ws), "--log", str(log),
                "--snapshot", "--quiet", "--unsandboxed"])
    capsys.readouterr()
    assert code == 0
    archive = ws / "runs" / "r.workspace.tar.gz"
    start = recorded_start(header(log))
    assert start is not None and start.snapshot is not None
    assert start.snapshot["path"] == str(archive.resolve())
    assert start.snapshot["sha256"] == __import__("hashlib").sha256(archive.read_bytes()).hexdigest()
    listed = {e.path: e for e in start.entries}
    assert "runs/r.workspace.tar.gz" not in listed  # the archive is not in itself
    assert listed["runs/r.jsonl"].size == 0  # the log, as it was when the run started

    code, err = replay_cli(capsys, str(log), "--execute-tools")
    assert code == 0 and "rebuilt from the run's snapshot" in err, err
    archive.rename(tmp_path / "kept.tar.gz")
    code, err = replay_cli(capsys, str(log), "--execute-tools")  # the log grew: an empty file, put back
    assert code == 0, err
    assert "put back 1 entry as recorded" in err and "notes.txt" in err


def test_replay_workspace_flags_need_execute_tools(tmp_path: Path, ws: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    log = record(tmp_path / "run.jsonl", ws)
    code, err = replay_cli(capsys, str(log), "--workspace", str(ws))
    assert code == 2 and "go with --execute-tools" in err


def test_manifest_round_trips_through_the_log(tmp_path: Path, ws: Path) -> None:
    log = record(tmp_path / "run.jsonl", ws, snapshot=True)
    data = read_log(log).header.record["tool_info"]["read_file"][START_KEY]
    assert Manifest.from_json(data).to_json() == data
