"""The path guard: the workspace root is the jail; refusals are structured results, never exceptions."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfence.tools import Executor, ToolResult, workspace_tools
from loopfence.tools._pathguard import Jail, Located, Refusal

SECRET = "outside-secret-7f3a9c"


def make_tree(base: Path) -> tuple[Path, Path]:
    """base/ws (the workspace) and base/outside (must never be read or written through the tools)."""
    ws, outside = base / "ws", base / "outside"
    (ws / "sub" / "deeper").mkdir(parents=True)
    (ws / "pages").mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (ws / "a.txt").write_text("inside a\n")
    (ws / "sub" / "b.txt").write_text("inside b\n")
    (ws / "pages" / "pi-post-text.txt").write_text("the real page\n")
    os.symlink("/", ws / "link_root")
    os.symlink("../outside", ws / "link_out")
    os.symlink(str(outside), ws / "link_abs_out")
    os.symlink(str(outside / "secret.txt"), ws / "peek.txt")
    os.symlink("sub", ws / "link_in")
    os.symlink("sub/deeper/..", ws / "link_up_in")
    os.symlink("loop", ws / "loop")
    return ws, outside


def tools_for(ws: Path) -> dict[str, object]:
    return {t.name: t for t in workspace_tools(ws, names=["read_file", "list_dir", "write_file", "apply_patch"])}


def call(tools: dict[str, object], name: str, **args: object) -> ToolResult:
    t = tools[name]
    return Executor().execute(t, t.validate(args), 10)  # type: ignore[attr-defined]


def body(result: ToolResult) -> dict[str, object]:
    return json.loads(result.content)


ESCAPES = ["../x", "a/../../x", "/etc/passwd", "link_root/etc/passwd", "link_root", "a\\..\\..\\x",
           "x\x00y", "/proc/self/environ", "link_out/secret.txt", "link_abs_out/secret.txt", "peek.txt",
           "sub/../../outside/secret.txt", "", "   "]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("tool", ["read_file", "list_dir", "write_file"])
def test_escape_corpus_is_refused_with_a_structured_result(tmp_path: Path, path: str, tool: str) -> None:
    ws, outside = make_tree(tmp_path)
    tools = tools_for(ws)
    args = {"path": path, "content": "pwned"} if tool == "write_file" else {"path": path}
    result = call(tools, tool, **args)
    assert not result.ok
    data = body(result)
    assert data["ok"] is False
    assert data["error"] in {"path_outside_workspace", "invalid_path"}
    assert data["path"] == path
    assert SECRET not in result.content
    assert (outside / "secret.txt").read_text() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_escape_messages_name_the_reason(tmp_path: Path) -> None:
    ws, _ = make_tree(tmp_path)
    jail = Jail(ws)
    reasons = {p: jail.locate(p) for p in ["../x", "link_root/etc", "a\\b", "x\x00y", "", "link_out/x"]}
    assert all(isinstance(r, Refusal) for r in reasons.values())
    assert "leaves the workspace" in reasons["../x"].reason  # type: ignore[union-attr]
    assert "symlink to /" in reasons["link_root/etc"].reason  # type: ignore[union-attr]
    assert "backslash" in reasons["a\\b"].reason  # type: ignore[union-attr]
    assert "NUL" in reasons["x\x00y"].reason  # type: ignore[union-attr]
    assert "empty" in reasons[""].reason  # type: ignore[union-attr]
    assert "link_out is a symlink" in reasons["link_out/x"].reason  # type: ignore[union-attr]


def test_paths_inside_the_root_are_allowed(tmp_path: Path) -> None:
    ws, _ = make_tree(tmp_path)
    jail = Jail(ws)
    assert jail.locate("sub/../a.txt") == Located(("a.txt",), "file")
    assert jail.locate("link_in/b.txt") == Located(("sub", "b.txt"), "file")
    assert jail.locate("link_up_in/b.txt") == Located(("sub", "b.txt"), "file")
    assert jail.locate(str(ws / "sub" / "b.txt")) == Located(("sub", "b.txt"), "file")
    assert jail.locate("./sub/") == Located(("sub",), "dir")
    assert jail.locate(".") == Located((), "dir")
    assert jail.locate("new/../also-new.txt") == Located(("also-new.txt",), "missing")
    loop = jail.locate("loop/x")
    assert isinstance(loop, Refusal) and loop.error == "symlink_loop"


def test_a_missing_prefix_does_not_hide_a_symlink_after_dotdot(tmp_path: Path) -> None:
    ws, _ = make_tree(tmp_path)
    found = Jail(ws).locate("nope/../link_out/secret.txt")
    assert isinstance(found, Refusal) and found.error == "path_outside_workspace"


def test_special_files_are_refused(tmp_path: Path) -> None:
    ws, _ = make_tree(tmp_path)
    os.mkfifo(ws / "pipe")
    os.symlink("/dev/zero", ws / "zero")
    tools = tools_for(ws)
    fifo = body(call(tools, "read_file", path="pipe"))  # would block forever if opened
    assert fifo["error"] == "special_file" and "FIFO" in str(fifo["message"])
    assert body(call(tools, "write_file", path="pipe", content="x"))["error"] == "special_file"
    assert body(call(tools, "read_file", path="zero"))["error"] == "path_outside_workspace"
    assert body(call(tools, "read_file", path="/dev/zero"))["error"] == "path_outside_workspace"


def test_missing_file_lists_the_similar_existing_name(tmp_path: Path) -> None:
    ws, _ = make_tree(tmp_path)
    result = call(tools_for(ws), "read_file", path="pages/pi-post-text-text.txt", page=4)
    data = body(result)
    assert data == {"ok": False, "error": "missing_file", "path": "pages/pi-post-text-text.txt",
                    "cwd": ".", "hint": "do_not_retry_same_path",
                    "similar": data["similar"], "message": data["message"]}
    assert data["similar"][0] == "pages/pi-post-text.txt"
    assert len(data["similar"]) <= 3
    assert result.error == "missing_file"


def test_missing_folder_for_list_dir_suggests_folders(tmp_path: Path) -> None:
    ws, _ = make_tree(tmp_path)
    data = body(call(tools_for(ws), "list_dir", path="page"))
    assert data["error"] == "missing_file" and data["similar"] == ["pages"]


@pytest.mark.parametrize("changed", ["readlink", "lstat"])
def test_a_path_changed_while_it_is_checked_is_refused_without_the_host_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changed: str) -> None:
    """Another process swaps a folder and a symlink between two looks at it: the check answers a
    refusal (it never raises), and names only the model's path."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("a")
    (tmp_path / "d").symlink_to("real")
    jail = Jail(tmp_path)
    real_lstat, calls = os.lstat, []

    def gone(*args: object) -> object:
        raise FileNotFoundError(2, "No such file or directory", str(args[0]))

    def lstat_then_gone(path: object, *rest: object) -> object:
        calls.append(path)
        return gone(path) if len(calls) > 3 else real_lstat(path, *rest)  # type: ignore[arg-type]  # the last look

    if changed == "readlink":
        monkeypatch.setattr("loopfence.tools._pathguard.os.readlink", gone)
    else:
        monkeypatch.setattr("loopfence.tools._pathguard.os.lstat", lstat_then_gone)
    loc = jail.locate("d/a.txt")
    assert isinstance(loc, Refusal) and "changed while it was being checked" in loc.reason
    assert str(tmp_path) not in json.dumps(loc.to_dict())


def test_a_symlink_swapped_in_after_the_check_is_not_followed(tmp_path: Path) -> None:
    """The open walks the canonical path with O_NOFOLLOW: a race cannot redirect it outside."""
    ws, outside = make_tree(tmp_path)
    jail = Jail(ws)
    loc = jail.locate("sub/b.txt")
    assert isinstance(loc, Located)
    (ws / "sub" / "b.txt").unlink()
    os.symlink(str(outside / "secret.txt"), ws / "sub" / "b.txt")
    with pytest.raises(OSError):
        jail.read_bytes(loc, 1000)
    (ws / "sub" / "b.txt").unlink()
    (ws / "sub").rename(ws / "sub2")
    os.symlink(str(outside), ws / "sub")
    with pytest.raises(OSError):
        jail.write_bytes(loc, b"pwned")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


# ------------------------------------------------------------------ the property

SEGMENTS = ["..", ".", "", "a.txt", "sub", "deeper", "b.txt", "link_root", "link_out", "link_abs_out",
            "link_in", "link_up_in", "peek.txt", "loop", "outside", "secret.txt", "ws", "etc", "passwd",
            "new", "x"]


def snapshot(base: Path, skip: Path) -> dict[str, bytes | str]:
    """Everything under `base` except the workspace: names, link targets and file bytes."""
    seen: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        if Path(dirpath) == skip:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            seen[str(p)] = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return seen


OUTSIDE_NAMES = {"secret.txt", "sibling.txt", "ws"}  # names that only exist outside the workspace


@st.composite
def jail_paths(draw: st.DrawFn, prefixes: list[str]) -> str:
    head = draw(st.sampled_from(["", "", "", *prefixes]))
    parts = draw(st.lists(st.one_of(st.sampled_from(SEGMENTS), st.text(min_size=1, max_size=4)),
                          min_size=0, max_size=7))
    return head + "/".join(parts)


def test_property_nothing_outside_the_root_is_ever_read_or_written() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp).resolve()
        ws, outside = make_tree(base)
        (base / "sibling.txt").write_text(SECRET)
        before = snapshot(base, ws)
        tools = tools_for(ws)
        prefixes = [str(ws) + "/", str(outside) + "/", str(base) + "/", str(ws) + "/../", "/"]

        @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
        @given(path=jail_paths(prefixes), op=st.sampled_from(["read", "list", "write", "patch"]))
        def check(path: str, op: str) -> None:
            tail = next((path[len(p):] for p in sorted(prefixes, key=len, reverse=True)
                         if path.startswith(p)), path)
            if op in ("write", "patch") and OUTSIDE_NAMES & set(tail.split("/")):
                return  # a file by an outside name, made inside, would blur the listing check below
            if op == "read":
                result = call(tools, "read_file", path=path)
            elif op == "list":
                result = call(tools, "list_dir", path=path)
            elif op == "write":
                if path.startswith("/") and not path.startswith(str(base)):
                    return  # never aim a write at the real system outside the test folder
                result = call(tools, "write_file", path=path, content="W")
            else:
                if path.startswith("/") and not path.startswith(str(base)):
                    return
                patch = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+P\n"
                result = call(tools, "apply_patch", patch=patch)
            assert isinstance(result, ToolResult)
            if op == "list" and result.ok:
                names = result.content.splitlines()[1:]
                assert not OUTSIDE_NAMES & {n.rstrip("/") for n in names}
            assert SECRET not in result.content
            assert result.ok or json.loads(result.content)["ok"] is False
            assert snapshot(base, ws) == before

        check()
