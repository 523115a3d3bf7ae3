"""`loopfence run TASK`: one fenced run, a live line per step, a summary, exit 0 SHIP / 1 KILL."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._agent import run
from .._compact import Compaction
from .._gate import APPROVE_MODES, approver
from .._limits import Policy
from .._loop import check_price
from .._prices import PriceError, load_prices
from .._printable import printable
from .._stops import Verdict
from ..mcp import McpUsageError, open_from_args
from ..mcp import add_flags as add_mcp_flags
from ..models import Model, ScriptedModel, ScriptError
from .._log import RunLog
from ..tools import workspace_tools
from ..tools._manifest import snapshot_path
from ._common import (UsageError, add_profile_flag, check_new_log, default_log_path, limits_from_flags,
                      live_printer, print_quiet, print_summary, stderr)
from ._toolspec import load_tools
from .reconcile import reconcile_own_log

__all__ = ["add_parser", "main", "build_model"]

HELP = "run one task through the fenced loop"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help=HELP, description=(
        "Run TASK through the fenced loop. The model is a --script of chat.completions replies "
        "(JSONL, the last repeats), an OpenAI-compatible endpoint (--base-url or "
        "$LOOPFENCE_BASE_URL), or by default the embedded local model (loopfence[local]: "
        "SmolLM2-135M in llama.cpp, no server, no key). "
        "Exit code: 0 SHIP (final answer), 1 KILL (any other stop), 2 usage error."))
    p.add_argument("task", help="the task given to the model as the user message")
    p.add_argument("--script", metavar="FILE", help="scripted replies: JSONL of chat.completions objects")
    p.add_argument("--workspace", metavar="DIR", default=".", help="folder the file tools work in (default: .)")
    p.add_argument("--limit", metavar="NAME=VALUE", action="append", default=[],
                   help="override a limit, e.g. max_steps=5, max_wall_seconds=none, no_progress=off")
    add_profile_flag(p)
    p.add_argument("--param", metavar="NAME=VALUE", action="append", default=[],
                   help="a request parameter sent with every request (repeatable; VALUE is JSON when it "
                   "parses, else text), e.g. tool_choice=none, tool_choice=required, max_tokens=256")
    p.add_argument("--prices", metavar="FILE", help="model prices for --limit max_cost_usd=DOLLARS (TOML: "
                   "\"model\" = [input, output] dollars per million tokens; \"*\" = any model), over the "
                   "genai-prices table; the summary shows dollars")
    p.add_argument("--log", metavar="PATH", help="run log path (default: runs/run-<time>.jsonl)")
    p.add_argument("--snapshot", action="store_true", help="also archive the workspace as the run starts "
                   "(LOG's name with .workspace.tar.gz; path and sha256 in the header) for replay --execute-tools")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--on-bad-call", choices=["fail", "feedback"], default="fail",
                   help="stop on a malformed call (fail, default) or tell the model (feedback)")
    p.add_argument("--quiet", action="store_true", help="nothing on stderr but problems: no live step "
                   "lines, no summary or token table, no reconcile line unless the log does not add up; the "
                   "final answer still goes to stdout, alone (--report's path goes to stderr)")
    p.add_argument("--tools", metavar="MODULE:ATTR", action="append", default=[],
                   help="custom Python tools (a Tool, a function or a list of them), next to the built-ins; "
                   "repeatable; recorded in the header as custom_tools")
    p.add_argument("--nudge", action="store_true", help="the first repetition stop (repeated_call, "
                   "no_progress, ...) becomes one message to the model saying what happened; the next one stops")
    p.add_argument("--last-answer", action="store_true", help="after a budget or repetition stop, one more "
                   "request with tools off for the best answer so far (RunResult.last_answer; still KILL)")
    p.add_argument("--report", action="store_true", help="also write the run's HTML page next to the log "
                   "(loopfence report LOG) and print its path on stderr")
    p.add_argument("--otel", action="store_true", help="send OpenTelemetry GenAI spans and metrics over "
                   "OTLP/HTTP as the OTEL_EXPORTER_OTLP_* variables say (needs loopfence[otel])")
    fence = p.add_argument_group("untrusted content and context")
    fence.add_argument("--untrusted", metavar="GLOB", action="append", default=[],
                       help="workspace files that are untrusted content (repeatable), e.g. 'vendor/**', "
                       "or '**' when reviewing someone else's code; so is HTML that was in the workspace "
                       "when the run started, and any result holding text from either")
    fence.add_argument("--trust", metavar="GLOB", action="append", default=[],
                       help="the mirror of --untrusted: HTML of yours that was in the workspace at the start "
                       "(templates, docs) is trusted, e.g. 'templates/**' (repeatable)")
    fence.add_argument("--approve", choices=APPROVE_MODES, help="privileged calls (run_command, write_file, "
                       "apply_patch) while untrusted content is in context: ask on the terminal, deny, or "
                       "allow all (recorded in the log). Default: ask on a terminal, deny without one")
    fence.add_argument("--keep-turns", metavar="K", type=int, default=Compaction().keep_turns,
                       help="tool results older than the last K turns go to the model as a short stub "
                       "(the log keeps them); default: %(default)s")
    fence.add_argument("--no-compaction", action="store_true", help="send every tool result every turn")
    fence.add_argument("--allow-hardlinks", action="store_true",
                       help="let read_file and apply_patch read files with more than one hard link (by "
                       "default refused: a link made before the run can name a file outside the workspace)")
    p.add_argument("--unsandboxed", action="store_true",
                   help="run_command WITHOUT the bubblewrap sandbox (explicit opt-out; recorded in the run log). "
                   "Its commands run as you and cannot be kept from a secret you can reach")
    p.add_argument("--hide-env", metavar="NAME", action="append", default=[],
                   help="an environment variable --unsandboxed commands do not get (repeatable; "
                   "OPENAI_API_KEY and LOOPFENCE_API_KEY never reach them; the sandbox passes none)")
    local = p.add_argument_group("embedded model (when neither --script nor --base-url is given)")
    local.add_argument("--seed", metavar="N", type=int,
                       help="sampling seed (default 0); with --temperature 0 every seed gives the same run")
    local.add_argument("--temperature", metavar="T", type=float,
                       help="sampling temperature (default 0: greedy, the same run every time)")
    http = p.add_argument_group("OpenAI-compatible endpoint (instead of --script or the embedded model)")
    http.add_argument("--base-url", metavar="URL",
                      help="e.g. http://127.0.0.1:8080/v1 (default: $LOOPFENCE_BASE_URL)")
    http.add_argument("--model", metavar="NAME", help="model name sent to the endpoint (default: "
                      "$LOOPFENCE_MODEL); needs --base-url or $LOOPFENCE_BASE_URL, as drill's --model does")
    http.add_argument("--api-key", metavar="KEY", help="bearer key (default: $LOOPFENCE_API_KEY, then "
                      "$OPENAI_API_KEY; prefer the variables: a flag shows in the process list)")
    http.add_argument("--stream", action="store_true", help="stream the replies (SSE)")
    add_mcp_flags(p)


def build_model(args: argparse.Namespace) -> Model:
    sampling = [flag for flag, value in (("--seed", args.seed), ("--temperature", args.temperature))
                if value is not None]
    if sampling and (args.script or args.base_url or os.environ.get("LOOPFENCE_BASE_URL")):
        raise UsageError(f"{' and '.join(sampling)} set the embedded model's sampling; "
                         "they do not apply to --script or an endpoint")
    endpoint = args.base_url or os.environ.get("LOOPFENCE_BASE_URL")
    if args.model and (args.script or not endpoint):  # it would name no model that is asked: refused
        raise UsageError("--model needs --base-url (or $LOOPFENCE_BASE_URL): it names the endpoint's model"
                         + (", and --script gives the replies" if args.script else
                            "; without an endpoint the embedded model runs"))
    if args.script and args.base_url:
        raise UsageError("--script and --base-url each give the model: pass one")
    if args.script:
        try:
            return ScriptedModel.from_file(args.script)
        except ScriptError as exc:
            raise UsageError(str(exc)) from None
    if args.base_url or os.environ.get("LOOPFENCE_BASE_URL"):
        from ..models._openai import OpenAIModel

        try:
            return OpenAIModel.from_env(args.base_url, args.model, args.api_key, stream=args.stream)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return _local_model(args.seed, args.temperature)


def _local_model(seed: int | None = None, temperature: float | None = None) -> Model:
    """The embedded default (loopfence[local]); a missing extra is a one-line usage error."""
    from ..models._local import LocalModel, LocalModelUnavailable

    if temperature is not None and not 0 <= temperature <= 2:
        raise UsageError(f"--temperature must be between 0 and 2, got {temperature}")
    options: dict[str, Any] = {}
    if seed is not None:
        options["seed"] = seed
    if temperature is not None:
        options["temperature"] = temperature
    try:
        return LocalModel(**options)
    except LocalModelUnavailable as exc:
        raise UsageError(str(exc)) from None


_NOT_PARAMS = ("model", "messages", "tools", "stream", "stream_options")  # the adapter's own


def params_from_flags(pairs: list[str]) -> dict[str, Any]:
    """`--param NAME=VALUE` flags: VALUE as JSON when it parses (numbers, true, null, objects),
    else as text (`tool_choice=auto`)."""
    params: dict[str, Any] = {}
    for text in pairs:
        name, sep, raw = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--param expects NAME=VALUE, got {text!r}")
        if name in _NOT_PARAMS:
            raise UsageError(f"--param {name}: set by loopfence itself, not a request parameter")
        try:
            params[name] = json.loads(raw, parse_constant=_not_json)
        except ValueError:
            params[name] = raw
    return params


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")  # NaN, Infinity: kept as text


def main(args: argparse.Namespace) -> int:
    limits = limits_from_flags(args.limit, profile=args.limits)
    params = params_from_flags(getattr(args, "param", None) or [])
    workspace = Path(args.workspace)
    if not workspace.is_dir():
        raise UsageError(f"--workspace {workspace}: not a folder")
    if args.keep_turns < 1:
        raise UsageError(f"--keep-turns must be at least 1, got {args.keep_turns} (or --no-compaction)")
    compaction = Compaction.off() if args.no_compaction else Compaction(keep_turns=args.keep_turns)
    approve = approver(args.approve)  # recorded in the log header as gate.approve
    model = build_model(args)
    try:  # a cost budget with no price for the model: one line, before the log is made
        prices = load_prices(args.prices) if args.prices else None
        check_price(model, limits, prices)
    except PriceError as exc:
        raise UsageError(str(exc)) from None
    log_path = Path(args.log) if args.log else default_log_path()
    check_new_log(log_path)
    custom = load_tools(args.tools)  # a usage error here leaves no log behind
    try:
        log = RunLog(log_path, on_event=None if args.quiet else live_printer())
    except OSError as exc:  # a folder, a missing or read-only place: one line, exit 2
        raise UsageError(f"--log {log_path}: {exc.strerror or exc}") from None
    snapshot = snapshot_path(log_path) if args.snapshot else None  # taken with the manifest, at the start
    builtins = workspace_tools(workspace, sandbox=not args.unsandboxed, untrusted_globs=args.untrusted,
                               trust_globs=args.trust, hide_env=args.hide_env,
                               allow_hardlinks=args.allow_hardlinks, snapshot=snapshot)
    policy = Policy(on_bad_call=args.on_bad_call, nudge=args.nudge, last_answer=args.last_answer)
    header = {"workspace": str(workspace.resolve()), "unsandboxed": args.unsandboxed,
              "sandbox": "none" if args.unsandboxed else "bubblewrap", "untrusted_globs": args.untrusted,
              "trust_globs": args.trust, "allow_hardlinks": args.allow_hardlinks,
              **({"custom_tools": args.tools} if args.tools else {})}
    with _observed(args) as on_event:
        try:
            with open_from_args(args, reserved=[t.name for t in (*builtins, *custom)]) as mcp:
                result = run(args.task, model=model, tools=[*builtins, *custom, *mcp], limits=limits,
                             policy=policy, system=args.system, log=log, params=params, prices=prices,
                             approve=approve, compaction=compaction, on_event=on_event,
                             header={**header, **mcp.header()})
        except McpUsageError as exc:
            raise UsageError(str(exc)) from None
    if args.quiet:
        print_quiet(result)
    else:
        print_summary(result)
    reconciled = reconcile_own_log(result.log_path, quiet=args.quiet)  # the log must add up; say so
    if args.report and result.log_path:
        from .._report import write_run_report

        page = write_run_report(result.log_path)  # said on stderr, as the log's path is: stdout is the answer's
        stderr.print(f"report: {printable(str(page))}", markup=False, highlight=False, overflow="ignore", crop=False)
    return 0 if result.verdict is Verdict.SHIP and reconciled else 1


@contextlib.contextmanager
def _observed(args: argparse.Namespace) -> Iterator[Any]:
    """--otel: OTLP exporters as the OTEL_EXPORTER_OTLP_* variables say, flushed at the end; the
    run's on_event (None without the flag)."""
    if not args.otel:
        yield None
        return
    try:
        from ..otel import configure, instrument
    except ImportError as exc:
        raise UsageError(f"--otel needs loopfence[otel] (pip install 'loopfence[otel]'): {exc}") from None
    shutdown = configure()
    try:
        yield instrument().on_event
    finally:
        shutdown()
