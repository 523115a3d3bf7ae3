"""A real `redis-server` for the tests of the proxy's Redis store (issue 35): started on a free
loopback port in a folder of its own, with an append-only file fsynced on every write, so a kill -9
and a restart on the same port and folder bring back every acknowledged write.

    with RedisServer() as server:          # skips (fails under CI) when redis-server is missing
        server.url                         # redis://127.0.0.1:PORT/0
        server.client().set("k", "v")      # a sync redis-py client
        server.kill(); server.restart()    # SIGKILL, then the same port and folder: the AOF reloads

Nothing is left running: `__exit__` stops the server (also when the test failed), an atexit hook
kills any server a test forgot, and a server started from the main thread dies with the test process
(PR_SET_PDEATHSIG), even when that is killed.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

__all__ = ["RedisServer", "redis_server_binary", "serving"]

START_S = 60.0  # how long the server may take to answer PING here: bounds a failure, not a speed
_LIVE: set[subprocess.Popen[bytes]] = set()  # servers started and not yet waited for (the atexit net)
_PR_SET_PDEATHSIG = 1


def redis_server_binary() -> str:
    """The path of `redis-server` (`make redis` installs it). Missing: the test fails under CI and
    skips elsewhere, naming the target."""
    found = shutil.which("redis-server")
    if found:
        return found
    message = "redis-server is not installed: run `make redis` (make test does)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the thread that started it (the main thread) ends."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    _LIVE.clear()


class RedisServer:
    """`redis-server` as a real process on 127.0.0.1. A context manager; `start()`/`stop()` also work.
    `folder`: where its AOF and log go (default: a temporary folder, removed on `stop()`)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.binary = redis_server_binary()
        self._tmp = None if folder else tempfile.TemporaryDirectory(prefix="loopfence-redis-")
        self.dir = Path(folder) if folder else Path(self._tmp.name)  # type: ignore[union-attr]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "redis.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the redis server was never started")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        """Start on a free port (another one if that port is taken before the server binds it)."""
        for attempt in range(3):
            self.port = _free_port()
            if self._launch(last=attempt == 2):
                return self
        raise AssertionError("unreachable")  # _launch(last=True) fails the test instead

    def restart(self) -> Self:
        """Start again on the same port and folder (after `kill()` or `stop()`): the AOF is reloaded."""
        if self.running:
            raise RuntimeError(f"redis-server (pid {self.pid}) is still running: kill() or stop() it first")
        if not self.port:
            raise RuntimeError("the redis server was never started: start() it")
        self._launch(last=True)
        return self

    def _launch(self, *, last: bool) -> bool:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--protected-mode", "yes",
                "--daemonize", "no", "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--dir", str(self.dir), "--logfile", str(self.log)]
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent if main else None)
        _LIVE.add(self.proc)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reap()
                if not last and "Address already in use" in self.log_tail():
                    return False
                pytest.fail(f"redis-server exited {self.proc.returncode} on port {self.port}; "
                            f"its log: {self.log_tail()}")
            if self._answers_ping():
                return True
            time.sleep(0.02)
        self.kill()
        pytest.fail(f"redis-server did not answer PING on port {self.port} in {START_S:.0f} s; "
                    f"its log: {self.log_tail()}")

    def _answers_ping(self) -> bool:
        """PONG over a raw socket (a server still loading its AOF answers -LOADING)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def log_tail(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def client(self, **kwargs: Any) -> Any:
        """A sync redis-py client on this server (decode_responses=True unless told otherwise)."""
        import redis

        kwargs.setdefault("decode_responses", True)
        kwargs.setdefault("socket_timeout", START_S)
        return redis.Redis.from_url(self.url, **kwargs)

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (no shutdown: only what the AOF holds survives)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self._reap()

    def stop(self) -> None:
        """SIGTERM (redis-server flushes its AOF and exits), SIGKILL after START_S; removes the
        temporary folder when it made one. Safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=START_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            _LIVE.discard(self.proc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.kill()
        self.stop()


def serving(folder: Path | None = None) -> Iterator[RedisServer]:
    """The body of a fixture (any scope): a started server, stopped after.

        @pytest.fixture(scope="module")
        def redis_server() -> Iterator[RedisServer]:
            yield from serving()
    """
    with RedisServer(folder) as server:
        yield server
