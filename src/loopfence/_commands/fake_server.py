"""`loopfence fake-server --script FILE [--port N]`: serve scripted replies over real HTTP until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from ..testing._fakeserver import FAULTS, FakeServer, FormError, load_forms
from ._common import UsageError, stderr

__all__ = ["add_parser", "main"]

HELP = "serve scripted chat.completions replies on 127.0.0.1 (an OpenAI-compatible fake)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fake-server", help=HELP, description=(
        "Serve the reply forms in FILE (a JSON array or JSONL) in order, the last repeating, at "
        "http://127.0.0.1:PORT/v1/chat/completions. Forms: a response object; "
        '{"chunks": [...], "done": true}; {"sse": "raw body"}; {"status": 429, "body": ..., '
        '"headers": ...}; {"fault": NAME, ...} with NAME one of: ' + ", ".join(FAULTS) + ". "
        "Prints the base URL on stdout, then serves until Ctrl-C (exit 0). Exit 2: a bad script file or "
        "port."))
    p.add_argument("--script", metavar="FILE", required=True, help="reply forms: JSON array or JSONL")
    p.add_argument("--port", metavar="N", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")


def main(args: argparse.Namespace, *, stop: threading.Event | None = None) -> int:
    try:
        forms = load_forms(args.script)
    except FormError as exc:
        raise UsageError(str(exc)) from None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    try:
        server = FakeServer(forms, port=args.port).start()
    except OSError as exc:
        raise UsageError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from None
    restore = _interruptible()
    try:
        stderr.print(f"fake-server: {len(forms)} reply form(s) at {server.base_url} (Ctrl-C stops)",
                     markup=False)
        print(server.base_url, flush=True)
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        restore()
        server.close()
        stderr.print(f"fake-server: stopped after {server.served} request(s)", markup=False)
        sys.stdout.flush()
    return 0


def _interruptible() -> Any:
    """Ctrl-C and SIGTERM end the serving wait, even where SIGINT was ignored at start (a shell's
    background job). Returns the function that puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(s, h) for s, h in old.items()]
