"""`loopfence batch EPISODES.jsonl --out DIR`: many fenced runs, one results table, resumable."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .._batch import BatchError, BatchResult, EpisodeResult, Summary, abatch, read_job
from .._batch._engine import BACKENDS, RESULTS, SUMMARY
from .._batch._results import ResultsError, ResultsFile
from .._batch._recipe import Endpoints, ScriptFile
from .._json import dumps, loads
from .._loop import check_price
from .._prices import PriceError
from .._printable import printable
from .._stops import StopReason
from ..mcp import McpUsageError, open_from_args
from ..mcp import add_flags as add_mcp_flags
from ..models import ScriptError
from ..tools._builtin import BUILTIN_NAMES
from ._common import UsageError, add_profile_flag, limits_from_flags, stderr
from ._toolspec import load_tools
from .run import params_from_flags

__all__ = ["add_parser", "main"]

HELP = "run many episodes (a JSONL file) through the fence, resumable after a kill"
DEFAULT_CONCURRENCY = 16
# settings of the job itself: not changed on --resume
_FIXED = ("script", "tools", "limit", "limits", "param", "prices")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("batch", help=HELP, description=(
        "Run every episode of EPISODES.jsonl (one JSON object a line: id, task, and optionally "
        "system, workspace, limits, policy, params, tools, metadata) through the fenced loop, at most "
        "--concurrency at once, into DIR: episodes/ID.jsonl (each run's log), results.jsonl (a row "
        "per finished episode) and summary.json. Bad lines are reported (file, line, field) before "
        "anything runs. After Ctrl-C or kill -9, `--resume DIR` finishes the job: finished episodes "
        "are not run again, interrupted ones continue from their logs (a side effect of unknown "
        "outcome is never run twice). Ctrl-C once: no new episodes start; twice: the running ones "
        "end `cancelled`. Exit: 0 every episode has its row, 1 some could not run or the batch "
        "stopped early, 2 usage error."))
    p.add_argument("episodes", nargs="?", metavar="EPISODES.jsonl", help="the episodes, one JSON object a line")
    p.add_argument("--out", metavar="DIR", help="the batch folder (must not hold another batch)")
    p.add_argument("--resume", metavar="DIR", help="continue the batch in DIR (its episodes and settings "
                   "are recorded there)")
    p.add_argument("--concurrency", metavar="N", type=int, help=f"episodes at once (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--json", action="store_true", help="one result row per finished episode on stdout")
    p.add_argument("--quiet", action="store_true", help="no live progress and no summary table")
    p.add_argument("--retry-stops", metavar="R1,R2", help="run episodes that ended for these stop reasons "
                   "again from the start (e.g. endpoint_error,cancelled)")
    p.add_argument("--max-retries", metavar="K", type=int, help="re-runs per episode at most (default 1)")
    p.add_argument("--keep-workspaces", action="store_true", default=None,
                   help="keep each episode's workspace copy (DIR/workspaces/ID) after it finishes")
    p.add_argument("--tools", metavar="MODULE:ATTR", action="append",
                   help="custom Python tools (a Tool, a function, or a list of them; repeatable)")
    p.add_argument("--limit", metavar="NAME=VALUE", action="append",
                   help="a default limit for every episode (an episode's own limits win)")
    add_profile_flag(p)  # recorded in job.json with the --limit flags
    p.add_argument("--param", metavar="NAME=VALUE", action="append",
                   help="a default request parameter for every episode (VALUE is JSON when it parses)")
    p.add_argument("--prices", metavar="FILE", help="model prices (TOML: \"model\" = [input, output] dollars "
                   "per million tokens; \"*\" = any model), over the genai-prices table: each row and the "
                   "summary carry dollars; with --limit max_cost_usd=DOLLARS, each episode's budget")
    http = p.add_argument_group("the model")
    http.add_argument("--base-url", metavar="URL", action="append",
                      help="an OpenAI-compatible endpoint (repeatable: episodes are spread over them, "
                      "round-robin; default $LOOPFENCE_BASE_URL; the key comes from $LOOPFENCE_API_KEY "
                      "or $OPENAI_API_KEY)")
    http.add_argument("--model", metavar="NAME", help="model name sent (default: $LOOPFENCE_MODEL)")
    http.add_argument("--max-connections", metavar="M", type=int,
                      help="HTTP connections per endpoint (default: --concurrency)")
    http.add_argument("--stream", action="store_true", default=None, help="stream the replies (SSE)")
    http.add_argument("--script", metavar="FILE", help="instead of an endpoint: scripted replies (JSONL), "
                      "each episode from the first")
    where = p.add_argument_group("where the episodes run")
    where.add_argument("--backend", choices=BACKENDS, help="local (default: this process, one event loop) or "
                       "ray (loopfence[ray]: Ray actors, each running many episodes; logs go straight into "
                       "DIR, which every node must see; rows are written here)")
    where.add_argument("--ray-address", metavar="ADDR", help="a running Ray cluster (default: start a local "
                       "Ray, or $RAY_ADDRESS)")
    where.add_argument("--ray-workers", metavar="N", type=int, help="Ray actors (default: one per CPU Ray has)")
    add_mcp_flags(p)  # the servers start once; every episode shares their tools (recorded for --resume,
    #                   except --mcp-header, which holds secrets: give it again)


# -- settings ------------------------------------------------------------------------------------------
_MCP_RECORDED = ("mcp", "mcp_url", "mcp_trust", "mcp_kind")


def _mcp_args(args: argparse.Namespace, settings: dict[str, Any]) -> argparse.Namespace:
    """The MCP flags as open_from_args reads them: given, or recorded when the batch started."""
    return argparse.Namespace(**{name: settings.get(name) for name in _MCP_RECORDED},
                              mcp_header=args.mcp_header, mcp_timeout=args.mcp_timeout)


def _settings(args: argparse.Namespace) -> tuple[Path, bool, dict[str, Any]]:
    """(the folder, resuming?, the settings): flags over those recorded in job.json on resume."""
    if args.resume:
        if args.out and Path(args.out) != Path(args.resume):
            raise UsageError(f"--out {args.out} and --resume {args.resume} name different folders")
        folder = Path(args.resume)
        try:
            recorded = dict(read_job(folder).get("settings") or {})
        except BatchError as exc:
            raise UsageError(str(exc)) from None
        for name in _FIXED:
            if getattr(args, name):
                raise UsageError(f"--{name} is set when a batch starts (recorded in {folder / 'job.json'}); "
                                 "it cannot change on --resume")
    else:
        if not args.episodes:
            raise UsageError("give EPISODES.jsonl (or --resume DIR)")
        if not args.out:
            raise UsageError("--out DIR is required: the batch folder")
        folder, recorded = Path(args.out), {}
    given = {
        "base_urls": args.base_url, "model": args.model, "stream": args.stream, "script": args.script and
        str(Path(args.script).resolve()), "tools": args.tools, "limits": args.limit,
        "limits_profile": args.limits, "params": args.param,
        "concurrency": args.concurrency, "max_connections": args.max_connections,
        "retry_stops": args.retry_stops and [s.strip() for s in args.retry_stops.split(",") if s.strip()],
        "max_retries": args.max_retries, "keep_workspaces": args.keep_workspaces,
        "prices": args.prices and str(Path(args.prices).resolve()), "backend": args.backend,
        "ray_address": args.ray_address, "ray_workers": args.ray_workers,
        **{name: getattr(args, name) for name in _MCP_RECORDED if getattr(args, name, None) is not None},
    }
    settings = {**recorded, **{k: v for k, v in given.items() if v is not None}}
    settings.setdefault("concurrency", DEFAULT_CONCURRENCY)
    if not settings.get("base_urls") and not settings.get("script") and os.environ.get("LOOPFENCE_BASE_URL"):
        settings["base_urls"] = [os.environ["LOOPFENCE_BASE_URL"]]
    if settings.get("base_urls") and settings.get("script"):
        raise UsageError("--script and --base-url: choose one source of replies")
    if not settings.get("base_urls") and not settings.get("script"):
        raise UsageError("batch needs a model: --base-url URL (or $LOOPFENCE_BASE_URL) or --script FILE")
    if settings.get("backend") == "ray" and (settings.get("mcp") or settings.get("mcp_url")):
        raise UsageError("--mcp with --backend ray: the MCP sessions live in this process, the episodes on "
                         "Ray actors; run MCP batches locally")
    for name, least in (("concurrency", 1), ("max_connections", 1), ("ray_workers", 1), ("max_retries", 0)):
        value = settings.get(name)
        if value is not None and (type(value) is not int or value < least):
            where = f"--{name.replace('_', '-')}" if given.get(name) is not None else \
                f"{name} (recorded in {folder / 'job.json'})"
            raise UsageError(f"{where} must be an integer of at least {least}, got {value!r}")
    return folder, bool(args.resume), settings


def _models(settings: dict[str, Any]) -> tuple[Any, list[Any]]:
    """(the model factory, what to close): picklable, so the Ray backend's actors build their own."""
    try:
        if settings.get("script"):
            recipe: Any = ScriptFile(settings["script"])
        else:
            recipe = Endpoints(list(settings["base_urls"]), settings.get("model"), bool(settings.get("stream")),
                               settings.get("max_connections") or settings["concurrency"])
            recipe.build()  # a bad URL is a usage error now, not an error row per episode
    except ScriptError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(f"--base-url: {exc}") from None
    return recipe, [recipe]


# -- progress ------------------------------------------------------------------------------------------
class _Progress:
    """done/total, episodes per second and counts by stop reason on stderr: a live bar on a
    terminal, a line every few seconds elsewhere. The counts are of every row (on resume, the rows
    written before too); the rate is this run's."""

    EVERY_S = 5.0

    def __init__(self, console: Console, quiet: bool, as_json: bool, folder: Path | None = None) -> None:
        self.console, self.quiet, self.as_json, self.folder = console, quiet, as_json, folder
        self.total = self.before = self.done = 0
        self.stops: Counter[str] = Counter()
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.bar: Any = None
        self.task: Any = None

    def start(self, total: int, before: int) -> None:
        self.total, self.before, self.t0 = total, before, time.perf_counter()
        if self.quiet:
            return
        if before and self.folder is not None:  # the rows that stand (the engine has repaired the file)
            try:
                self.stops.update(r.stop or "error" for r in ResultsFile(self.folder / RESULTS).load())
            except (OSError, ResultsError):
                pass
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                TextColumn("{task.fields[stops]}"), console=self.console)
            self.task = self.bar.add_task("batch", total=total, completed=before, rate="", stops=self._stops())
            self.bar.start()
        else:
            self.console.print(f"batch: {total} episodes, {before} already done", markup=False)

    def result(self, row: EpisodeResult) -> None:
        if self.as_json:
            print(dumps(row.to_json()), file=sys.stdout, flush=True)
        self.done += 1
        self.stops[row.stop or "error"] += 1
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=self.before + self.done, rate=self._rate(), stops=self._stops())
        elif time.perf_counter() - self.last >= self.EVERY_S:
            self.line()

    def _rate(self) -> str:
        wall = time.perf_counter() - self.t0
        return f"{self.done / wall:.1f} episodes/s" if wall > 0 else ""

    def _stops(self) -> str:
        order = {str(s): i for i, s in enumerate(StopReason)}
        return " · ".join(f"{k} {v}" for k, v in sorted(self.stops.items(), key=lambda kv: order.get(kv[0], 99)))

    def line(self) -> None:
        self.last = time.perf_counter()
        self.console.print(f"batch: {self.before + self.done}/{self.total} done, {self._rate()}; {self._stops()}",
                           markup=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        elif not self.quiet and self.done:
            self.line()


def print_summary(s: Summary, folder: Path, console: Console = stderr) -> None:
    table = Table(title="loopfence batch", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    def num(x: Any) -> str:
        return "-" if x is None else f"{x:,}" if isinstance(x, int) else f"{x:,.3f}"

    rows = [("episodes", f"{s.episodes:,} ({s.finished:,} finished, {s.errors:,} could not run, "
             f"{s.pending:,} not run yet)")]
    rows += [(f"  {stop}", f"{n:,}") for stop, n in s.by_stop.items()]
    rows += [("SHIP rate", pct(s.ship_rate)),
             ("tokens", f"{s.tokens:,} (p50 {num(s.tokens_p50)}, p95 {num(s.tokens_p95)})"),
             ("seconds", f"{s.seconds:,.2f} (p50 {num(s.seconds_p50)}, p95 {num(s.seconds_p95)})"),
             ("model requests", f"{s.requests:,}"),
             ("tool executions", f"{s.executions:,} of {s.tool_calls:,} requested "
              f"(saved by the fence: {s.executions_saved:,})"),
             ("retries", f"{s.retries:,} re-runs of {s.retried_episodes:,} episodes"
              + (f" (stops {', '.join(s.retry_stops)}, at most {s.max_retries} each)" if s.retry_stops else "")),
             ("resumed from logs", f"{s.resumed:,}")]
    run = s.this_run
    if s.cost_usd is not None:
        def usd(x: float | None) -> str:
            return "-" if x is None else f"${x:,.6f}"

        rows.insert(4, ("cost", f"{usd(s.cost_usd)} (p50 {usd(s.cost_usd_p50)}, p95 {usd(s.cost_usd_p95)})"))
    if run:
        rows.append(("this run", f"{run.get('episodes', 0):,} episodes in {run.get('wall_s', 0):,.2f}s, "
                     f"{num(run.get('episodes_per_s'))} episodes/s, CPU {num(run.get('cpu_ms_per_episode'))} "
                     "ms/episode"))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    console.print(f"results: {printable(str(folder / 'results.jsonl'))}", markup=False, highlight=False,
                  overflow="ignore", crop=False)


# -- main ----------------------------------------------------------------------------------------------
def main(args: argparse.Namespace) -> int:
    folder, resuming, settings = _settings(args)
    limits = limits_from_flags(settings.get("limits"), profile=settings.get("limits_profile"))
    params = params_from_flags(settings.get("params") or [])
    tools = load_tools(settings.get("tools"))
    models, owned = _models(settings)
    try:  # a cost budget for a model with no price: one line, before the folder is made
        check_price(models.sample(), limits, settings.get("prices"))
    except PriceError as exc:
        raise UsageError(str(exc)) from None
    progress = _Progress(stderr, args.quiet, args.json, folder)
    reserved = [*BUILTIN_NAMES, *(t.name for t in tools)]
    try:
        with open_from_args(_mcp_args(args, settings), reserved=reserved) as mcp:
            result = asyncio.run(_run(args, folder, resuming, settings, models, owned, [*tools, *mcp], limits,
                                      params, progress, mcp.header()))
    except (BatchError, McpUsageError) as exc:
        raise UsageError(str(exc)) from None
    finally:
        progress.close()
    if result is None:  # cancelled: the summary was written on the way out
        if not args.quiet:
            _print_written(folder)
        stderr.print(f"loopfence batch: interrupted; `loopfence batch --resume {folder}` finishes the job",
                     markup=False)
        return 130
    if not args.quiet:
        print_summary(result.summary, folder)
    if result.interrupted:
        stderr.print(f"loopfence batch: {printable(result.interrupted, 2000, one_line=True)}; "
                     f"`loopfence batch --resume {folder}` finishes the job", markup=False)
    s = result.summary
    return 0 if s.errors == 0 and s.pending == 0 and result.interrupted is None else 1


def _print_written(folder: Path) -> None:
    try:
        data = loads((folder / SUMMARY).read_bytes())
    except (OSError, ValueError):
        return
    keys = Summary.__dataclass_fields__
    try:
        print_summary(Summary(**{k: data[k] for k in keys if k in data}), folder)
    except TypeError:
        return


async def _run(args: argparse.Namespace, folder: Path, resuming: bool, settings: dict[str, Any], models: Any,
               owned: list[Any], tools: list[Any], limits: Any, params: dict[str, Any],
               progress: _Progress, header: dict[str, Any]) -> BatchResult | None:
    drain = asyncio.Event()
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        if drain.is_set():
            if me is not None:
                me.cancel()
            return
        drain.set()
        stderr.print("loopfence batch: Ctrl-C: no new episodes start; the running ones finish "
                     "(Ctrl-C again ends them `cancelled`)", markup=False)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        pass
    try:
        return await abatch(None if resuming and not args.episodes else args.episodes, model=models,
                            out=folder, tools=tools, concurrency=settings["concurrency"], resume=resuming,
                            retry_stops=settings.get("retry_stops") or (),
                            max_retries=settings.get("max_retries") if settings.get("max_retries") is not None else 1,
                            limits=limits, params=params, keep_workspaces=bool(settings.get("keep_workspaces")),
                            on_start=progress.start, on_result=progress.result, settings=settings, drain=drain,
                            prices=settings.get("prices"), header=header,
                            backend=settings.get("backend") or "local", ray_address=settings.get("ray_address"),
                            ray_workers=settings.get("ray_workers"))
    except asyncio.CancelledError:
        return None
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        for m in owned:
            await m.aclose()
