"""8. Batches: episodes per second and harness CPU per episode, loopfence's batch engine (local and
Ray) beside inspect_ai's eval, on the same scripted episodes; and what a resumed batch costs.

An episode is 3 model calls and 2 tool calls: a scripted model (in-process, no HTTP: loopfence's
ScriptedModel, inspect_ai's mockllm with usage set) asks for `bump(key)` twice, then answers. Both
write their logs (loopfence: one JSONL per episode, results.jsonl, summary.json; inspect: its .eval
log). Harness CPU per episode = the CPU of every process involved (this one; for Ray also the Ray
processes it started, raylet and workers, measured with psutil) / episodes. Ray's start-up is timed
apart and not in the per-episode numbers.

Resume: a 1,000-episode job drained after about half its episodes, then `resume=True`: its wall and
CPU as a share of the fresh run's, beside the share of episodes it had left.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from loopfence import ScriptedModel, abatch, batch, tool
from loopfence.testing import calls_reply, text_reply, tool_call

from ..report import Section, table

TITLE = "Batches"
FULL = {"sizes": (100, 1000), "resume": 1000}
QUICK = {"sizes": (20,), "resume": 40}
CONCURRENCY = 16  # loopfence batch's default; inspect's max_samples "at ours"
INSPECT_GOAL = 20  # loopfence's harness CPU per episode at most 1/20 of inspect_ai's


async def bump(key: str) -> str:  # async, as inspect_ai's tool below must be: the same episode on both
    """Record one side effect under a key.

    Args:
        key: What to record.
    """
    return "ok"


TOOLS = [tool(bump, kind="side_effect")]
REPLIES = [calls_reply(tool_call("bump", key="a"), usage=(40, 8)), calls_reply(tool_call("bump", key="b"),
           usage=(60, 8)), text_reply("done", usage=(80, 4))]


def scripted(ep: Any) -> ScriptedModel:
    return ScriptedModel(REPLIES)


def _episodes(n: int) -> list[dict[str, Any]]:
    return [{"id": f"e{i:05d}", "task": f"episode {i}"} for i in range(n)]


class _Cpu:
    """CPU seconds of this process and (with psutil) of its descendants alive at each reading;
    a descendant that exits between readings is counted up to its last reading."""

    def __init__(self) -> None:
        try:
            import psutil

            self.me: Any = psutil.Process()
        except ImportError:
            self.me = None
        self.seen: dict[int, float] = {}

    def read(self) -> float:
        total = time.process_time()
        if self.me is None:
            return total
        for child in self.me.children(recursive=True):
            try:
                t = child.cpu_times()
                self.seen[child.pid] = t.user + t.system
            except Exception:  # noqa: BLE001,S112 - gone: its last reading stands
                continue
        return total + sum(self.seen.values())


def _measure(fn: Callable[[], Any], n: int) -> dict[str, Any]:
    cpu = _Cpu()
    c0, t0 = cpu.read(), time.perf_counter()
    out = fn()
    wall, used = time.perf_counter() - t0, cpu.read() - c0
    return {"episodes": n, "wall_s": round(wall, 3), "episodes_per_s": round(n / wall, 1),
            "cpu_ms_per_episode": round(used * 1000 / n, 3), "result": out}


def _loopfence(n: int, tmp: Path, backend: str = "local") -> dict[str, Any]:
    out = tmp / f"lf-{backend}-{n}"
    r = _measure(lambda: batch(_episodes(n), model=scripted, tools=TOOLS, out=out, concurrency=CONCURRENCY,
                               backend=backend), n)
    s = r.pop("result").summary
    assert s.finished == n and s.by_stop == {"final_answer": n} and s.executions == 2 * n, s
    return r


def _inspect(n: int, tmp: Path, max_samples: int | None) -> dict[str, Any] | str:
    try:
        from inspect_ai import Task, eval as inspect_eval
        from inspect_ai.dataset import Sample
        from inspect_ai.model import ModelOutput, ModelUsage, get_model
        from inspect_ai.solver import generate, use_tools
        from inspect_ai.tool import tool as inspect_tool
    except ImportError as exc:
        return f"not installed ({exc.name})"

    @inspect_tool
    def ibump() -> Any:
        async def execute(key: str) -> str:
            """Record one side effect under a key.

            Args:
                key: What to record.
            """
            return "ok"

        return execute

    def outputs(messages: list[Any], tools: Any, choice: Any, config: Any) -> Any:
        done = sum(1 for m in messages if m.role == "tool")
        if done < 2:
            out = ModelOutput.for_tool_call("mockllm/model", "ibump", {"key": "ab"[done]})
        else:
            out = ModelOutput.from_content("mockllm/model", "done")
        out.usage = ModelUsage(input_tokens=40 + 20 * done, output_tokens=8, total_tokens=48 + 20 * done)
        return out

    task = Task(dataset=[Sample(input=f"episode {i}", target="done") for i in range(n)],
                solver=[use_tools(ibump()), generate()])
    model = get_model("mockllm/model", custom_outputs=outputs)
    options: dict[str, Any] = {"max_samples": max_samples} if max_samples is not None else {}
    r = _measure(lambda: inspect_eval(task, model=model, log_dir=str(tmp / f"inspect-{n}-{max_samples}"),
                                      display="none", **options), n)
    [log] = r.pop("result")
    assert log.status == "success" and len(log.samples or []) == n, log.status
    calls = sum(1 for s in log.samples or [] for m in s.messages if m.role == "tool")
    assert calls == 2 * n, calls
    return r


def _ray_session() -> tuple[Any, float] | str:
    try:
        import ray
    except ImportError as exc:
        return f"not installed ({exc.name})"
    root = str(Path(__file__).resolve().parents[2])  # the actors import this module's tool by reference
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 << 20, _node_ip_address="127.0.0.1")
    return ray, time.perf_counter() - t0


def _resume(n: int, tmp: Path) -> dict[str, Any]:
    out = tmp / "resume"
    fresh = _measure(lambda: batch(_episodes(n), model=scripted, tools=TOOLS, out=tmp / "resume-fresh",
                                   concurrency=CONCURRENCY), n)

    async def half() -> Any:
        drain = asyncio.Event()
        count = [0]

        def on_result(_: Any) -> None:
            count[0] += 1
            if count[0] >= n // 2:
                drain.set()

        return await abatch(_episodes(n), model=scripted, tools=TOOLS, out=out, concurrency=CONCURRENCY,
                            drain=drain, on_result=on_result)

    first = asyncio.run(half())
    left = first.summary.pending
    again = _measure(lambda: batch(model=scripted, tools=TOOLS, out=out, resume=True, concurrency=CONCURRENCY),
                     max(left, 1))
    done = again.pop("result")
    assert done.summary.finished == n and done.summary.this_run["episodes"] == left, done.summary
    return {"episodes": n, "left": left, "share_left": round(left / n, 3),
            "wall_share": round(again["wall_s"] / fresh["wall_s"], 3),
            "cpu_share": round(again["cpu_ms_per_episode"] * left / (fresh["cpu_ms_per_episode"] * n), 3),
            "fresh_wall_s": fresh["wall_s"], "resume_wall_s": again["wall_s"]}


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cfg = QUICK if quick else FULL
    data: dict[str, Any] = {"rows": {}}
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="lf-bench-batch-") as d:
        tmp = Path(d)
        _loopfence(10, tmp / "warm")  # imports, first-use caches: not in the numbers
        data["resume"] = resume = _resume(cfg["resume"], tmp)  # before Ray starts (its processes load the CPUs)
        runs: list[tuple[str, Callable[[int], Any]]] = [
            ("loopfence batch, local engine", lambda n: _loopfence(n, tmp))]
        ray_note = "not run in quick mode (Ray's start-up alone takes seconds)"
        session: Any = None
        if not quick:
            session = _ray_session()
            if isinstance(session, str):
                ray_note = session
            else:
                ray_note = f"Ray {session[0].__version__}, local, started in {session[1]:.1f} s (not counted)"
                runs.append(("loopfence batch, Ray backend", lambda n: _loopfence(n, tmp, "ray")))
        runs += [("inspect_ai eval, max_samples default", lambda n: _inspect(n, tmp, None)),
                 (f"inspect_ai eval, max_samples {CONCURRENCY}", lambda n: _inspect(n, tmp, CONCURRENCY))]
        for name, fn in runs:
            for n in cfg["sizes"]:
                print(f"[bench] batch: {name}, {n} episodes", file=sys.stderr, flush=True)
                r = fn(n)
                data["rows"][f"{name} / {n}"] = r
                if isinstance(r, str):
                    rows.append([name, n, r, "", ""])
                    break
                rows.append([name, n, r["episodes_per_s"], r["cpu_ms_per_episode"], r["wall_s"]])
        if session is not None and not isinstance(session, str):
            session[0].shutdown()
    md = [table(["harness", "episodes", "episodes/s", "harness CPU ms/episode", "wall s"], rows),
          f"Ray: {ray_note}."]
    md += _verdict(data["rows"], cfg["sizes"])
    md.append(f"Resume: a {resume['episodes']}-episode job drained with {resume['left']} episodes left "
              f"({resume['share_left']:.0%}); `resume=True` took {resume['wall_share']:.0%} of the fresh run's "
              f"wall time ({resume['resume_wall_s']} s of {resume['fresh_wall_s']} s) and {resume['cpu_share']:.0%} "
              "of its CPU.")
    data["machine_cores"] = os.cpu_count()
    return Section(TITLE, "\n\n".join([__doc__.split("\n\n", 1)[1].strip(), *md]), data)


def _verdict(rows: dict[str, Any], sizes: tuple[int, ...]) -> list[str]:
    out = []
    for n in sizes:
        lf = rows.get(f"loopfence batch, local engine / {n}")
        peers = [v for k, v in rows.items() if k.startswith("inspect_ai") and k.endswith(f"/ {n}")
                 and isinstance(v, dict)]
        ray_row = rows.get(f"loopfence batch, Ray backend / {n}")
        if lf and peers:
            best = min(p["cpu_ms_per_episode"] for p in peers)
            ratio = best / lf["cpu_ms_per_episode"]
            met = "met" if ratio >= INSPECT_GOAL else "NOT met"
            out.append(f"{n} episodes: inspect_ai's harness CPU per episode is {ratio:.1f}x loopfence's local "
                       f"engine's ({best} vs {lf['cpu_ms_per_episode']} ms); goal {INSPECT_GOAL}x: {met}.")
        if lf and isinstance(ray_row, dict):
            extra = ray_row["cpu_ms_per_episode"] - lf["cpu_ms_per_episode"]
            out.append(f"{n} episodes: Ray's overhead per episode over the local engine: {extra:+.2f} ms of CPU "
                       f"({ray_row['episodes_per_s']} vs {lf['episodes_per_s']} episodes/s).")
    return out
