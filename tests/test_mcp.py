"""MCP tools under the fence, against real servers: tests/_mcp_server.py (the SDK's FastMCP) started
as a stdio process, and over Streamable HTTP on 127.0.0.1. No mocks of the client.

Two servers with the same tools (alpha: annotations trusted; beta: not) share one group for most
tests, so every name collides and is namespaced (alpha__read_note, beta__read_note).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _mcp_support import SERVER, alive, calls, http_server, pids, seen, server, wait_for
from loopfence import Limits, ScriptedModel, arun, run, tool
from loopfence.runlog import read_log, reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

mcp = pytest.importorskip("loopfence.mcp")
START_S = 120.0  # how long a server may take to start here: a bound for a failure on a busy machine, not a speed


def group_of(*servers: Any, **options: Any) -> Any:
    return mcp.mcp_tools(*servers, **{"connect_timeout_s": START_S, **options})


@pytest.fixture(scope="module")
def calls_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "calls.jsonl"


@pytest.fixture(scope="module")
def pair(calls_log: Path) -> Any:
    """alpha (annotations trusted) and beta (not): the same tools, so every name is namespaced."""
    group = group_of(server(calls_log, "--name", "alpha"), server(calls_log, "--name", "beta"),
                          trust_annotations=["alpha"], kinds={"beta__touch_note": "read_only"})
    with group:
        yield group


def fenced(group: Any, tmp_path: Path, *replies: Any, extra: tuple[Any, ...] = (), **limits: Any) -> tuple[Any, Any]:
    """Run the scripted replies against the group's tools (and `extra` ones) with run(); (result,
    the log read back, which must reconcile)."""
    path = tmp_path / "run.jsonl"
    result = run("use the notes", model=ScriptedModel(list(replies)), tools=[*group, *extra], log=path,
                 header=group.header(), limits=Limits(**limits))
    check = reconcile(path)
    assert check.ok, [str(c) for c in check.failed]
    return result, read_log(path)


def results(log: Any) -> list[Any]:
    return [e for e in log.events if e.event == "result"]


def tool_results(result: Any) -> list[dict[str, Any] | str]:
    out = []
    for m in result.messages:
        if m.get("role") == "tool":
            try:
                out.append(json.loads(m["content"]))
            except ValueError:
                out.append(m["content"])
    return out


# -- names, kinds, the header ---------------------------------------------------------------------
def test_colliding_names_are_namespaced_and_logged_with_their_server(pair: Any, tmp_path: Path) -> None:
    names = pair.names()
    assert "alpha__read_note" in names and "beta__read_note" in names
    assert "read_note" not in names  # a bare name would be ambiguous
    _, log = fenced(pair, tmp_path, calls_reply(tool_call("beta__read_note", path="a.md")), text_reply("ok"))
    info = log.header.record["tool_info"]
    assert info["beta__read_note"]["mcp"]["server"] == "beta"
    assert info["beta__read_note"]["mcp"]["tool"] == "read_note"
    assert info["alpha__read_note"]["mcp"]["server"] == "alpha"
    servers = {s["name"]: s for s in log.header.record["mcp"]["servers"]}
    assert servers["beta"]["tools"]["beta__read_note"] == "read_note"
    assert servers["alpha"]["command"][-2:] == ["--name", "alpha"]
    assert "MCP_TEST_LOG" in servers["alpha"]["env"]  # the name, never the value
    assert str(Path(servers["alpha"]["command"][1]).name) == "_mcp_server.py"


def test_no_collision_keeps_the_servers_names(calls_log: Path, tmp_path: Path) -> None:
    with group_of(server(calls_log, "--name", "solo", "--tools", "read_note,fetch"),
                       reserved=["fetch"]) as group:
        assert sorted(group.names()) == ["read_note", "solo__fetch"]  # `fetch` is taken by another tool


def test_trust_annotations_on_and_off_set_the_kinds_and_say_why(pair: Any, tmp_path: Path) -> None:
    _, log = fenced(pair, tmp_path, text_reply("nothing to do"))
    tools = {t["function"]["name"]: t for t in log.header.record["tools"]}
    info = log.header.record["tool_info"]
    trusted = {s["name"]: s["trust_annotations"] for s in log.header.record["mcp"]["servers"]}
    assert trusted == {"alpha": True, "beta": False}
    # trusted: readOnlyHint -> read_only; openWorldHint false -> trusted output
    assert (tools["alpha__read_note"]["kind"], tools["alpha__read_note"]["privileged"],
            tools["alpha__read_note"]["untrusted"]) == ("read_only", False, False)
    assert "readOnlyHint=true" in info["alpha__read_note"]["mcp"]["why"]
    # trusted, read-only but open world (openWorldHint absent): its output is untrusted
    assert (tools["alpha__fetch"]["kind"], tools["alpha__fetch"]["untrusted"]) == ("read_only", True)
    # trusted, destructiveHint true: stays privileged; destructiveHint false: not privileged
    assert (tools["alpha__delete_note"]["kind"], tools["alpha__delete_note"]["privileged"]) == ("side_effect", True)
    assert (tools["alpha__touch_note"]["privileged"], tools["alpha__touch_note"]["untrusted"]) == (False, False)
    # untrusted server: the same annotations count for nothing
    for name in ("beta__read_note", "beta__fetch", "beta__delete_note"):
        assert (tools[name]["kind"], tools[name]["privileged"], tools[name]["untrusted"]) == \
            ("side_effect", True, True), name
        assert "not trusted" in info[name]["mcp"]["why"]
    assert info["beta__read_note"]["mcp"]["annotations"] == {"readOnlyHint": True, "openWorldHint": False}
    # an override by name wins, and says so
    assert tools["beta__touch_note"]["kind"] == "read_only"
    assert "overridden by kinds=" in info["beta__touch_note"]["mcp"]["why"]


def test_mcp_tools_pass_the_tool_conformance_kit(pair: Any) -> None:
    from loopfence.testing import check_tool

    by_name = {t.name: t for t in pair}
    check_tool(by_name["alpha__read_note"], {"path": "a.md"}, bad_args={"path": "../a.md"},
               failing_args={"path": "gone.md"})
    check_tool(by_name["beta__add"], {"a": 1, "b": 2})


# -- canonical keys, the cache, repetition ----------------------------------------------------------
def test_reordered_and_defaulted_arguments_are_one_call_reused_when_trusted(pair: Any, calls_log: Path,
                                                                            tmp_path: Path) -> None:
    before = len(calls(calls_log, "read_note", "alpha"))
    result, log = fenced(pair, tmp_path,
                         calls_reply(tool_call("alpha__read_note", '{"page": 1, "path": "b.md"}')),
                         calls_reply(tool_call("alpha__read_note", '{"path": "b.md"}')),
                         text_reply("done"))
    assert result.stop.reason == "no_progress"  # the second ask was answered from the cache
    assert (result.ledger.tool_executions, result.ledger.reused) == (1, 1)
    assert [r.decision for r in results(log)] == ["executed", "reused"]
    assert len(calls(calls_log, "read_note", "alpha")) == before + 1  # one call reached the server


def test_reordered_and_defaulted_arguments_repeat_when_not_trusted(pair: Any, calls_log: Path,
                                                                   tmp_path: Path) -> None:
    before = len(calls(calls_log, "read_note", "beta"))
    result, log = fenced(pair, tmp_path,
                         calls_reply(tool_call("beta__read_note", '{"page": 1, "path": "b.md"}')),
                         calls_reply(tool_call("beta__read_note", '{"path": "b.md"}')),
                         text_reply("done"), max_repeats=2)
    assert result.stop.reason == "repeated_call"  # the same canonical call, nothing changed in between
    assert result.ledger.tool_executions == 1
    assert len(calls(calls_log, "read_note", "beta")) == before + 1


def test_another_page_is_another_call(pair: Any, tmp_path: Path) -> None:
    """The control for the two above: a different argument is a different key."""
    result, _ = fenced(pair, tmp_path,
                       calls_reply(tool_call("alpha__read_note", path="b.md")),
                       calls_reply(tool_call("alpha__read_note", path="b.md", page=2)),
                       text_reply("done"))
    assert result.stop.reason == "final_answer"
    assert result.ledger.tool_executions == 2


@pytest.mark.parametrize("name, stop, executions", [("alpha__read_note", "no_progress", 1),
                                                    ("beta__read_note", "repeated_call", 1)])
def test_the_same_missing_read_forever(pair: Any, tmp_path: Path, name: str, stop: str,
                                       executions: int) -> None:
    """Seed runaway: a model that reads a missing note forever (the last reply repeats). Trusted, the
    read is read_only: one execution, then the cache, then no_progress. Not trusted, it is a side
    effect: asked again with nothing changed, it is refused (not run again) until repeated_call."""
    result, log = fenced(pair, tmp_path, calls_reply(tool_call(name, path="gone.md")))
    assert result.stop.reason == stop
    assert result.ledger.tool_executions == executions
    first = tool_results(result)[0]
    assert isinstance(first, dict) and first["error"] == "tool_error" and "no note named" in first["message"]


# -- the contract ----------------------------------------------------------------------------------
def test_arguments_are_checked_with_the_full_input_schema_before_sending(pair: Any, calls_log: Path,
                                                                         tmp_path: Path) -> None:
    before = len(calls(calls_log, "read_note"))
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("alpha__read_note", path="../secrets.md")),
                         text_reply("done"))
    assert result.stop.reason == "schema_mismatch"  # `pattern`: the subset validator would have let it through
    assert "does not match" in result.stop.detail
    assert result.ledger.tool_executions == 0
    assert len(calls(calls_log, "read_note")) == before  # nothing was sent


def test_is_error_becomes_a_structured_result_the_run_goes_on(pair: Any, tmp_path: Path) -> None:
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("alpha__fail", why="disk full")),
                         text_reply("it failed"))
    assert result.stop.reason == "final_answer"
    [res] = results(log)
    assert (res.ok, res.error, res.decision) == (False, "tool_error", "executed")
    body = json.loads(res.content)
    assert body["server"] == "alpha" and body["tool"] == "fail" and "disk full" in body["message"]


def test_structured_output_that_fits_its_schema(pair: Any, tmp_path: Path) -> None:
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("alpha__add", a=2)), text_reply("done"))
    assert tool_results(result) == [2]  # b defaulted to 0 (and bound so in the key)
    assert result.stop.reason == "final_answer"
    assert results(log)[0].record.get("violation") is None


def test_output_schema_is_checked_like_a_result_model(pair: Any, tmp_path: Path) -> None:
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("alpha__bad_output")), text_reply("done"))
    assert result.stop.reason == "schema_mismatch"
    assert "structuredContent.count" in result.stop.detail and "integer" in result.stop.detail
    assert results(log)[-1].record["violation"] == result.stop.detail


def test_a_megabyte_of_text_is_capped_with_the_marker(pair: Any, tmp_path: Path) -> None:
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("alpha__big", size=1_000_000)),
                         text_reply("done"))
    [res] = results(log)
    assert res.ok and len(res.content) < 20_000
    assert res.content.endswith("[truncated: 1,000,000 characters, showing the first 16,000]")


def test_image_and_resource_content_become_text(pair: Any, tmp_path: Path) -> None:
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("alpha__mixed")), text_reply("done"))
    [res] = results(log)
    assert res.ok and res.content.split("\n") == [
        "the chart:", "[image: image/png, 4 bytes]", "[resource file:///notes/a.md]", "alpha notes",
        "[resource file:///data.bin: application/x-thing, 3 bytes]", "[resource link: file:///notes/b.md (b.md beta notes)]"]


# -- the gate --------------------------------------------------------------------------------------
def test_untrusted_fetch_taints_and_a_privileged_call_after_it_is_refused(pair: Any, calls_log: Path,
                                                                          tmp_path: Path) -> None:
    before = len(calls(calls_log, "delete_note"))
    result, log = fenced(pair, tmp_path,
                         calls_reply(tool_call("alpha__fetch", url="http://127.0.0.1/release-notes")),
                         calls_reply(tool_call("alpha__delete_note", path="a.md")),
                         text_reply("done"))
    fetched, refused = results(log)
    assert fetched.untrusted and fetched.ok
    assert (refused.decision, refused.error) == ("refused", "permission_denied")
    gates = [(e.record["decision"], e.record["name"]) for e in log.events if e.event == "gate"]
    assert gates[:2] == [("tainted", "alpha__fetch"), ("refused", "alpha__delete_note")]
    assert len(calls(calls_log, "delete_note")) == before  # the server never saw it


def test_a_privileged_call_without_taint_runs(pair: Any, calls_log: Path, tmp_path: Path) -> None:
    """The control: the same privileged call with nothing untrusted before it."""
    before = len(calls(calls_log, "touch_note"))
    result, log = fenced(pair, tmp_path, calls_reply(tool_call("beta__touch_note", path="a.md")),
                         text_reply("done"))
    gates = [e.record["decision"] for e in log.events if e.event == "gate"]
    # beta is untrusted: touch_note is privileged (allowed while nothing taints the run), and its own
    # output is untrusted (it taints the run from then on)
    assert gates == ["allowed", "tainted"]
    assert results(log)[0].decision == "executed"
    assert len(calls(calls_log, "touch_note")) == before + 1


# -- faults ----------------------------------------------------------------------------------------
def test_a_call_past_its_timeout_is_cancelled_on_the_server_and_the_run_goes_on(tmp_path: Path) -> None:
    log_path = tmp_path / "calls.jsonl"
    with group_of(server(log_path, "--name", "sleepy", "--tools", "slow,read_note")) as group:
        result, log = fenced(group, tmp_path, calls_reply(tool_call("slow", seconds=120)),
                             text_reply("gave up on it"), tool_timeout_s=1)
        [res] = results(log)
        assert (res.ok, res.error) == (False, "timeout")
        assert "cancelled" in json.loads(res.content)["message"]
        assert result.stop.reason == "final_answer"
        # the MCP cancellation notification reached the server, which stopped the work
        assert wait_for(lambda: [e for e in seen(log_path) if e.get("cancelled")]), seen(log_path)
        [pid] = pids(log_path)
        assert alive(pid)
    assert not alive(pid)  # the group's close stopped it (the SDK kills what does not exit)


def test_what_a_server_leaves_behind_is_killed_with_its_process_group(tmp_path: Path) -> None:
    """The server exits cleanly when its stdin closes, but a child it started lives on in its
    process group: closing the group kills that too."""
    log_path = tmp_path / "calls.jsonl"
    with group_of(server(log_path, "--name", "parent", "--tools", "read_note", "--orphan")):
        [child] = [e["child"] for e in seen(log_path) if e.get("event") == "child"]
        [pid] = pids(log_path)
        assert alive(child) and alive(pid)
    assert not alive(pid)
    assert wait_for(lambda: not alive(child), 10), "the server's child outlived the group"


def test_a_server_that_crashes_mid_call_gives_a_structured_error(tmp_path: Path) -> None:
    log_path = tmp_path / "calls.jsonl"
    with group_of(server(log_path, "--name", "fragile", "--tools", "crash,read_note"),
                       trust_annotations=True) as group:
        result, log = fenced(group, tmp_path, calls_reply(tool_call("crash")),
                             calls_reply(tool_call("read_note", path="a.md")), text_reply("it died"))
    crashed, after = tool_results(result)
    assert crashed["error"] == "server_error" and crashed["server"] == "fragile"
    assert "boom: the server crashes on purpose" in crashed["stderr_tail"]
    assert crashed["side_effects"].startswith("may have happened")
    assert after["error"] == "server_error"  # the session is gone; the run still ends named
    assert result.stop.reason == "final_answer"


def test_a_server_that_never_starts_is_named_with_its_stderr(tmp_path: Path) -> None:
    broken = mcp.McpServer.stdio([sys.executable, "-c",
                                  "import sys; sys.stderr.write('config.toml: no such file\\n'); sys.exit(2)"])
    with pytest.raises(mcp.McpServerError) as caught:
        group_of(broken).open()
    assert "config.toml: no such file" in str(caught.value)
    assert sys.executable in str(caught.value)
    with pytest.raises(mcp.McpServerError, match="cannot start it"):
        group_of(str(tmp_path / "no-such-server")).open()


def test_tools_outside_the_group_answer_closed(calls_log: Path, tmp_path: Path) -> None:
    group = group_of(server(calls_log, "--name", "brief", "--tools", "read_note"), trust_annotations=True)
    with group:
        pass
    result, _ = fenced(group, tmp_path, calls_reply(tool_call("read_note", path="a.md")), text_reply("done"))
    [body] = tool_results(result)
    assert body["error"] == "server_error" and "closed" in body["message"]


def test_calls_still_work_after_a_sync_tool_outlived_its_timeout(pair: Any, tmp_path: Path) -> None:
    """A sync tool past its timeout is left on its worker; the run goes on, on the same event loop
    (no coroutine moves between loops), and the next MCP call still works."""
    def stuck() -> str:
        """A sync tool that outlives its timeout."""
        time.sleep(8)
        return "late"

    async def loop_id(label: str) -> str:
        """Which event loop awaits the tools now."""
        return f"{label} {id(asyncio.get_running_loop())}"

    result, log = fenced(pair, tmp_path, calls_reply(tool_call("loop_id", label="before")),
                         calls_reply(tool_call("stuck")),
                         calls_reply(tool_call("alpha__read_note", path="a.md"), tool_call("loop_id", label="after")),
                         text_reply("done"), extra=(tool(stuck), tool(loop_id)), tool_timeout_s=3)
    before, timed_out, read, after = results(log)
    assert timed_out.error == "timeout"
    assert before.content.split()[1] == after.content.split()[1]  # the run stayed on its loop
    assert read.ok and read.content == "alpha: alpha notes (page 1)"
    assert result.stop.reason == "final_answer"


def test_start_up_counts_against_the_runs_wall_clock(tmp_path: Path) -> None:
    """The commands' servers get at most max_wall_seconds to start, whatever --mcp-timeout says; how
    long each one took is in the header."""
    from loopfence.mcp import McpUsageError, add_flags, open_from_args
    from loopfence.mcp._flags import wall_limit

    parser = argparse.ArgumentParser()
    add_flags(parser)
    parser.add_argument("--limit", action="append", default=[])
    slow = shlex.join([sys.executable, str(SERVER), "--tools", "read_note", "--start-delay", "60"])
    with pytest.raises(McpUsageError) as caught:  # pytest-timeout bounds a hang
        with open_from_args(parser.parse_args(["--mcp", slow, "--mcp-timeout", "600", "--limit", "max_steps=3",
                                               "--limit", "max_wall_seconds=1"])):
            pass
    assert "within 1s (max_wall_seconds=1, under --mcp-timeout 600s: server start-up counts against the run's " \
        "wall clock)" in str(caught.value)
    late = shlex.join([sys.executable, str(SERVER), "--tools", "read_note", "--start-delay", "1"])
    args = parser.parse_args(["--mcp", f"late={late}", "--mcp-timeout", str(START_S), "--limit", "max_wall_seconds=none"])
    with open_from_args(args) as group:
        [srv] = group.header()["mcp"]["servers"]
    assert srv["name"] == "late" and srv["startup_s"] >= 1.0  # (the sleep is a floor, not a speed)
    assert wall_limit(parser.parse_args([])) == Limits().max_wall_seconds  # no --limit: the default's


def test_start_up_before_a_run_is_on_its_clock_when_its_log_came_first(tmp_path: Path) -> None:
    """As the CLI does it: the run's log is opened, then the servers start, then the run: the
    start-up is part of the run's wall clock, on the guards' clock as on the log's."""
    from loopfence import RunLog

    path = tmp_path / "run.jsonl"
    log = RunLog(path)
    with group_of(server(tmp_path / "calls.jsonl", "--tools", "read_note", "--start-delay", "1.5")) as group:
        result = run("read", tools=group, log=log, limits=Limits(max_wall_seconds=1), model=ScriptedModel(
            [calls_reply(tool_call("read_note", path="a.md")), text_reply("done")]))
    assert reconcile(path).ok
    assert result.stop.reason == "max_wall_seconds"


# -- Streamable HTTP, and the async form ------------------------------------------------------------
def test_streamable_http_with_headers_under_arun(tmp_path: Path) -> None:
    log_path = tmp_path / "calls.jsonl"
    path = tmp_path / "run.jsonl"

    async def main(url: str) -> Any:
        spec = mcp.McpServer.http(url, headers={"Authorization": "Bearer s3cret-token"}, name="remote")
        async with group_of(spec, trust_annotations=True) as group:
            model = ScriptedModel([calls_reply(tool_call("read_note", path="a.md")),
                                   calls_reply(tool_call("read_note", path="a.md")), text_reply("done")])
            return await arun("read", model=model, tools=group, log=path, header=group.header())

    with http_server(log_path, "--name", "web", "--token", "s3cret-token") as url:
        result = asyncio.run(main(url))
        with pytest.raises(mcp.McpServerError, match=r"127\.0\.0\.1.*HTTP 401"):  # no token: named, no hang
            group_of(mcp.McpServer.http(url)).open()
    assert result.stop.reason == "no_progress" and result.ledger.tool_executions == 1
    assert len(calls(log_path, "read_note")) == 1
    assert reconcile(path).ok
    text = path.read_text(encoding="utf-8")
    assert "s3cret-token" not in text  # header values never reach the log
    [srv] = read_log(path).header.record["mcp"]["servers"]
    assert srv["transport"] == "streamable_http" and srv["headers"] == ["Authorization"]


def _host_threads() -> int:
    import threading

    return sum(1 for t in threading.enumerate() if t.name == "loopfence-mcp")


def test_async_with_keeps_the_sessions_on_the_running_loop(tmp_path: Path) -> None:
    """`async with`: no host thread; calls awaited on this loop reach the session directly, and a
    run() on another thread (while this loop is free) hops here and works too."""
    log_path = tmp_path / "calls.jsonl"

    async def main() -> tuple[Any, Any, int]:
        before = _host_threads()
        async with group_of(server(log_path, "--name", "here", "--tools", "read_note"), trust_annotations=True) as group:
            threads = _host_threads() - before
            here = await arun("read", model=ScriptedModel([calls_reply(tool_call("read_note", path="a.md")),
                                                          text_reply("ok")]), tools=group)
            away = await asyncio.to_thread(run, "read", tools=group, model=ScriptedModel(
                [calls_reply(tool_call("read_note", path="b.md")), text_reply("ok")]))
        return here, away, threads

    here, away, threads = asyncio.run(main())
    assert threads == 0
    assert [tool_results(r) for r in (here, away)] == [["here: alpha notes (page 1)"], ["here: beta notes (page 1)"]]
    assert len(calls(log_path, "read_note")) == 2


def test_a_timeout_cancels_the_call_on_the_server_under_async_with_too(tmp_path: Path) -> None:
    """The call awaited directly on the sessions' loop is cancelled as the hopped one is."""
    log_path = tmp_path / "calls.jsonl"

    def cancelled() -> list[dict[str, Any]]:
        return [e for e in seen(log_path) if e.get("cancelled")]

    async def main() -> tuple[Any, Any]:
        async with group_of(server(log_path, "--name", "sleepy", "--tools", "slow")) as group:
            result = await arun("wait", tools=group, limits=Limits(tool_timeout_s=1), model=ScriptedModel(
                [calls_reply(tool_call("slow", seconds=120)), text_reply("gave up")]))
            # while the session is still open (closing it would cancel the work too)
            return result, await asyncio.to_thread(wait_for, cancelled)

    result, seen_cancel = asyncio.run(main())
    [body] = tool_results(result)
    assert body["error"] == "timeout" and result.stop.reason == "final_answer"
    assert seen_cancel, seen(log_path)


def test_a_sync_run_that_blocks_the_sessions_loop_is_refused_not_hung(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """run() inside the coroutine that holds an `async with` group blocks that loop, where the
    sessions live: the call is withdrawn after STALL_S with an error naming the cause, the run ends
    named and its log reconciles."""
    from loopfence.mcp import _tools

    monkeypatch.setattr(_tools, "STALL_S", 0.5)
    log_path, path = tmp_path / "calls.jsonl", tmp_path / "run.jsonl"

    async def main() -> Any:
        async with group_of(server(log_path, "--name", "stuck", "--tools", "read_note"), trust_annotations=True) as group:
            return run("read", tools=group, log=path, limits=Limits(tool_timeout_s=None), model=ScriptedModel(
                [calls_reply(tool_call("read_note", path="a.md")), text_reply("gave up")]))

    result = asyncio.run(main())
    [body] = tool_results(result)
    assert body["error"] == "mcp_error" and "use arun() there" in body["message"]
    assert result.stop.reason == "final_answer"
    assert reconcile(path).ok
    assert calls(log_path, "read_note") == []  # withdrawn: never sent


# -- what a command does with the flags --------------------------------------------------------------
def test_the_lines_a_command_needs(tmp_path: Path) -> None:
    """add_flags + open_from_args + run(): exactly what `loopfence run/batch/drill` call."""
    from loopfence.mcp import McpUsageError, add_flags, open_from_args

    parser = argparse.ArgumentParser()
    add_flags(parser)
    command = shlex.join([sys.executable, str(SERVER), "--tools", "read_note,fetch"])
    args = parser.parse_args(["--mcp", f"notes={command}", "--mcp-trust", "notes", "--mcp-kind", "fetch=poll",
                              "--mcp-timeout", str(START_S)])
    path = tmp_path / "run.jsonl"
    with open_from_args(args, reserved=["fetch"]) as group:  # `fetch` stands for a built-in's name
        result = run("read", model=ScriptedModel([calls_reply(tool_call("read_note", path="a.md")), text_reply("ok")]),
                     tools=[*group], log=path, header={"workspace": ".", **group.header()})
    assert result.stop.reason == "final_answer" and result.ledger.tool_executions == 1
    header = read_log(path).header.record
    assert header["mcp"]["servers"][0]["name"] == "notes" and header["mcp"]["servers"][0]["trust_annotations"]
    assert header["tool_info"]["notes__fetch"]["mcp"]["kind"] == "poll"
    with open_from_args(parser.parse_args([])) as none:  # no flags: no tools, nothing in the header
        assert list(none) == [] and none.header() == {}
    with pytest.raises(McpUsageError, match="cannot start it"):
        with open_from_args(parser.parse_args(["--mcp", str(tmp_path / "missing-server")])):
            pass
    with pytest.raises(McpUsageError, match="no server here"):
        with open_from_args(parser.parse_args(["--mcp", command, "--mcp-trust", "nobody"])):
            pass
