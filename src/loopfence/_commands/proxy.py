"""`loopfence proxy`: the fence on the wire, in front of any OpenAI-compatible endpoint (docs/proxy.md)."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

from ._common import UsageError, limits_from_flags

__all__ = ["add_parser", "main"]

HELP = "serve the Chat Completions API with loopfence's rules, stops and logs in front of any endpoint"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("proxy", help=HELP, description=(
        "An OpenAI-compatible server (POST /v1/chat/completions, GET /v1/models) in front of --upstream "
        "(default: the embedded model). Any agent pointed at it by base URL runs under loopfence's rules: "
        "budgets and context fit before each request, the contract and repeated_call on each reply, "
        "results counted and fingerprinted from the next request. A stop ends the client's loop as a "
        "model would (an answer with no tool calls), or as HTTP 400 with --on-stop error. One log per run "
        "in --logs, readable by reconcile, replay, report and export. Prints one line, "
        "`loopfence proxy: listening on URL (upstream: ...)`, and serves until SIGTERM or Ctrl-C (exit 0). "
        "The upstream key comes from LOOPFENCE_UPSTREAM_KEY, else OPENAI_API_KEY."))
    p.add_argument("--upstream", metavar="URL", help="the endpoint's base URL, e.g. http://127.0.0.1:8080/v1 "
                   "(default: the embedded model, no server needed)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (0: any free port; default 8765)")
    p.add_argument("--logs", metavar="DIR", default="runs", help="one run log per run, <run id>.jsonl "
                   "(default: runs); runs left open there (a crash, --keep-runs) continue after a restart")
    p.add_argument("--limit", metavar="NAME=VALUE", action="append", default=[],
                   help="a limit, e.g. max_steps=30 (repeatable)")
    p.add_argument("--limits", metavar="PROFILE", choices=["default", "coding", "chat"],
                   help="a limit profile: default, coding or chat (--limit flags apply over it)")
    p.add_argument("--on-stop", choices=["answer", "error"], default="answer",
                   help="answer: the stop is an assistant message with no tool calls (default); error: "
                   "HTTP 400 with an OpenAI-style error body, the stop as its code (not retried by the SDKs)")
    p.add_argument("--kinds", metavar="FILE.toml", help="tool kinds: `name = \"poll\"` (exempt from "
                   "repetition rules) or \"side_effect\" (the default)")
    p.add_argument("--state", metavar="URL", help="where run state lives: redis://HOST:PORT/N shares it between "
                   "replicas behind one load balancer (the redis extra; run Redis with appendonly yes, appendfsync "
                   "always); default: in this process")
    p.add_argument("--expire-after", metavar="SECONDS", type=float, default=86400.0,
                   help="forget a run idle this long (its log stays; default 86400, a day)")
    p.add_argument("--lease", metavar="SECONDS", type=float, default=30.0,
                   help="with --state: how long a replica killed mid-request holds its run before another "
                   "replica may take it over (renewed while a request is at work; default 30)")
    p.add_argument("--session-header", metavar="NAME", action="append", default=[],
                   help="a request header whose value names a session: its conversations are runs that share "
                   "its budgets (repeatable; built in: x-session-id, x-litellm-session-id, "
                   "x-claude-code-session-id, session-id)")
    p.add_argument("--budget-per-turn", action="store_true",
                   help="a named run ends at a text answer, and the name's next request starts fresh budgets "
                   "(NAME-2, ...): for chat front-ends that fence each user turn; default: one set of budgets "
                   "for as long as the name lives (POST /loopfence/runs/NAME/reset starts afresh)")
    p.add_argument("--keep-runs", action="store_true",
                   help="on SIGTERM, leave the runs waiting on their clients open, for a restart on the same --logs to "
                   "continue them (default: SIGTERM ends them, as POST /loopfence/runs/ID/reset does, so every log "
                   "left is finished; a crash leaves them open)")
    p.add_argument("--key", metavar="KEY", action="append", default=[],
                   help="a client key (repeatable): clients then send Authorization: Bearer KEY, and each "
                   "sees only its own runs")


def main(args: argparse.Namespace) -> int:
    try:
        from ..proxy import Proxy, Settings, load_kinds
        from ..proxy._proxy import serve
    except ImportError as exc:  # starlette / uvicorn: the `proxy` extra
        raise UsageError(f"loopfence proxy needs the proxy extra ({exc.name} is missing): "
                         "pip install 'loopfence[proxy]'") from None

    limits = limits_from_flags(args.limit, profile=args.limits)
    try:
        kinds = load_kinds(args.kinds) if args.kinds else {}
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0-65535, got {args.port}")
    if not args.expire_after > 0:
        raise UsageError(f"--expire-after must be a number of seconds over 0, got {args.expire_after}")
    if not args.lease > 0:
        raise UsageError(f"--lease must be a number of seconds over 0, got {args.lease}")
    if args.state is not None and not args.state.startswith(("redis://", "rediss://", "unix://")):
        raise UsageError(f"--state must be a redis://HOST:PORT/N URL (or rediss://, unix://), got {args.state!r}")
    bad = next((h for h in args.session_header if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", h)), None)
    if bad is not None:
        raise UsageError(f"--session-header must be an HTTP header name, got {bad!r}")
    settings = Settings(limits=limits, kinds=kinds, on_stop=args.on_stop, logs=Path(args.logs),
                        expire_after=args.expire_after, per_turn=args.budget_per_turn,
                        session_headers=tuple(args.session_header), keep_runs=args.keep_runs)
    try:
        proxy = Proxy(args.upstream, settings, keys=args.key, state=args.state, lease=args.lease)
    except ValueError as exc:
        raise UsageError(str(exc) if str(exc).startswith("--state") else f"--upstream: {exc}") from None
    where = proxy.upstream.describe()

    def announce(url: str) -> None:
        print(f"loopfence proxy: listening on {url} (upstream: {where})", flush=True)

    try:
        asyncio.run(serve(proxy, args.host, args.port, announce))
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    return 0
