"""The local batch engine: many fenced runs on one event loop, a folder that survives a kill.

    result = await abatch("episodes.jsonl", model=OpenAIModel(url, "m"), out="runs/job", concurrency=32)
    result.summary.by_stop, result.rows

At most `concurrency` episodes run at once (a semaphore); each is `arun()` with its own log
(`episodes/ID.jsonl`) and, when it has a workspace or built-in tools, its own copy of the workspace
(`workspaces/ID/`, removed when it finishes unless `keep_workspaces`; a batch folder inside the
workspace is left out of the copy). A row goes to `results.jsonl` as each episode finishes, in one
write. Resuming (`resume=True`) reads the folder back: an episode
with a row is done; one with a log and no row is continued from its log (`_drivers.resume`: a
side-effecting call whose outcome is unknown is never run again), or, when its log already ends
with a stop, gets its row from that stop; the rest start. Episodes that ended for one of
`retry_stops` run again from the start (a fresh workspace, the old log kept under `retries/ID/`),
at most `max_retries` times each; rows of episodes that could not run at all are dropped on resume
and tried again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._keywords import keywords_checked
from .._aio import run_sync
from .._json import dumps, loads
from .._limits import Limits, Policy
from .._loop import check_price
from .._setup import config_of
from .._prices import PriceError, PricesArg, load_prices
from .._stops import StopReason
from .._drivers._resume import resume
from ..models._scripted import ScriptedModel
from .._log import LogError
from .._log._reader import read_log
from .._log._writer import LogWriteError
from ._episodes import Episode, EpisodeError, load_episodes, parse_episodes
from ._kit import Kit, ModelSource, ToolSource, WorkerLost
from ._results import EpisodeResult, ResultsError, ResultsFile, Summary, summarize

__all__ = ["abatch", "batch", "BatchResult", "BatchError", "ModelSource", "ToolSource", "JOB_FORMAT",
           "JOB", "INPUT", "RESULTS", "SUMMARY", "EPISODES", "WORKSPACES", "RETRIES", "read_job", "BACKENDS"]

JOB_FORMAT = "loopfence.batch.job"
JOB_VERSION = 1  # job.json's layout
JOB, INPUT, RESULTS, SUMMARY = "job.json", "input.jsonl", "results.jsonl", "summary.json"
EPISODES, WORKSPACES, RETRIES = "episodes", "workspaces", "retries"

BACKENDS = ("local", "ray")


class BatchError(ValueError):
    """A batch that cannot start: bad episodes, a folder that holds another job, bad settings."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    out: Path
    summary: Summary
    rows: list[EpisodeResult]  # every row of results.jsonl, in the episodes' order
    interrupted: str | None = None  # why some episodes have no row yet (`resume` finishes them)


@keywords_checked
async def abatch(episodes: str | Path | Iterable[Episode | Mapping[str, Any]] | None = None, *,
                 model: ModelSource, out: str | Path, tools: ToolSource = (), concurrency: int = 16,
                 resume: bool = False, retry_stops: Iterable[str | StopReason] = (), max_retries: int = 1,
                 limits: Limits | Mapping[str, Any] | str | None = None, policy: Policy | None = None,
                 params: dict[str, Any] | None = None, keep_workspaces: bool = False,
                 on_start: Callable[[int, int], None] | None = None,
                 on_result: Callable[[EpisodeResult], None] | None = None,
                 settings: dict[str, Any] | None = None, drain: asyncio.Event | None = None,
                 prices: PricesArg = None, header: dict[str, Any] | None = None, backend: str = "local",
                 ray_address: str | None = None, ray_workers: int | None = None,
                 run_options: Mapping[str, Any] | None = None) -> BatchResult:
    """Run every episode (a JSONL path, or episodes in Python) into the folder `out`; the core.

    model: a Model shared by every episode (it must serve concurrent requests, as OpenAIModel does),
      or a factory called with each Episode (per-episode settings, a replica each).
    tools: custom tools for every episode, or a factory `(episode, workspace or None) -> tools`;
      an episode's `tools` names pick among them and the built-ins.
    limits/policy/params: the defaults under each episode's own (limits: also a profile's name).
    resume: continue the job in `out` (episodes None: the ones it was started with).
    on_start(total, done_before) and on_result(row): progress hooks, called on the loop.
    settings: recorded in job.json (the CLI keeps its flags there for `--resume`).
    drain: once set, no new episode (or retry) starts; those running finish.
    prices: the price table for `Limits(max_cost_usd=...)` and the rows' `cost_usd` (as `run()` takes
      it); a model with no price under a cost budget is a BatchError before anything runs.
    header: more for each episode log's header (e.g. the MCP servers' `McpTools.header()`).
    run_options: more of arun()'s keywords for every episode (gate, approve, compaction, guards,
      executor, on_event; system where the episode has none): what an `Agent.batch` carries.
    backend: "local" (this event loop) or "ray" (`loopfence[ray]`): each fresh attempt runs on one of
      `ray_workers` Ray actors (default: one per CPU Ray has), each running many episodes on its own
      event loop; Ray is started here (`ray.init(address=ray_address)`) unless it already is. The
      model, tools and settings go to the actors by pickling (a model factory builds its model
      there); logs are written straight into `out` (on a cluster, a folder every node shares), rows
      by this process only. A worker that dies loses only its episodes in flight: no row, their logs
      kept, and `resume` finishes them (here, from their logs).
    Cancelling the awaiting task ends the running episodes `cancelled` (their rows are written).
    """
    if concurrency < 1:
        raise BatchError(f"concurrency must be at least 1, got {concurrency}")
    if max_retries < 0:
        raise BatchError(f"max_retries must be at least 0, got {max_retries}")
    if backend not in BACKENDS:
        raise BatchError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    stops = _retry_stops(retry_stops)
    started, cpu0 = time.perf_counter(), time.process_time()
    folder = Path(out)
    results = ResultsFile(folder / RESULTS)
    try:
        prices = load_prices(prices) if isinstance(prices, (str, Path)) else prices  # read once, not per episode
        kit = Kit.of(model, tools, limits=config_of(Limits, limits, "limits"), policy=policy or Policy(),
                     params=dict(params or {}), prices=prices, header=dict(header or {}),
                     run_options=dict(run_options or {}))
        if not kit.is_factory:  # the check each episode's run makes at its start, once, before the folder
            check_price(kit.model, kit.limits, prices, kit.params)  # type: ignore[arg-type]
    except (PriceError, ValueError) as exc:
        raise BatchError(str(exc)) from None
    engine = _Engine(folder, kit, stops, max_retries, keep_workspaces, results, on_result, drain)
    job = _open_job(folder, episodes, resume, settings, kit.custom_names())
    try:
        rows = _reconcile_rows(folder, job, results, stops, max_retries, keep_workspaces)
    except ResultsError as exc:
        raise BatchError(str(exc)) from None
    engine.rows.update({r.id: r for r in rows})
    todo = [ep for ep in job if ep.id not in engine.rows]
    if backend == "ray" and todo:
        from ._ray import RayBackend

        try:
            engine.remote = RayBackend(kit, address=ray_address, workers=ray_workers)
        except ValueError as exc:  # RayUnavailable: the job is recorded; `resume` (any backend) runs it
            raise BatchError(str(exc)) from None
    if on_start is not None:
        on_start(len(job), len(job) - len(todo))
    try:
        await engine.run_all(todo, concurrency)
    finally:
        if engine.remote is not None:
            engine.remote.close()
        results.close()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu0
        ran = engine.ran
        this_run = {"episodes": ran, "wall_s": round(wall, 3), "episodes_per_s": round(ran / wall, 3) if wall else None,
                    "cpu_s": round(cpu, 3), "cpu_ms_per_episode": round(cpu * 1000 / ran, 3) if ran else None,
                    "resumed": engine.resumed, "retries": engine.retries}
        ordered = [engine.rows[ep.id] for ep in job if ep.id in engine.rows]
        summary = summarize(ordered, len(job), retry_stops=stops, max_retries=max_retries if stops else 0,
                            this_run=this_run)
        _write_json(folder / SUMMARY, summary.to_json())
    if engine.crash is not None:
        raise engine.crash
    lost = (f"{len(engine.lost)} episode(s) were lost with a Ray worker that died ({', '.join(engine.lost[:5])}"
            f"{', ...' if len(engine.lost) > 5 else ''})") if engine.lost else None
    why = engine.halted or lost or ("drained: no new episodes were started" if summary.pending else None)
    return BatchResult(folder, summary, ordered, why)


@keywords_checked
def batch(episodes: str | Path | Iterable[Episode | Mapping[str, Any]] | None = None, *, model: ModelSource,
          out: str | Path, tools: ToolSource = (), concurrency: int = 16, resume: bool = False,
          retry_stops: Iterable[str | StopReason] = (), max_retries: int = 1,
          limits: Limits | Mapping[str, Any] | str | None = None,
          policy: Policy | None = None, params: dict[str, Any] | None = None, keep_workspaces: bool = False,
          on_start: Callable[[int, int], None] | None = None,
          on_result: Callable[[EpisodeResult], None] | None = None,
          settings: dict[str, Any] | None = None, prices: PricesArg = None,
          header: dict[str, Any] | None = None, backend: str = "local", ray_address: str | None = None,
          ray_workers: int | None = None, run_options: Mapping[str, Any] | None = None) -> BatchResult:
    """`abatch` from sync code (an event loop of its own; on a helper thread inside a running loop)."""
    return run_sync(abatch(episodes, model=model, out=out, tools=tools, concurrency=concurrency, resume=resume,
                           retry_stops=retry_stops, max_retries=max_retries, limits=limits, policy=policy,
                           params=params, keep_workspaces=keep_workspaces, on_start=on_start,
                           on_result=on_result, settings=settings, prices=prices, header=header,
                           backend=backend, ray_address=ray_address, ray_workers=ray_workers,
                           run_options=run_options))


# -- the folder ------------------------------------------------------------------------------------
def read_job(folder: str | Path) -> dict[str, Any]:
    """job.json of a batch folder (BatchError when there is none or it is not one)."""
    path = Path(folder) / JOB
    try:
        data = loads(path.read_bytes())
    except FileNotFoundError:
        raise BatchError(f"{folder}: no batch here (no {JOB}); start one with EPISODES.jsonl --out {folder}") from None
    except (OSError, ValueError) as exc:
        raise BatchError(f"{path}: cannot read: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != JOB_FORMAT:
        raise BatchError(f"{path}: not a loopfence batch job")
    if data.get("version") != JOB_VERSION:
        raise BatchError(f"{path}: a batch job of version {data.get('version')!r}; this loopfence reads "
                         f"version {JOB_VERSION}")
    if not isinstance(data.get("settings", {}), dict):
        raise BatchError(f"{path}: field 'settings' must be an object")
    return data


def _open_job(folder: Path, episodes: Any, resume: bool, settings: dict[str, Any] | None,
              custom: list[str] | None) -> list[Episode]:
    """The episodes of the job in `folder`: written there on a fresh start, read back on resume
    (where `settings`, when given, replace the recorded ones: the next resume starts from them)."""
    try:
        if resume:
            job = read_job(folder)
            recorded = load_episodes(folder / INPUT, custom_tools=None, check_workspaces=False)
            _check_workspaces(folder, recorded)
            if episodes is not None:
                given = _load(episodes, custom, check=False)
                if [e.to_json() for e in given] != [e.to_json() for e in recorded]:
                    raise BatchError(f"the episodes differ from the ones {folder} was started with "
                                     f"({folder / INPUT}); resume without them, or use another folder")
            if settings is not None and settings != job.get("settings"):
                _write_json(folder / JOB, {**job, "settings": settings})
            return recorded
        if (folder / JOB).exists() or (folder / RESULTS).exists():
            raise BatchError(f"{folder} already holds a batch; resume it (--resume {folder}) or choose "
                             "another folder")
        if episodes is None:
            raise BatchError("no episodes given")
        job = _load(episodes, custom, check=True)
        _check_workspaces(folder, job)
        try:
            (folder / EPISODES).mkdir(parents=True, exist_ok=True)
            _write_text(folder / INPUT, "".join(dumps(e.to_json()) + "\n" for e in job))
            source = str(Path(episodes).resolve()) if isinstance(episodes, (str, Path)) else None
            _write_json(folder / JOB, {"format": JOB_FORMAT, "version": JOB_VERSION,
                                       "created_at": datetime.now(timezone.utc).isoformat(),
                                       "source": source, "episodes": len(job), "settings": settings or {}})
        except OSError as exc:
            raise BatchError(f"--out {folder}: {exc.strerror or exc}") from None
        return job
    except EpisodeError as exc:
        raise BatchError(str(exc)) from None


def _check_workspaces(folder: Path, job: list[Episode]) -> None:
    """An episode's workspace may hold the batch folder (its copies leave the folder out), but must
    not be the folder itself or lie inside its workspace copies: each copy would hold itself."""
    out = folder.resolve()
    for ep in job:
        if ep.workspace is None:
            continue
        ws = Path(ep.workspace)
        if ws == out or ws.is_relative_to(out / WORKSPACES):
            where = "is" if ws == out else f"lies inside the workspace copies ({WORKSPACES}/) of"
            line = f" (line {ep.line})" if ep.line else ""
            raise BatchError(f"episode {ep.id!r}{line}: workspace: {ws} {where} the batch folder --out {folder}, "
                             "so each copy would hold itself; choose an --out outside it or in a subfolder of it")


def _load(episodes: Any, custom: list[str] | None, check: bool) -> list[Episode]:
    if isinstance(episodes, (str, Path)):
        return load_episodes(episodes, custom_tools=custom, check_workspaces=check)
    return parse_episodes(episodes, custom_tools=custom, check_workspaces=check)


def _reconcile_rows(folder: Path, job: list[Episode], results: ResultsFile, stops: tuple[str, ...],
                    max_retries: int, keep: bool) -> list[EpisodeResult]:
    """The rows that stand: a torn last line is cut off; rows of episodes that could not run and of
    episodes to retry are taken out (their logs moved under retries/), so each episode keeps exactly
    one row."""
    rows = results.load()
    ids = {e.id for e in job}
    seen: set[str] = set()
    for r in rows:
        if r.id not in ids:
            raise ResultsError(f"{results.path}: a row for {r.id!r}, which is not an episode of this job")
        if r.id in seen:
            raise ResultsError(f"{results.path}: {r.id!r} has two rows")
        seen.add(r.id)
    again = [r for r in rows if r.error is not None or (r.stop in stops and r.attempts <= max_retries)]
    if again:
        results.rewrite(r for r in rows if r not in again)  # first: a kill now leaves the log to recover
        for r in again:
            if r.error is None:
                _rotate(folder, r.id, r.attempts)
    kept = [r for r in rows if r not in again]
    if not keep:
        for r in kept:
            shutil.rmtree(folder / WORKSPACES / r.id, ignore_errors=True)
    return kept


def _rotate(folder: Path, ident: str, attempt: int) -> None:
    log = folder / EPISODES / f"{ident}.jsonl"
    if log.exists():
        dest = folder / RETRIES / ident / f"attempt-{attempt}.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(log, dest)


def _leave_out(folder: Path) -> Callable[[str, list[str]], set[str]]:
    """copytree's `ignore`: the batch folder, when it lies inside the workspace copied (its logs and
    every episode's copy), is left out of the copy."""
    out = os.path.realpath(folder)
    name = os.path.basename(out)

    def skip(where: str, names: list[str]) -> set[str]:
        return {n for n in names if n == name and os.path.realpath(os.path.join(where, n)) == out}
    return skip


def _attempts_before(folder: Path, ident: str) -> int:
    where = folder / RETRIES / ident
    return len(list(where.glob("attempt-*.jsonl"))) if where.is_dir() else 0


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_json(path: Path, data: Any) -> None:
    _write_text(path, dumps(data, indent=2) + "\n")


def _retry_stops(stops: Iterable[str | StopReason]) -> tuple[str, ...]:
    known = {str(s) for s in StopReason}
    out = []
    for s in stops:
        name = str(s).strip()
        if name not in known:
            raise BatchError(f"retry stop {name!r} is not a stop reason (known: {', '.join(sorted(known))})")
        if name == str(StopReason.FINAL_ANSWER):
            raise BatchError("final_answer is the successful stop; retrying it would run finished work again")
        if name not in out:
            out.append(name)
    return tuple(out)


# -- the episodes ----------------------------------------------------------------------------------
class _Engine:
    def __init__(self, folder: Path, kit: Kit, stops: tuple[str, ...], max_retries: int, keep: bool,
                 results: ResultsFile, on_result: Callable[[EpisodeResult], None] | None,
                 drain: asyncio.Event | None) -> None:
        self.folder = folder
        self.kit = kit
        self.remote: Any = None  # a Ray backend (_batch/_ray.RayBackend): fresh attempts run there
        self.stops, self.max_retries, self.keep = stops, max_retries, keep
        self.results = results
        self.on_result = on_result
        self.drain = drain
        self.rows: dict[str, EpisodeResult] = {}
        self.ran = self.resumed = self.retries = 0
        self.lost: list[str] = []  # episodes in flight on a Ray worker that died (no row: resume finishes them)
        self.halted: str | None = None
        self.crash: BaseException | None = None

    @property
    def stopping(self) -> bool:
        return self.halted is not None or self.crash is not None or (self.drain is not None and self.drain.is_set())

    async def run_all(self, todo: list[Episode], concurrency: int) -> None:
        gate = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def one(ep: Episode) -> None:
            try:
                await self.episode(ep)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - a bug here ends the batch, reported
                self.crash = self.crash or exc
            finally:
                gate.release()

        try:
            for ep in todo:
                await gate.acquire()
                if self.stopping:
                    gate.release()
                    break
                task = asyncio.create_task(one(ep), name=f"loopfence-batch-{ep.id}")
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def episode(self, ep: Episode) -> None:
        attempts = 1 + _attempts_before(self.folder, ep.id)
        log = self.folder / EPISODES / f"{ep.id}.jsonl"
        try:
            row = await self._recover(ep, log, attempts) if log.exists() else None
            if row is None:
                row = await self._fresh(ep, log, attempts)
            while row.stop in self.stops and row.attempts <= self.max_retries and not self.stopping:
                _rotate(self.folder, ep.id, row.attempts)
                self.retries += 1
                row = await self._fresh(ep, log, row.attempts + 1)
        except LogWriteError as exc:  # the disk: no row, the log resumable; nothing more starts
            self.halted = self.halted or str(exc)
            return
        except WorkerLost:  # no row: `resume` continues it from its log (or starts it)
            self.lost.append(ep.id)
            return
        except asyncio.CancelledError:  # a run ends `cancelled` (its stop line written): its row goes too;
            row = self._from_log(ep, log, attempts)  # otherwise no row: resume picks the episode up
            if row is not None:
                self._finish(ep, row)
            raise
        self._finish(ep, row)

    def _finish(self, ep: Episode, row: EpisodeResult) -> None:
        try:
            self.results.append(row)
        except OSError as exc:
            self.halted = self.halted or f"cannot write {self.results.path}: {exc.strerror or exc}"
            return
        self.rows[ep.id] = row
        self.ran += 1
        if not self.keep:
            shutil.rmtree(self.folder / WORKSPACES / ep.id, ignore_errors=True)
        if self.on_result is not None:
            self.on_result(row)

    def _rel(self, log: Path) -> str:
        return str(log.relative_to(self.folder))

    async def _fresh(self, ep: Episode, log: Path, attempts: int) -> EpisodeResult:
        try:
            ws = await asyncio.to_thread(self._workspace, ep) if ep.needs_workspace else None
        except OSError as exc:  # an episode that cannot start is an error row
            return EpisodeResult.failed(ep.id, f"cannot start: {type(exc).__name__}: {exc}", ep.metadata, attempts)
        if self.remote is not None:
            return await self.remote.fresh(ep, ws, log, attempts, self.folder)  # type: ignore[no-any-return]
        return await self.kit.fresh(ep, ws, log, attempts, self.folder)

    async def _recover(self, ep: Episode, log: Path, attempts: int) -> EpisodeResult | None:
        """The row of an episode that has a log and no row: from its stop, or by resuming it. None:
        its header never made it to the file (nothing ran): start it afresh."""
        try:
            with log.open("rb") as fh:
                head = fh.read(1 << 20)
        except OSError as exc:
            return EpisodeResult.failed(ep.id, f"cannot read its log: {exc}", ep.metadata, attempts, self._rel(log))
        if b"\n" not in head:
            log.unlink()
            return None
        ended = self._from_log(ep, log, attempts)
        if ended is not None:
            return ended
        ws = self.folder / WORKSPACES / ep.id if ep.needs_workspace else None
        try:
            if ws is not None and not ws.is_dir():
                raise ValueError(f"its workspace copy {ws} is gone")
            tools = self.kit.tools_for(ep, ws)
            model = self.kit.model_for(ep)
            live = None if type(model) is ScriptedModel else model  # rebuilt from the header: the script goes on
            outcome = await asyncio.to_thread(resume, log, model=live, tools=tools)
        except LogWriteError:
            raise
        except Exception as exc:  # noqa: BLE001 - it cannot be resumed: say so, never run it again
            return EpisodeResult.failed(ep.id, f"cannot resume its log: {exc}", ep.metadata, attempts, self._rel(log))
        if outcome.result is None:
            return self._from_log(ep, log, attempts)
        self.resumed += 1
        return EpisodeResult.of_run(ep.id, outcome.result, ep.metadata, attempts, self._rel(log), resumed=True)

    def _from_log(self, ep: Episode, log: Path, attempts: int) -> EpisodeResult | None:
        """The row of a log that ends with its stop; None when it does not (or cannot be read)."""
        try:
            stop = read_log(log, tolerant=True).stop
        except (LogError, OSError):
            return None
        if stop is None:
            return None
        return EpisodeResult.of_stop(ep.id, stop, ep.metadata, attempts, self._rel(log))

    def _workspace(self, ep: Episode) -> Path:
        """A fresh copy of the episode's workspace (an empty folder when it has none)."""
        where = self.folder / WORKSPACES / ep.id
        if where.exists():
            shutil.rmtree(where)
        if ep.workspace is not None:
            shutil.copytree(ep.workspace, where, symlinks=True, ignore=_leave_out(self.folder))
        else:
            where.mkdir(parents=True)
        return where.resolve()
