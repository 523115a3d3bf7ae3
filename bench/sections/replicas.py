"""`loopfence proxy` replicas sharing run state on Redis (`--state redis://...`), side by side in one
run with one replica on the embedded store and with the upstream reached directly.

The section starts its own `redis-server` on a free loopback port (append-only file, fsync always, as
the proxy's docs ask) and stops it at the end. Every path gets the same load: many conversations at
once, each a few no-op calls with fresh arguments then an answer (proxy.py's Conversation); through the
replicas each request goes to the next replica in turn (round-robin on the client side, request by
request: a conversation's requests land on different replicas). Redis's own counters (INFO
commandstats) give the round trips per request; INFO memory gives the memory per open run.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from ..report import Section, load_average, load_note, met, table
from .proxy import Child, _concurrent, _module, _pct, stop

__all__ = ["TITLE", "run"]

TITLE = "Proxy replicas on Redis"
FULL = {"conversations": 1000, "steps": 3, "replicas": 3, "open": 1000}
QUICK = {"conversations": 20, "steps": 2, "replicas": 3, "open": 20}
GOAL_ROUND_TRIPS = 2  # Redis round trips per request, at most
START_S = 30.0  # how long redis-server may take to answer PING: bounds a failure, not a speed
MONITORED = 100  # conversations in the pass whose round trips MONITOR counts
SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall")
REDIS = "redis (3 replicas, --state redis://)"
EMBEDDED = "embedded store (1 replica)"


class RedisServer:
    """A `redis-server` of the section's own on a free loopback port, persisting as the proxy asks."""

    def __init__(self, folder: Path) -> None:
        import redis

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        folder.mkdir()
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(folder)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis.from_url(self.url, socket_timeout=30)
        deadline = time.monotonic() + START_S
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"redis-server on port {port} did not answer in {START_S:.0f} s "
                                       f"(exit {self.proc.poll()})") from None
                time.sleep(0.05)

    def calls(self) -> dict[str, int]:
        """Commands processed so far, by command (INFO commandstats), INFO itself left out."""
        stats = self.client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"}

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def close(self) -> None:
        self.client.close()
        stop(self.proc)


class Monitor:
    """Redis's MONITOR feed, read in a thread: each command the server runs, and whether a client sent it
    (a round trip) or a Lua script ran it (`[0 lua]`)."""

    END = "loopfence-bench-monitor-end"

    def __init__(self, store: RedisServer) -> None:
        self.store = store
        self.sock = socket.create_connection(("127.0.0.1", int(store.url.rsplit(":", 1)[1].split("/")[0])))
        self.sock.sendall(b"MONITOR\r\n")
        self.lines: list[bytes] = []
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        rest = b""
        while not self.ended.is_set():
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return
            *whole, rest = (rest + chunk).split(b"\r\n")
            self.lines += whole
            if any(self.END.encode() in x for x in whole):
                self.ended.set()

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """Stop (once the server has fed everything up to now): commands (client-sent, script-run) by name."""
        self.store.client.echo(self.END)
        self.ended.wait(START_S)
        self.sock.close()
        sent, scripted = Counter[str](), Counter[str]()
        for raw in self.lines:
            text = raw.decode("utf-8", "replace")
            head, _, args = text.partition("] ")
            if not head.startswith("+") or not args or self.END in args:
                continue
            name = args.split(" ", 1)[0].strip('"').lower()
            (scripted if head.endswith(" lua") else sent)[name] += 1
        return sent, scripted


def _missing() -> str | None:
    """Why the section cannot run here, or None."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis client is not installed in this venv (bench/requirements.txt: redis>=5)"
    try:
        subprocess.run(["redis-server", "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "redis-server is not installed (Debian: apt-get install redis-server)"
    return None


def _proxy(upstream: str, logs: Path, state: str | None) -> Child:
    argv = [sys.executable, "-m", "loopfence", "proxy", "--upstream", upstream, "--port", "0", "--logs", str(logs)]
    return Child(argv + (["--state", state] if state else []))


def _load(urls: list[str], first: int, n: int, steps: int,
          store: RedisServer | None) -> tuple[dict[str, Any], dict[str, int], int]:
    """n conversations at once to their answers, round-robin over `urls`: the path's figures (and the
    store's command counts and memory before the load, after a warm-up)."""
    asyncio.run(_concurrent(urls, 900_000 + first, 2 * len(urls), steps + 1))  # warm-up: connections, scripts
    calls, memory = (store.calls(), store.used_memory()) if store is not None else ({}, 0)
    seconds: list[float] = []
    failed: dict[str, list[str]] = {}
    requests, answered, wall = asyncio.run(_concurrent(urls, first, n, steps + 1, seconds, failed))
    out: dict[str, Any] = {"conversations": n, "requests": requests, "answered": answered,
                           "answered_all": answered == n, "wall_s": wall, "requests_per_s": requests / wall,
                           "failed": {k: {"count": len(v), "first": v[0]} for k, v in failed.items()}}
    if seconds:
        out |= {"p50_ms": _pct(seconds, 50) * 1e3, "p99_ms": _pct(seconds, 99) * 1e3}
    return out, calls, memory


def _executed(store: RedisServer, before: dict[str, int], memory: int, load: dict[str, Any]) -> dict[str, Any]:
    """What Redis ran over the replicas' load (INFO commandstats: a script's own commands included)."""
    after = store.calls()
    by = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    by = {k: v for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v}
    done = max(load["requests"], 1)
    return {"requests": load["requests"], "commands_per_request": sum(by.values()) / done,
            "script_calls_per_request": sum(by.get(k, 0) for k in SCRIPTS) / done,
            "by_command_per_request": {k: v / done for k, v in by.items()},
            "bytes_per_finished_run": (store.used_memory() - memory) / max(load["answered"], 1)}


def _progress(done: str, t0: float) -> None:
    print(f"[bench] replicas: {done} done at {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    why = _missing()
    if why:
        return Section(TITLE, f"Not run: {why}.", {"skipped": why})
    cfg = QUICK if quick else FULL
    n, steps, width, n_open = cfg["conversations"], cfg["steps"], cfg["replicas"], cfg["open"]
    load_start = load_average()
    data: dict[str, Any] = {"config": dict(cfg), "other_failed": {}}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="loopfence-bench-replicas-") as tmp_name:
        tmp = Path(tmp_name)
        children: list[Child] = []
        store: RedisServer | None = None
        try:
            upstream = Child(_module("upstream", str(steps)))
            children.append(upstream)
            embedded = _proxy(upstream.url, tmp / "logs-embedded", None)
            children.append(embedded)
            store = RedisServer(tmp / "redis")
            replicas = [_proxy(upstream.url, tmp / "logs", store.url) for _ in range(width)]
            children += replicas
            urls = [r.url for r in replicas]
            paths = {"direct": [upstream.url], EMBEDDED: [embedded.url], REDIS: urls}
            data["paths"] = {}
            for i, (name, at) in enumerate(paths.items()):
                data["paths"][name], *was = _load(at, i * 100_000, n, steps, store if name == REDIS else None)
                if name == REDIS:
                    before, memory = was
                _progress(name, t0)
            data["redis"] = _executed(store, before, memory, data["paths"][REDIS])
            watch = Monitor(store)  # a pass of its own: MONITOR's feed would slow the timed load
            k = min(n, MONITORED)
            passed, _, _ = asyncio.run(_concurrent(urls, 700_000, k, steps + 1, None, data["other_failed"]))
            sent, scripted = watch.counts()
            data["redis"]["round_trips"] = {
                "conversations": k, "requests": passed, "per_request": sum(sent.values()) / max(passed, 1),
                "by_command": {c: v / max(passed, 1) for c, v in sent.most_common()},
                "run_in_scripts_per_request": sum(scripted.values()) / max(passed, 1)}
            rss = embedded.rss_kib()
            _progress("the round-trip pass", t0)
            asyncio.run(_concurrent([embedded.url], 500_000, n_open, steps, None, data["other_failed"]))  # left open
            data["embedded_kib_per_open_run"] = (embedded.rss_kib() - rss) / n_open
            before_open = store.used_memory()
            opened, _, _ = asyncio.run(_concurrent(urls, 600_000, n_open, steps, None, data["other_failed"]))
            _progress("the open runs", t0)
            data["redis"] |= {"open_runs": n_open, "open_requests": opened,
                              "bytes_per_open_run": (store.used_memory() - before_open) / n_open,
                              "keys": store.client.dbsize()}
        finally:
            for child in children:
                child.close()
            if store is not None:
                store.close()
    data["load_average"] = {"start": load_start, "end": load_average()}
    data["other_failed"] = {k: {"count": len(v), "first": v[0]} for k, v in data["other_failed"].items()}
    return Section(TITLE, _markdown(data, n, steps, width), data)


def _markdown(data: dict[str, Any], n: int, steps: int, width: int) -> str:
    direct, rows, notes = data["paths"]["direct"], [], []
    for name, d in data["paths"].items():
        lat = "p50_ms" in d
        added = name != "direct" and lat and "p50_ms" in direct
        rows.append([name, d["requests"], f"{d['requests_per_s']:.0f}",
                     f"{d['p50_ms']:.1f}" if lat else "-", f"{d['p99_ms']:.1f}" if lat else "-",
                     f"{d['p50_ms'] - direct['p50_ms']:+.1f}" if added else "",
                     f"{d['p99_ms'] - direct['p99_ms']:+.1f}" if added else "",
                     "yes" if d["answered_all"] else f"**no** ({d['answered']}/{n})"])
        for kind, f in d["failed"].items():
            notes.append(f"{name}: {f['count']} requests failed with {kind}, the first: {f['first']!r}.")
    for kind, f in data["other_failed"].items():
        notes.append(f"Outside the timed load (the round-trip pass, the open runs): {f['count']} requests failed "
                     f"with {kind}, the first: {f['first']!r}.")
    r = data["redis"]
    t = r["round_trips"]
    executed = ", ".join(f"{k} {v:.2f}" for k, v in r["by_command_per_request"].items())
    sent = ", ".join(f"{k} {v:.3f}" for k, v in t["by_command"].items())
    return "\n\n".join([
        load_note(data["load_average"]["start"], data["load_average"]["end"]),
        (f"{n} conversations at once per path, each {steps} no-op calls with fresh arguments then an answer "
         f"({n * (steps + 1)} requests); through the {width} replicas each request goes to the next replica in "
         "turn (client-side round-robin), so a conversation's requests land on different replicas. Every "
         "server is a process of its own on this machine (redis-server with appendonly yes, appendfsync "
         "always); latencies are per request under that load, queueing included; added = the path's minus "
         "direct's."),
        table(["path", "requests", "requests/s", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
               "all answered"], rows),
        *notes,
        (f"Redis round trips per request (MONITOR's feed over a pass of {t['conversations']} more conversations "
         f"at once, {t['requests']} requests, after the timed load; a command a client sent is a round trip, one "
         f"a Lua script ran is not): **{t['per_request']:.3f}** ({sent}); the scripts ran "
         f"{t['run_in_scripts_per_request']:.1f} commands per request inside Redis. Goal: at most "
         f"{GOAL_ROUND_TRIPS}: {met(t['per_request'] <= GOAL_ROUND_TRIPS)} (all commands clients sent; the "
         f"script calls alone: {met(t['by_command'].get('evalsha', 0) + t['by_command'].get('eval', 0) <= GOAL_ROUND_TRIPS)}"
         "; HELLO and PING are redis-py's own, on a new connection or one idle past its health check). "
         "Over the timed load (INFO "
         f"commandstats, INFO itself left out): script calls (EVALSHA/EVAL: claim and commit) "
         f"{r['script_calls_per_request']:.3f} per request; commands Redis ran, those inside scripts included, "
         f"{r['commands_per_request']:.2f} per request ({executed})."),
        (f"Memory in Redis (INFO memory used_memory): {r['bytes_per_open_run'] / 1024:.1f} KiB per open run "
         f"({r['open_runs']} runs left mid-way, {r['open_requests']} requests in); "
         f"{r['bytes_per_finished_run'] / 1024:.1f} KiB per finished run kept until it expires "
         f"({r['keys']} keys at the end). The embedded store, for comparison: "
         f"{data['embedded_kib_per_open_run']:.1f} KiB resident per open run."),
    ])
