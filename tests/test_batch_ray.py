"""Issue 16, must-show 3: the Ray backend (`backend="ray"`, `loopfence batch --backend ray`).

One local Ray for the module (num_cpus=2, no dashboard, a small object store: Ray's start-up is the
heavy part on a 2-core VM). Against the per-episode loopback FakeServer (a child process): the same
200-episode job through Ray gives the same stops and counts as the local engine; killing one Ray
worker process mid-job (SIGKILL to a PID the worker reported) loses only its episodes in flight, and
resuming finishes every episode exactly once with no side effect run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopfence import batch
from loopfence._batch._recipe import Endpoints
from loopfence.runlog import reconcile

from _batch_support import episode_server, kinds, log_ledgers, result_rows, write_episodes

ray = pytest.importorskip("ray", reason="loopfence[ray] is not installed")
pytestmark = pytest.mark.slow

WAIT_S = 120  # a hang, not a timing
# The side-effect counter, importable in the Ray workers: each execution appends "KEY PID" to the
# file named in this module, then waits (a window where the effect happened, its result not logged).
TOOLS = textwrap.dedent('''
    import os
    import time
    from loopfence import tool

    EFFECTS = {effects!r}

    def bump(key: str) -> str:
        """Record one side effect under a key.

        Args:
            key: What to record.
        """
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{{key}} {{os.getpid()}}\\n".encode())
        finally:
            os.close(fd)
        time.sleep(float(os.environ.get("RAY_TEST_TOOL_SLEEP") or 0))
        return "ok"

    TOOLS = [tool(bump, kind="side_effect")]
''')


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray whose workers can import the counter tool (tools dir on PYTHONPATH)."""
    where = tmp_path_factory.mktemp("ray_tools")
    (where / "ray_side_effects.py").write_text(TOOLS.format(effects=str(where / "effects.txt")), encoding="utf-8")
    sys.path.insert(0, str(where))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(where), old) if p)
    os.environ["RAY_TEST_TOOL_SLEEP"] = "0.02"
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False,
             _node_ip_address="127.0.0.1")  # loopback only
    try:
        yield where
    finally:
        ray.shutdown()
        sys.path.remove(str(where))
        os.environ.pop("RAY_TEST_TOOL_SLEEP", None)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _tools() -> Any:
    import ray_side_effects

    return ray_side_effects.TOOLS


def _effects(where: Path, prefix: str) -> list[tuple[str, int]]:
    f = where / "effects.txt"
    lines = f.read_text().split("\n") if f.exists() else []
    return [(k, int(p)) for k, p in (x.split() for x in lines if x.strip()) if k.startswith(prefix)]


def _counts(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {r["id"]: (r["stop"], r["requests"], r["tool_calls"], r["executions"], r["reuses"], r["prompt_tokens"],
                      r["completion_tokens"], r["final_answer"]) for r in rows}


def test_the_same_job_through_ray_gives_the_same_stops_and_counts(tmp_path: Path, ray_session: Path) -> None:
    eps = write_episodes(tmp_path / "episodes.jsonl", kinds(200))
    with episode_server() as url:
        local = batch(tmp_path / "episodes.jsonl", model=Endpoints([url], "fake"), tools=_tools(),
                      out=tmp_path / "local", concurrency=16)
        remote = batch(tmp_path / "episodes.jsonl", model=Endpoints([url], "fake"), tools=_tools(),
                       out=tmp_path / "ray", concurrency=16, backend="ray")
    assert local.interrupted is None and remote.interrupted is None
    a, b = result_rows(tmp_path / "local"), result_rows(tmp_path / "ray")
    assert Counter(r["id"] for r in b) == Counter(e["id"] for e in eps)  # every episode exactly once
    assert _counts(a) == _counts(b)
    for field in ("by_stop", "requests", "tool_calls", "executions", "executions_saved", "tokens", "ship"):
        assert getattr(local.summary, field) == getattr(remote.summary, field), field
    assert remote.summary.by_stop == {"final_answer": 180, "repeated_call": 10, "repeated_result": 10}
    ran_in = {pid for _, pid in _effects(ray_session, "ep")}
    assert os.getpid() in ran_in and len(ran_in - {os.getpid()}) >= 1  # local here, the Ray job elsewhere
    ledgers = log_ledgers(tmp_path / "ray")
    assert sum(led["tool_executions"] for led in ledgers.values()) == remote.summary.executions
    for ident in list(ledgers)[::20]:
        assert reconcile(tmp_path / "ray" / "episodes" / f"{ident}.jsonl").ok, ident


def test_a_killed_ray_worker_loses_only_its_episodes_and_resume_finishes_them(tmp_path: Path,
                                                                               ray_session: Path) -> None:
    n = 120
    eps = [{"id": f"k{i:03d}", "task": f"episode k{i:03d}: {kind}", "metadata": {"kind": kind}}
           for i, kind in enumerate(kinds(n, every=8, runaways=("fresh",)))]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    out = tmp_path / "job"
    done: list[Any] = []
    with episode_server(delay_s=0.005) as url:
        job = threading.Thread(target=lambda: done.append(batch(
            tmp_path / "episodes.jsonl", model=Endpoints([url], "fake"), tools=_tools(), out=out, concurrency=8,
            backend="ray", ray_workers=2)))
        job.start()
        deadline = time.monotonic() + WAIT_S
        while len(_effects(ray_session, "k")) < 40:
            assert time.monotonic() < deadline and job.is_alive(), "the job made no progress"
            time.sleep(0.005)
        victim = _effects(ray_session, "k")[-1][1]
        assert victim != os.getpid()
        os.kill(victim, signal.SIGKILL)
        job.join(WAIT_S)
        assert not job.is_alive()
        [first] = done
        assert first.interrupted is not None and "Ray worker that died" in first.interrupted, first.interrupted
        lost = first.summary.pending
        assert 1 <= lost < n
        again = batch(model=Endpoints([url], "fake"), tools=_tools(), out=out, resume=True, backend="ray")
    assert again.interrupted is None and again.summary.finished == n
    assert again.summary.this_run["episodes"] == lost  # only the lost ones ran again
    rows = result_rows(out)
    assert Counter(r["id"] for r in rows) == Counter(e["id"] for e in eps)  # exactly once
    keys = Counter(k for k, _ in _effects(ray_session, "k"))
    assert not [k for k, c in keys.items() if c > 1], "a side effect ran twice"
    for r in rows:
        assert r["stop"] == ("final_answer" if r["metadata"]["kind"] == "normal" else "repeated_result"), r
        assert reconcile(out / "episodes" / f"{r['id']}.jsonl").ok, r["id"]
    print(f"\nkilled Ray worker {victim}: {lost} episode(s) lost, {again.summary.resumed} continued from "
          f"their logs")


def test_cli_backend_ray(tmp_path: Path, ray_session: Path) -> None:
    """The command: --backend ray reaches the engine and is recorded (a Ray of its own, in the child)."""
    eps = write_episodes(tmp_path / "episodes.jsonl", kinds(20))
    env = {**os.environ, "RAY_ADDRESS": ""}
    with episode_server() as url:
        p = subprocess.run([sys.executable, "-m", "loopfence", "batch", "episodes.jsonl", "--out", "job",
                            "--base-url", url, "--tools", "ray_side_effects:TOOLS", "--backend", "ray",
                            "--ray-workers", "1", "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert Counter(r["id"] for r in result_rows(tmp_path / "job")) == Counter(e["id"] for e in eps)
    settings = json.loads((tmp_path / "job" / "job.json").read_text())["settings"]
    assert settings["backend"] == "ray" and settings["ray_workers"] == 1


def test_ray_copies_each_workspace_without_the_batch_folder_inside_it(tmp_path: Path, ray_session: Path) -> None:
    """Issue 30, item 1: --out inside the episodes' workspace; the driver makes the copies Ray runs in."""
    from loopfence._batch._recipe import ScriptFile
    from loopfence.testing import calls_reply, text_reply, tool_call

    ws = tmp_path / "repo"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print(1)\n")
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in (calls_reply(tool_call("list_dir", path="runs")),
                                                              text_reply("done"))))
    eps = tmp_path / "eps.jsonl"
    eps.write_text("".join(json.dumps({"id": i, "task": "list", "workspace": "repo"}) + "\n" for i in ("a", "b")))
    out = ws / "runs" / "job"
    result = batch(eps, model=ScriptFile(str(script)), out=out, keep_workspaces=True, backend="ray", ray_workers=1)
    assert [r.stop for r in result.rows] == ["final_answer", "final_answer"], result.rows
    for ident in ("a", "b"):
        copy = out / "workspaces" / ident
        assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == ["runs", "src", "src/main.py"]
        events = [json.loads(x) for x in (out / "episodes" / f"{ident}.jsonl").read_text().splitlines()]
        [listing] = [e["content"] for e in events if e["event"] == "result"]
        assert "job" not in listing, listing  # the episode saw an empty runs/
