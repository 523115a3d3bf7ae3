"""`loopfence proxy`: the fence on the wire, in front of any OpenAI-compatible endpoint (docs/proxy.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from pathlib import Path
from typing import Any

from ._common import UsageError, limits_from_flags

__all__ = ["add_parser", "main"]

HELP = "serve the Chat Completions and Anthropic Messages APIs with loopfence's rules, stops and logs"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("proxy", help=HELP, description=(
        "An OpenAI-compatible server (POST /v1/chat/completions, GET /v1/models) and an Anthropic one "
        "(POST /v1/messages: Claude Code) in front of --upstream (default: the embedded model). Any agent "
        "pointed at it by base URL runs under loopfence's rules, under the coding limit profile unless "
        "--limits or --limit say otherwise: "
        "budgets and context fit before each request, the contract and repeated_call on each reply, "
        "results counted and fingerprinted from the next request. A stop ends the client's loop as a "
        "model would (an answer with no tool calls), or as HTTP 400 with --on-stop error. One log per run "
        "in --logs, readable by reconcile, replay, report and export. Prints "
        "`loopfence proxy: listening on URL (upstream: ...; limits: ...)`, then the address each kind of "
        "client takes, and serves until SIGTERM or Ctrl-C (exit 0). The upstream key comes from "
        "LOOPFENCE_UPSTREAM_KEY, else OPENAI_API_KEY; an Anthropic upstream's from LOOPFENCE_ANTHROPIC_KEY, "
        "else ANTHROPIC_API_KEY, else the client's own."))
    p.add_argument("--upstream", metavar="URL", action="append", default=[],
                   help="the endpoint's base URL, e.g. http://127.0.0.1:8080/v1 (default: the embedded model, no "
                   "server needed); anthropic=URL: an Anthropic Messages endpoint, given as ANTHROPIC_BASE_URL is "
                   "(its root, e.g. https://api.anthropic.com), to which Anthropic clients' requests go as they "
                   "came (without one they are translated to the Chat Completions upstream). Repeatable, once a wire")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (0: any free port; default 8765)")
    p.add_argument("--logs", metavar="DIR", default="runs", help="one run log per run, <run id>.jsonl "
                   "(default: runs); runs left open there (a crash, --keep-runs) continue after a restart")
    p.add_argument("--limit", metavar="NAME=VALUE", action="append", default=[],
                   help="a limit, e.g. max_steps=30 (repeatable)")
    p.add_argument("--limits", metavar="PROFILE", choices=["default", "coding", "chat"],
                   help="a limit profile: default, coding or chat (default: coding, sized for coding agents "
                   "from real runs; --limit flags apply over it)")
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
                   "sees only its own runs (docs/proxy.md, \"Running it for others\")")
    p.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="a host name clients reach the proxy by (repeatable; '*': any). Always served: IP "
                   "addresses, localhost and the --host name; a request naming another host (DNS rebinding) is "
                   "refused")
    p.add_argument("--max-concurrent", metavar="N", type=int, default=64,
                   help="requests at work at once, at most; past it a request gets 429 at once (default 64)")
    p.add_argument("--max-memory", metavar="MIB", type=int, default=1024,
                   help="the memory the requests at work may take once parsed, together, estimated from their "
                   "bodies; past it 429, and a body over a quarter of it alone 413 (default 1024)")
    p.add_argument("--max-connections", metavar="N", type=int, default=1024,
                   help="client connections at once (fewer under a low descriptor limit); a new one closes the "
                   "oldest that is not at work on a request (default 1024)")
    p.add_argument("--header-timeout", metavar="SECONDS", type=float, default=10.0,
                   help="a connection must send a whole request head within this long, else it is closed "
                   "(slowloris; default 10)")
    p.add_argument("--allow-origin", metavar="ORIGIN", action="append", default=[],
                   help="a web page origin (https://app.example) whose browser requests are served (repeatable; "
                   "'*': any); by default a request a browser makes for another origin's page is refused")


def _upstreams(given: list[str]) -> tuple[str | None, dict[str, str]]:
    """--upstream values: (the Chat Completions URL or None, {wire: its root})."""
    from ..proxy._upstream import WIRES

    chat: str | None = None
    wires: dict[str, str] = {}
    for value in given:
        name, sep, url = value.partition("=")
        if sep and name in WIRES:
            if name in wires:
                raise UsageError(f"--upstream {name}= is given twice: one upstream a wire")
            wires[name] = url
        elif sep and re.fullmatch(r"[a-z][a-z0-9_-]*", name) and "://" not in name:
            raise UsageError(f"--upstream {value}: no wire {name!r} (the wires: {', '.join(WIRES)}; a plain URL is "
                             "the Chat Completions upstream)")
        elif chat is not None:
            raise UsageError("--upstream URL is given twice: one Chat Completions upstream (anthropic=URL for the "
                             "Anthropic one)")
        else:
            chat = value
    return chat, wires


def main(args: argparse.Namespace) -> int:
    try:
        from ..proxy import Proxy, Settings, load_kinds
        from ..proxy._proxy import Connections, serve
    except ImportError as exc:  # starlette / uvicorn: the `proxy` extra
        raise UsageError(f"loopfence proxy needs the proxy extra ({exc.name} is missing): "
                         "pip install 'loopfence[proxy]'") from None

    # the logs hold every tenant's prompts and tool output: never readable by others (docs/proxy.md,
    # "Running it for others"); the group bits stay the umask's (replicas sharing a volume by group)
    os.umask(os.umask(0o077) | 0o007)
    # coding agents are what the proxy fences: the coding profile unless the user names another
    # (the defaults are a proving ground: Claude Code's five requests fill their 60,000 prompt tokens)
    profile = args.limits or "coding"
    limits = limits_from_flags(args.limit, profile=profile)
    chat, wires = _upstreams(args.upstream)
    try:
        kinds = load_kinds(args.kinds) if args.kinds else {}
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0-65535, got {args.port}")
    if not args.expire_after > 0:
        raise UsageError(f"--expire-after must be a number of seconds over 0, got {args.expire_after}")
    if args.max_connections < 8 or not args.header_timeout > 0:
        raise UsageError(f"--max-connections must be 8 or more and --header-timeout over 0, got "
                         f"{args.max_connections} and {args.header_timeout}")
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
        proxy = Proxy(chat, settings, keys=args.key, state=args.state, lease=args.lease, wires=wires,
                      hosts=[*args.allow_host, args.host], origins=args.allow_origin,
                      max_concurrent=args.max_concurrent, max_memory=args.max_memory << 20)
    except ValueError as exc:
        raise UsageError(str(exc) if str(exc).startswith("--") else f"--upstream: {exc}") from None
    where = proxy.upstream.describe() + "".join(f", {w}: {proxy.upstream.describe(w)}" for w in wires)
    shown = profile + (" with --limit " + " ".join(args.limit) if args.limit else "")

    def announce(url: str) -> None:
        root = url.removesuffix("/v1")
        print(f"loopfence proxy: listening on {url} (upstream: {where}; limits: {shown})", flush=True)
        print(f"loopfence proxy: OpenAI clients take the base URL {url}; Anthropic clients (Claude Code) "
              f"ANTHROPIC_BASE_URL={root}; to name a run, {root}/run/NAME/v1 or ANTHROPIC_BASE_URL={root}/run/NAME",
              flush=True)

    try:
        asyncio.run(serve(proxy, args.host, args.port, announce, Connections(args.max_connections,
                                                                             args.header_timeout)))
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    return 0
