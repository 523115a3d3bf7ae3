"""Dollars in the batch (`prices=`, `--prices`: each row's cost_usd and the summary's) and MCP servers on
`batch` and `drill` (`--mcp`, and a drill scenario's own `mcp` servers). The CLI runs are real
subprocesses; the MCP server is the suite's real FastMCP stdio server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, ScriptedModel, batch
from loopfence._batch import BatchError, Episode
from loopfence.runlog import reconcile
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

from _batch_support import log_ledgers, result_rows

EXE = [sys.executable, "-m", "loopfence"]
MCP_SERVER = Path(__file__).resolve().parent / "_mcp_server.py"
PRICES = {"*": (2.0, 8.0)}  # dollars per million input, output tokens


def _write(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in items), encoding="utf-8")
    return path


def _cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *argv], cwd=cwd, capture_output=True, text=True, timeout=180)


def _model(ep: Episode) -> ScriptedModel:
    steps = int(ep.metadata["steps"])
    return ScriptedModel([*(calls_reply(tool_call("read_file", path=f"f{i}.txt"), usage=(100 * (i + 1), 10))
                            for i in range(steps)), text_reply("done", usage=(500, 20))])


def test_rows_and_summary_carry_the_dollars_of_the_logs(tmp_path: Path) -> None:
    eps = [{"id": f"e{i}", "task": "t", "tools": ["read_file"], "metadata": {"steps": i}} for i in range(4)]
    eps.append({"id": "tight", "task": "t", "tools": ["read_file"], "metadata": {"steps": 3},
                "limits": {"max_cost_usd": 0.002}})
    result = batch(eps, model=_model, out=tmp_path / "job", prices=PRICES)
    ledgers = log_ledgers(tmp_path / "job")
    rows = {r.id: r for r in result.rows}
    for ident, led in ledgers.items():
        expected = round((led["prompt_tokens"] * 2.0 + led["completion_tokens"] * 8.0) / 1e6, 9)
        assert rows[ident].cost_usd == pytest.approx(led["cost_usd"]) == pytest.approx(expected), ident
    assert rows["tight"].stop == "max_cost_usd" and rows["e3"].stop == "final_answer"
    assert rows["e3"].cost_usd > rows["e0"].cost_usd > 0  # type: ignore[operator]
    s = result.summary
    assert s.cost_usd == pytest.approx(sum(led["cost_usd"] for led in ledgers.values()))
    assert s.cost_usd_p50 is not None and s.cost_usd_p95 == max(r.cost_usd for r in result.rows)  # type: ignore[type-var]
    on_disk = result_rows(tmp_path / "job")
    assert all("cost_usd" in r for r in on_disk)
    assert json.loads((tmp_path / "job" / "summary.json").read_text())["cost_usd"] == s.cost_usd
    assert all(reconcile(tmp_path / "job" / "episodes" / f"{i}.jsonl").ok for i in ledgers)

    unpriced = batch([{"id": "a", "task": "t"}], model=ScriptedModel([text_reply("x")]), out=tmp_path / "plain")
    assert unpriced.summary.cost_usd is None and "cost_usd" not in result_rows(tmp_path / "plain")[0]


def test_an_episode_with_its_own_limits_is_priced_by_the_model_the_params_name(tmp_path: Path) -> None:
    """The batch's params name the model that prices an episode checked on its own: one with its own
    limits, or every episode of a model factory."""
    def replies(_: Episode | None = None) -> ScriptedModel:
        return ScriptedModel([{**text_reply("done", usage=(1000, 10)), "model": "gpt-4o-mini"}] * 2)

    eps = [{"id": "shared", "task": "t"}, {"id": "own", "task": "t", "limits": {"max_cost_usd": 0.05}}]
    for out, model in (("one", replies()), ("each", replies)):
        result = batch(eps, model=model, out=tmp_path / out, params={"model": "gpt-4o-mini"},
                       limits=Limits(max_cost_usd=0.07))
        rows = {r.id: r for r in result.rows}
        assert {(r.id, r.stop, r.error) for r in result.rows} == {
            ("shared", "final_answer", None), ("own", "final_answer", None)}, out
        assert rows["shared"].cost_usd == rows["own"].cost_usd > 0


def test_a_cost_budget_without_a_price_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="max_cost_usd|price"):
        batch([{"id": "a", "task": "t"}], model=ScriptedModel([text_reply("x")]), out=tmp_path / "job",
              limits=Limits(max_cost_usd=1.0))
    assert not (tmp_path / "job").exists()


def test_cli_prices_over_http_and_a_fixed_table_on_resume(tmp_path: Path) -> None:
    src = _write(tmp_path / "eps.jsonl", [{"id": f"e{i}", "task": "t"} for i in range(3)])
    (tmp_path / "prices.toml").write_text('"priced-model" = [1.5, 6.0]\n', encoding="utf-8")
    out = tmp_path / "job"
    with FakeServer([text_reply("fine", usage=(1000, 100))]) as srv:
        p = _cli(tmp_path, "batch", str(src), "--out", str(out), "--base-url", srv.base_url, "--model",
                 "priced-model", "--prices", "prices.toml", "--json", "--limit", "max_cost_usd=1")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert [r["cost_usd"] for r in rows] == [pytest.approx((1000 * 1.5 + 100 * 6.0) / 1e6)] * 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cost_usd"] == pytest.approx(3 * (1000 * 1.5 + 100 * 6.0) / 1e6)
    assert "cost" in p.stderr and "$0.006300" in p.stderr, p.stderr
    again = _cli(tmp_path, "batch", "--resume", str(out), "--prices", "prices.toml")
    assert again.returncode == 2 and "cannot change on --resume" in again.stderr
    unknown = _cli(tmp_path, "batch", str(src), "--out", str(tmp_path / "j2"), "--base-url", "http://127.0.0.1:9/v1",
                   "--model", "nobody-prices-this", "--limit", "max_cost_usd=1")
    assert unknown.returncode == 2 and "nobody-prices-this" in unknown.stderr and "Traceback" not in unknown.stderr


@pytest.fixture
def notes_flags() -> list[str]:
    pytest.importorskip("mcp", reason="loopfence[mcp] is not installed")
    return ["--mcp", f"notes={sys.executable} {MCP_SERVER}", "--mcp-trust", "notes"]


def test_batch_episodes_share_the_mcp_servers_tools(tmp_path: Path, notes_flags: list[str]) -> None:
    src = _write(tmp_path / "eps.jsonl", [{"id": f"e{i}", "task": "t"} for i in range(4)])
    script = _write(tmp_path / "script.jsonl", [calls_reply(tool_call("read_note", path="a.md")), text_reply("ok")])
    out = tmp_path / "job"
    p = _cli(tmp_path, "batch", str(src), "--out", str(out), "--script", str(script), "--quiet", "--concurrency",
             "2", *notes_flags, "--mcp-header", "Authorization: Bearer s3cret")
    assert p.returncode == 0, p.stderr
    assert [r["stop"] for r in result_rows(out)] == ["final_answer"] * 4
    for i in range(4):
        events = [json.loads(x) for x in (out / "episodes" / f"e{i}.jsonl").read_text().splitlines()]
        assert events[0]["mcp"]["servers"][0]["name"] == "notes"
        assert [e["content"] for e in events if e["event"] == "result"] == ["notes: alpha notes (page 1)"]
    settings = json.loads((out / "job.json").read_text())["settings"]
    assert settings["mcp"] == [notes_flags[1]] and settings["mcp_trust"] == ["notes"]
    assert "s3cret" not in (out / "job.json").read_text()  # --mcp-header is never recorded


def test_drill_mcp_flag_and_a_scenario_of_its_own_servers(tmp_path: Path, notes_flags: list[str]) -> None:
    (tmp_path / "srv.py").write_text(MCP_SERVER.read_text(encoding="utf-8"), encoding="utf-8")
    folder = tmp_path / "drills"
    folder.mkdir()
    def reads(name: str) -> dict[str, Any]:
        return {"replies": [calls_reply(tool_call(name, path="b.md")), text_reply("read")],
                "expect": {"stop": "final_answer", "tool_executions": 1,
                           "calls": [{"name": name, "arguments": {"path": "b.md"}, "ok": True}]}}

    (folder / "flag.json").write_text(json.dumps({"name": "flag", "task": "t", **reads("read_note")}))
    own = {"name": "own", "task": "t", "mcp": {"servers": [f"mine={sys.executable} ../srv.py --name mine"],
                                               "trust": ["mine"]}, **reads("mine__read_note")}
    (folder / "own.json").write_text(json.dumps(own))  # its server starts in the file's folder
    p = _cli(tmp_path, "drill", str(folder), "--out", str(tmp_path / "out"), "--json", *notes_flags)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["name"]: r for r in map(json.loads, p.stdout.splitlines())}
    assert rows["flag"]["pass"] and rows["own"]["pass"], rows
    header = json.loads((tmp_path / "out" / "own.jsonl").read_text().splitlines()[0])
    assert [s["name"] for s in header["mcp"]["servers"]] == ["notes", "mine"]
    names = [t["function"]["name"] for t in header["tools"]]
    assert "read_note" in names and "mine__read_note" in names  # a name already taken: namespaced
    for name, text in (("flag", "notes: beta notes (page 1)"), ("own", "mine: beta notes (page 1)")):
        events = [json.loads(x) for x in (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()]
        assert [e["content"] for e in events if e["event"] == "result"] == [text]


def test_a_bad_mcp_field_names_the_file_and_field(tmp_path: Path) -> None:
    from loopfence.drill import ScenarioError, load_scenario

    bad = tmp_path / "bad.json"
    for mcp, field in [({"servers": []}, "mcp.servers"), ({"servers": ["x=http://"]}, "mcp.servers[0]"),
                       ({"servers": ["a b"], "kinds": {"t": "odd"}}, "mcp.kinds.t"),
                       ({"servers": ["a b"], "extra": 1}, "mcp.extra")]:
        bad.write_text(json.dumps({"name": "b", "task": "t", "replies": [text_reply("x")], "mcp": mcp}))
        with pytest.raises(ScenarioError) as info:
            load_scenario(bad)
        assert info.value.field == field, (mcp, info.value)
