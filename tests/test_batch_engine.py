"""The local batch engine (`abatch`/`batch`, `loopfence batch`): every episode exactly once in
results.jsonl, the summary adding up to the logs' own ledgers, logs that reconcile, isolation of
workspaces, retries, resuming after a torn results line or a log cut short, draining and cancelling."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loopfence import ScriptedModel, abatch, batch, tool
from loopfence._batch import BatchError, Episode, EpisodeError, load_episodes
from loopfence.cli import cli
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

from _batch_support import episode_server, kinds, log_ledgers, result_rows, write_episodes

SUMMED = {"requests": "model_requests", "tool_calls": "tool_calls", "executions": "tool_executions",
          "reuses": "reused", "refusals": "refused", "rejections": "rejected",
          "prompt_tokens": "prompt_tokens", "completion_tokens": "completion_tokens"}
EXPECTED_STOP = {"normal": "final_answer", "repeat": "repeated_call", "fresh": "repeated_result"}


class Effects:
    """A side-effecting tool that counts its executions by key (thread-safe)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

        def bump(key: str) -> str:
            """Record one side effect under a key.

            Args:
                key: What to record.
            """
            with self.lock:
                self.seen[key] += 1
            return "ok"

        self.tool = tool(bump, kind="side_effect")


# -- many episodes through the engine against the loopback FakeServer -----------------------------------
def _many(tmp_path: Path, n: int) -> None:
    from loopfence.models import OpenAIModel

    eps = write_episodes(tmp_path / "episodes.jsonl", kinds(n))
    kind = {e["id"]: e["metadata"]["kind"] for e in eps}
    effects = Effects()
    out = tmp_path / "job"
    with episode_server() as url:
        async def main() -> Any:
            async with OpenAIModel(url, "fake") as model:
                return await abatch(tmp_path / "episodes.jsonl", model=model, tools=[effects.tool], out=out,
                                    concurrency=16)

        result = asyncio.run(main())
    rows = result_rows(out)
    assert Counter(r["id"] for r in rows) == Counter(dict.fromkeys(kind, 1))  # every episode exactly once
    assert [r.id for r in result.rows] == list(kind)
    for r in rows:
        assert r["stop"] == EXPECTED_STOP[kind[r["id"]]], r
        assert r["metadata"] == {"kind": kind[r["id"]], "i": int(r["id"][2:])}

    ledgers = log_ledgers(out)  # read from the logs, not from the rows
    assert set(ledgers) == set(kind)
    summary = json.loads((out / "summary.json").read_text())
    assert summary == result.summary.to_json()
    for field, name in SUMMED.items():
        assert summary[field] == sum(led[name] for led in ledgers.values()), field
    assert summary["tokens"] == summary["prompt_tokens"] + summary["completion_tokens"]
    assert summary["executions_saved"] == summary["tool_calls"] - summary["executions"] > 0
    assert summary["by_stop"] == dict(Counter(EXPECTED_STOP[k] for k in kind.values()))
    assert summary["finished"] == summary["episodes"] == n and summary["pending"] == summary["errors"] == 0
    assert summary["ship"] == sum(k == "normal" for k in kind.values())
    assert sum(effects.seen.values()) == summary["executions"]  # what ran is what the ledgers count
    for ident in kind:
        check = reconcile(out / "episodes" / f"{ident}.jsonl")
        assert check.ok, (ident, [str(c) for c in check.failed])
    run = summary["this_run"]
    print(f"\n{n} episodes: {run['episodes_per_s']} episodes/s, {run['cpu_ms_per_episode']} ms CPU per episode "
          f"(this process: engine, ring and HTTP client; the server is a child process)")


def test_a_thousand_episodes_each_once_and_the_summary_adds_up(tmp_path: Path) -> None:
    """Issue 16, must-show 1 (about 30 s on 2 shared cores: in the fast tier)."""
    _many(tmp_path, 1000)


# -- the episodes file ----------------------------------------------------------------------------------
def test_bad_lines_are_all_named_before_anything_runs(tmp_path: Path, capsys: Any) -> None:
    src = tmp_path / "eps.jsonl"
    src.write_text("\n".join([
        json.dumps({"id": "a", "task": "fine"}),
        "{not json",
        json.dumps({"id": "b", "task": "t", "limits": {"max_stepz": 3}}),
        json.dumps({"id": "a", "task": "again"}),
        json.dumps({"id": "c/d", "task": "t"}),
        json.dumps({"id": "e", "task": "t", "tools": ["read_file", "cat"], "extra": 1}),
        json.dumps({"id": "f", "task": "t", "workspace": "missing"}),
        json.dumps({"id": "g", "task": "t", "params": {"model": "x"}, "policy": {"on_bad_call": "retry"}}),
        json.dumps(["not", "an", "object"]),
    ]) + "\n")
    with pytest.raises(EpisodeError) as info:
        load_episodes(src, custom_tools=[])
    found = {(p.line, p.field) for p in info.value.problems}
    assert found == {(2, ""), (3, "limits.max_stepz"), (4, "id"), (5, "id"), (6, "tools[1]"), (6, "extra"),
                     (7, "workspace"), (8, "params.model"), (8, "policy"), (9, "")}
    assert f"{src}:3: limits.max_stepz: unknown limit" in str(info.value)
    rc = cli(["batch", str(src), "--out", str(tmp_path / "job"), "--script", str(_script(tmp_path))])
    err = capsys.readouterr().err
    assert rc == 2 and f"{src}:4: id: 'a' is already used on line 1" in err.replace("\n", " ")
    assert not (tmp_path / "job").exists()


def test_episode_settings_lie_over_the_batch_defaults(tmp_path: Path) -> None:
    from loopfence import Limits

    limits_ = {"max_steps": 3, "max_wall_seconds": None}
    [ep] = load_episodes(_write(tmp_path, [{"id": 1, "task": "t", "limits": limits_}]))
    assert ep.id == "1"
    limits = ep.effective_limits(Limits(max_steps=7, max_tool_calls=2))
    assert (limits.max_steps, limits.max_tool_calls, limits.max_wall_seconds) == (3, 2, None)


# -- workspaces -----------------------------------------------------------------------------------------
def test_each_episode_works_in_its_own_copy_of_the_workspace(tmp_path: Path) -> None:
    src = tmp_path / "ws"
    src.mkdir()
    (src / "seed.txt").write_text("seed")
    eps = [{"id": name, "task": f"write {name}", "workspace": "ws", "tools": ["write_file", "read_file"]}
           for name in ("alpha", "beta")]

    def model(ep: Episode) -> ScriptedModel:
        return ScriptedModel([calls_reply(tool_call("write_file", path="note.txt", content=ep.id)),
                              calls_reply(tool_call("read_file", path="note.txt")),
                              calls_reply(tool_call("read_file", path="seed.txt")), text_reply("done")])

    result = batch(_write(tmp_path, eps), model=model, out=tmp_path / "job", keep_workspaces=True, concurrency=2)
    assert [r.stop for r in result.rows] == ["final_answer", "final_answer"]
    for name in ("alpha", "beta"):
        assert (tmp_path / "job" / "workspaces" / name / "note.txt").read_text() == name
        reads = [json.loads(x) for x in (tmp_path / "job" / "episodes" / f"{name}.jsonl").read_text().splitlines()]
        contents = [e["content"] for e in reads if e["event"] == "result" and e["name"] == "read_file"]
        assert name in contents[0] and "seed" in contents[1], contents
    assert sorted(p.name for p in src.iterdir()) == ["seed.txt"]  # the source is never written

    again = batch(_write(tmp_path, eps, "two.jsonl"), model=model, out=tmp_path / "job2")
    assert [r.stop for r in again.rows] == ["final_answer", "final_answer"]
    assert not (tmp_path / "job2" / "workspaces" / "alpha").exists()  # removed once finished


# -- retries --------------------------------------------------------------------------------------------
def test_retry_stops_rerun_up_to_max_retries_and_the_summary_says_so(tmp_path: Path) -> None:
    tries: Counter[str] = Counter()

    def model(ep: Episode) -> ScriptedModel:
        tries[ep.id] += 1
        broken = ep.id == "always" or (ep.id == "flaky" and tries[ep.id] == 1)
        return ScriptedModel([{"choices": []}] if broken else [text_reply("fine")])

    eps = [{"id": i, "task": "t"} for i in ("ok", "flaky", "always")]
    result = batch(_write(tmp_path, eps), model=model, out=tmp_path / "job", retry_stops=["endpoint_error"],
                   max_retries=2)
    rows = {r.id: r for r in result.rows}
    assert (rows["ok"].stop, rows["ok"].attempts) == ("final_answer", 1)
    assert (rows["flaky"].stop, rows["flaky"].attempts) == ("final_answer", 2)
    assert (rows["always"].stop, rows["always"].attempts) == ("endpoint_error", 3)
    assert dict(tries) == {"ok": 1, "flaky": 2, "always": 3}
    s = result.summary
    assert (s.retries, s.retried_episodes, s.retry_stops, s.max_retries) == (3, 2, ("endpoint_error",), 2)
    assert sorted(p.name for p in (tmp_path / "job" / "retries" / "always").iterdir()) == \
        ["attempt-1.jsonl", "attempt-2.jsonl"]
    assert Counter(r["id"] for r in result_rows(tmp_path / "job")) == Counter(["ok", "flaky", "always"])


def test_resume_with_retry_stops_reruns_earlier_rows_once_each(tmp_path: Path) -> None:
    down = [True]

    def model(ep: Episode) -> ScriptedModel:
        return ScriptedModel([{"choices": []}] if down[0] and ep.id != "a" else [text_reply("fine")])

    eps = [{"id": i, "task": "t"} for i in ("a", "b", "c")]
    first = batch(_write(tmp_path, eps), model=model, out=tmp_path / "job")
    assert [r.stop for r in first.rows] == ["final_answer", "endpoint_error", "endpoint_error"]
    down[0] = False
    again = batch(model=model, out=tmp_path / "job", resume=True, retry_stops=["endpoint_error", "cancelled"])
    assert [(r.id, r.stop, r.attempts) for r in again.rows] == \
        [("a", "final_answer", 1), ("b", "final_answer", 2), ("c", "final_answer", 2)]
    assert again.summary.retries == 2 and again.summary.this_run["episodes"] == 2
    assert Counter(r["id"] for r in result_rows(tmp_path / "job")) == Counter(["a", "b", "c"])


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    src = _write(tmp_path, [{"id": "a", "task": "t"}])
    with pytest.raises(BatchError, match="not a stop reason"):
        batch(src, model=ScriptedModel([text_reply("x")]), out=tmp_path / "j1", retry_stops=["flaky"])
    with pytest.raises(BatchError, match="final_answer"):
        batch(src, model=ScriptedModel([text_reply("x")]), out=tmp_path / "j1", retry_stops=["final_answer"])
    batch(src, model=ScriptedModel([text_reply("x")]), out=tmp_path / "j2")
    with pytest.raises(BatchError, match="already holds a batch"):
        batch(src, model=ScriptedModel([text_reply("x")]), out=tmp_path / "j2")
    with pytest.raises(BatchError, match="no batch here"):
        batch(model=ScriptedModel([text_reply("x")]), out=tmp_path / "j3", resume=True)
    with pytest.raises(BatchError, match="differ"):
        batch([{"id": "z", "task": "t"}], model=ScriptedModel([text_reply("x")]), out=tmp_path / "j2", resume=True)


# -- resuming -------------------------------------------------------------------------------------------
def _three(tmp_path: Path, effects: Effects, calls: Counter[str]) -> tuple[Path, Any]:
    def model(ep: Episode) -> ScriptedModel:
        calls[ep.id] += 1
        return ScriptedModel([calls_reply(tool_call("bump", key=f"{ep.id}-0")),
                              calls_reply(tool_call("bump", key=f"{ep.id}-1")), text_reply(f"done {ep.id}")])

    eps = [{"id": i, "task": f"task {i}"} for i in ("a", "b", "c")]
    out = tmp_path / "job"
    batch(_write(tmp_path, eps), model=model, tools=[effects.tool], out=out)
    return out, model


def test_a_torn_last_row_is_cut_and_rebuilt_from_the_log_without_running_again(tmp_path: Path) -> None:
    effects, calls = Effects(), Counter[str]()
    out, model = _three(tmp_path, effects, calls)
    results = out / "results.jsonl"
    data = results.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    torn_id = json.loads(data[last:])["id"]
    results.write_bytes(data[: last + 25])  # a kill mid-write: half a row, no newline
    again = batch(model=model, tools=[effects.tool], out=out, resume=True)
    assert Counter(r["id"] for r in result_rows(out)) == Counter(["a", "b", "c"])
    row = next(r for r in again.rows if r.id == torn_id)
    assert (row.stop, row.resumed, row.final_answer) == ("final_answer", False, f"done {torn_id}")
    assert calls == Counter(["a", "b", "c"]) and max(effects.seen.values()) == 1  # nothing ran again


def test_a_log_cut_after_an_intent_resumes_without_running_that_call_again(tmp_path: Path) -> None:
    effects, calls = Effects(), Counter[str]()
    out, model = _three(tmp_path, effects, calls)
    log = out / "episodes" / "b.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    intent = next(i for i, x in enumerate(lines) if json.loads(x).get("intent") and "b-1" in x)
    log.write_text("".join(lines[: intent + 1]) + lines[intent + 1][:10])  # killed while b-1 ran
    rows = [r for r in result_rows(out) if r["id"] != "b"]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = batch(model=model, tools=[effects.tool], out=out, resume=True)
    row = next(r for r in again.rows if r.id == "b")
    assert (row.stop, row.resumed) == ("final_answer", True)
    assert effects.seen["b-1"] == 1  # its effect happened once, before the "kill"; not again
    events = [json.loads(x) for x in log.read_text().splitlines()]
    [resumed] = [e for e in events if e["event"] == "resume"]
    assert resumed["pending_intent"]["action"].startswith("outcome_unknown")
    assert reconcile(log).ok
    assert again.summary.resumed == 1 and again.summary.this_run["resumed"] == 1
    assert Counter(r["id"] for r in result_rows(out)) == Counter(["a", "b", "c"])


def test_drain_starts_nothing_new_and_resume_finishes(tmp_path: Path) -> None:
    eps = [{"id": f"e{i}", "task": "t"} for i in range(6)]
    src = _write(tmp_path, eps)
    model = lambda ep: ScriptedModel([text_reply("fine")])  # noqa: E731

    async def main() -> Any:
        drain = asyncio.Event()
        return await abatch(src, model=model, out=tmp_path / "job", concurrency=1, drain=drain,
                            on_result=lambda row: drain.set())

    first = asyncio.run(main())
    assert first.interrupted and first.summary.pending == 5 and len(first.rows) == 1
    done = batch(model=model, out=tmp_path / "job", resume=True)
    assert done.interrupted is None and done.summary.finished == 6
    assert Counter(r["id"] for r in result_rows(tmp_path / "job")) == Counter(e["id"] for e in eps)


def test_cancelling_ends_running_episodes_cancelled_and_retry_stops_finish_them(tmp_path: Path) -> None:
    eps = [{"id": f"e{i}", "task": "t"} for i in range(6)]
    src = _write(tmp_path, eps)
    slow = asyncio.Event()

    class Waits(ScriptedModel):
        async def acomplete(self, request: Any) -> Any:
            if not slow.is_set():
                await asyncio.Event().wait()  # until cancelled
            return await super().acomplete(request)

    async def main() -> None:
        task = asyncio.create_task(abatch(src, model=lambda ep: Waits([text_reply("fine")]), out=tmp_path / "job",
                                          concurrency=3))
        while not list((tmp_path / "job" / "episodes").glob("*.jsonl")) or \
                len(list((tmp_path / "job" / "episodes").glob("*.jsonl"))) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    rows = result_rows(tmp_path / "job")
    assert sorted(r["stop"] for r in rows) == ["cancelled"] * 3
    slow.set()
    done = batch(model=lambda ep: Waits([text_reply("fine")]), out=tmp_path / "job", resume=True,
                 retry_stops=["cancelled"])
    assert [r.stop for r in done.rows] == ["final_answer"] * 6
    assert sorted(r.attempts for r in done.rows) == [1, 1, 1, 2, 2, 2]
    assert Counter(r["id"] for r in result_rows(tmp_path / "job")) == Counter(e["id"] for e in eps)


# -- the command ----------------------------------------------------------------------------------------
def test_cli_json_rows_summary_and_resume(tmp_path: Path, capsys: Any) -> None:
    src = _write(tmp_path, [{"id": f"e{i}", "task": "t", "metadata": {"i": i}} for i in range(3)])
    out = tmp_path / "job"
    rc = cli(["batch", str(src), "--out", str(out), "--script", str(_script(tmp_path)), "--json"])
    cap = capsys.readouterr()
    rows = [json.loads(x) for x in cap.out.splitlines()]
    assert rc == 0 and [r["id"] for r in rows] == ["e0", "e1", "e2"] and rows[2]["metadata"] == {"i": 2}
    assert {"id", "stop", "verdict", "requests", "executions", "reuses", "refusals", "tokens", "seconds",
            "final_answer", "metadata"} <= set(rows[0])
    assert "SHIP rate" in cap.err and "final_answer" in cap.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_stop"] == {"final_answer": 3} and summary["ship_rate"] == 1.0
    assert json.loads((out / "job.json").read_text())["settings"]["script"] == str(_script(tmp_path))
    assert cli(["batch", "--resume", str(out), "--json"]) == 0
    assert capsys.readouterr().out == ""  # nothing left to run
    assert cli(["batch", "--resume", str(out), "--limit", "max_steps=2"]) == 2
    assert "cannot change on --resume" in capsys.readouterr().err


def test_cli_spreads_episodes_over_several_base_urls(tmp_path: Path, capsys: Any) -> None:
    from loopfence.testing import FakeServer

    src = _write(tmp_path, [{"id": f"e{i}", "task": "t"} for i in range(6)])
    with FakeServer([text_reply("one")]) as a, FakeServer([text_reply("two")]) as b:
        rc = cli(["batch", str(src), "--out", str(tmp_path / "job"), "--base-url", a.base_url, "--base-url",
                  b.base_url, "--concurrency", "2", "--max-connections", "1", "--json"])
        served = (a.served, b.served)
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and served == (3, 3)
    assert Counter(r["final_answer"] for r in rows) == Counter({"one": 3, "two": 3})
    assert json.loads((tmp_path / "job" / "job.json").read_text())["settings"]["base_urls"] == \
        [a.base_url, b.base_url]


@pytest.mark.parametrize("argv, words", [
    (["--out", "X"], "batch needs a model"),
    (["--out", "X", "--script", "S", "--tools", "nosuchmodule_xyz:T"], "cannot import nosuchmodule_xyz"),
    (["--out", "X", "--script", "S", "--tools", "json"], "expects module:attr"),
    (["--out", "X", "--script", "S", "--concurrency", "0"], "at least 1"),
    (["--script", "S"], "--out DIR is required"),
    (["--out", "X", "--script", "S", "--retry-stops", "oops"], "not a stop reason"),
])
def test_cli_usage_errors(tmp_path: Path, capsys: Any, argv: list[str], words: str) -> None:
    src = _write(tmp_path, [{"id": "a", "task": "t"}])
    script = _script(tmp_path)
    argv = [str(tmp_path / "X") if a == "X" else str(script) if a == "S" else a for a in argv]
    assert cli(["batch", str(src), *argv]) == 2
    assert words in capsys.readouterr().err


def _write(tmp_path: Path, eps: list[dict[str, Any]], name: str = "eps.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(e) + "\n" for e in eps))
    return p


def _script(tmp_path: Path) -> Path:
    p = tmp_path / "script.jsonl"
    p.write_text(json.dumps(text_reply("done")) + "\n")
    return p


@pytest.mark.parametrize(("change", "words"), [
    ({"requests": "many"}, "field 'requests' must be an integer, got str"),
    ({"prompt_tokens": None}, "field 'prompt_tokens' must be an integer, got NoneType"),
    ({"seconds": True}, "field 'seconds' must be a number, got bool"),
    ({"stop": "bogus"}, "field 'stop': unknown stop 'bogus'"),
    ({"verdict": "MAYBE"}, "field 'verdict': unknown verdict 'MAYBE'"),
    ({"verdict": ...}, "field 'verdict' is missing")])
def test_a_hand_edited_results_row_is_refused_by_line_and_field(tmp_path: Path, change: dict[str, Any],
                                                                words: str) -> None:
    from loopfence._batch._results import EpisodeResult, ResultsError, ResultsFile

    good = EpisodeResult("e1", "final_answer", "SHIP", "answer after 1 request", requests=1).to_json()
    row = {k: v for k, v in {**good, **change}.items() if v is not ...}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ResultsError) as e:
        ResultsFile(path).load()
    assert str(e.value) == f"{path}:2: {words}"
    path.write_text(json.dumps(good) + "\n")
    assert ResultsFile(path).load()[0] == EpisodeResult.from_json(good)


@pytest.mark.parametrize(("edit", "words"), [
    ({"settings": {"concurrency": -4}}, "concurrency (recorded in {job}) must be an integer of at least 1, got -4"),
    ({"settings": {"max_retries": "two"}}, "max_retries (recorded in {job}) must be an integer of at least 0"),
    ({"version": 9}, "{job}: a batch job of version 9; this loopfence reads version 1"),
    ({"settings": []}, "{job}: field 'settings' must be an object")])
def test_a_hand_edited_job_file_is_named_on_resume(tmp_path: Path, capsys: Any, edit: dict[str, Any],
                                                   words: str) -> None:
    src = _write(tmp_path, [{"id": "e0", "task": "t"}])
    out = tmp_path / "job"
    assert cli(["batch", str(src), "--out", str(out), "--script", str(_script(tmp_path)), "--quiet"]) == 0
    job = json.loads((out / "job.json").read_text())
    for key, value in edit.items():
        job[key] = {**job[key], **value} if isinstance(value, dict) else value
    (out / "job.json").write_text(json.dumps(job))
    capsys.readouterr()
    assert cli(["batch", "--resume", str(out), "--quiet"]) == 2
    assert words.format(job=out / "job.json") in capsys.readouterr().err
