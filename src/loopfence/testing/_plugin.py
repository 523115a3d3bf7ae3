"""loopfence's pytest plugin (entry point `pytest11: loopfence`).

Fixtures:
  scripted_model(*replies)  a ScriptedModel; a reply is a response object, a wire tool call
                            (`tool_call("read_file", path="a.py")`), a list of calls (one reply),
                            a string (a text reply) or a Reply
  fake_endpoint(*replies)   a started FakeServer on 127.0.0.1 (closed after the test)
  run_log                   `run_log.path` to log a run to; `run_log.events` (parsed, strict),
                            `run_log.of(kind)`, `run_log.stop`
  replay_log(path)          replays a log and fails the test unless the stop trips at the same place

Network: the plugin minds loopfence's tests only. A test that uses one of the fixtures above, is
marked `@pytest.mark.loopfence_offline`, or runs where the ini option `loopfence_block_network = true`
is set may reach loopback only: connections to anything else (and name lookups of anything but
localhost) raise `NetworkBlockedError` (an OSError, as a refused connection would) and fail the test
even if the code under test caught it. Every other test in the environment is left alone.
`@pytest.mark.allow_network` (or `loopfence_allow_network = true`) lifts the block for a test (or all).

Import-light: pytest loads this module in every session where loopfence is installed, so it imports
only pytest and the standard library; loopfence itself is imported by the fixtures that use it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["NetworkBlockedError", "NetworkGuard", "scripted_model", "fake_endpoint", "run_log",
           "replay_log", "FIXTURES", "guards_network"]

FIXTURES = frozenset({"scripted_model", "fake_endpoint", "run_log", "replay_log"})  # a user of one is guarded


class NetworkBlockedError(OSError):
    """A test tried to reach a non-loopback address."""


def _is_local_host(host: Any) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    text = str(host).strip().lower().split("%", 1)[0]
    if text in ("", "localhost", "0.0.0.0", "::") or text.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _is_local_address(address: Any) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX path
        return True
    if isinstance(address, tuple) and address:
        return _is_local_host(address[0])
    return False


class NetworkGuard:
    """Patches socket connect and name lookups so only loopback is reachable; records attempts."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._saved: dict[str, Any] = {}

    def _blocked(self, what: str) -> NetworkBlockedError:
        self.attempts.append(what)
        return NetworkBlockedError(f"loopfence test plugin: network access to {what} is blocked "
                                   "(only loopback is allowed; mark the test allow_network to opt in)")

    def install(self) -> None:
        sock_cls = socket.socket
        self._saved = {"connect": sock_cls.connect, "connect_ex": sock_cls.connect_ex,
                       "getaddrinfo": socket.getaddrinfo, "gethostbyname": socket.gethostbyname}
        connect, connect_ex = self._saved["connect"], self._saved["connect_ex"]
        getaddrinfo, gethostbyname = self._saved["getaddrinfo"], self._saved["gethostbyname"]
        guard = self

        def guarded_connect(sock: socket.socket, address: Any) -> Any:
            if not _is_local_address(address):
                raise guard._blocked(repr(address))
            return connect(sock, address)

        def guarded_connect_ex(sock: socket.socket, address: Any) -> Any:
            if not _is_local_address(address):
                raise guard._blocked(repr(address))
            return connect_ex(sock, address)

        def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            if not _is_local_host(host):
                raise guard._blocked(f"{host!r} (name lookup)")
            return getaddrinfo(host, *args, **kwargs)

        def guarded_gethostbyname(host: str) -> str:
            if not _is_local_host(host):
                raise guard._blocked(f"{host!r} (name lookup)")
            return gethostbyname(host)

        sock_cls.connect = guarded_connect  # type: ignore[method-assign,assignment]
        sock_cls.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]
        socket.getaddrinfo = guarded_getaddrinfo  # type: ignore[assignment]
        socket.gethostbyname = guarded_gethostbyname  # type: ignore[assignment]

    def uninstall(self) -> None:
        if not self._saved:
            return
        socket.socket.connect = self._saved["connect"]  # type: ignore[method-assign]
        socket.socket.connect_ex = self._saved["connect_ex"]  # type: ignore[method-assign]
        socket.getaddrinfo = self._saved["getaddrinfo"]
        socket.gethostbyname = self._saved["gethostbyname"]
        self._saved = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("loopfence_block_network", type="bool", default=False,
                  help="loopfence plugin: every test may reach loopback only (by default only tests that "
                  "use loopfence's fixtures or the loopfence_offline marker)")
    parser.addini("loopfence_allow_network", type="bool", default=False,
                  help="loopfence plugin: let every test reach non-loopback addresses")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_network: this test may reach non-loopback addresses "
                            "(lifts the loopfence plugin's block)")
    config.addinivalue_line("markers", "loopfence_offline: this test may reach loopback only (the "
                            "loopfence plugin blocks every other address, as for tests using its fixtures)")


def guards_network(item: pytest.Item) -> bool:
    """Is the network blocked for this test? Its marks, the ini options, and its fixtures decide."""
    config = item.config
    if item.get_closest_marker("allow_network") or config.getini("loopfence_allow_network"):
        return False
    if item.get_closest_marker("loopfence_offline") or config.getini("loopfence_block_network"):
        return True
    return bool(FIXTURES.intersection(getattr(item, "fixturenames", ())))


@pytest.fixture(autouse=True)
def _loopfence_network_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    if not guards_network(request.node):
        yield
        return
    guard = NetworkGuard()
    guard.install()
    try:
        yield
    finally:
        guard.uninstall()
    if guard.attempts:
        pytest.fail("network access outside loopback was attempted (blocked): "
                    + "; ".join(guard.attempts[:5]) + " — mark the test allow_network to opt in",
                    pytrace=False)


@pytest.fixture
def scripted_model() -> Callable[..., Any]:
    """Factory: `scripted_model(tool_call("read_file", path="a.py"), "done")` -> ScriptedModel."""
    from ._fixtures import make_scripted_model

    return make_scripted_model


@pytest.fixture
def fake_endpoint() -> Iterator[Callable[..., Any]]:
    """Factory: `srv = fake_endpoint(calls_reply(...), text_reply("done"))`; `srv.base_url`."""
    try:
        from ._fakeserver import FakeServer
    except ImportError:  # pragma: no cover - the fake server ships with loopfence
        pytest.skip("loopfence.testing._fakeserver is not available")
    from ._fixtures import reply_forms

    servers: list[Any] = []

    def start(*replies: Any) -> Any:
        srv = FakeServer(reply_forms(replies)).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.close()


@pytest.fixture
def run_log(tmp_path: Any) -> Any:
    """`run(..., log=run_log.path)`, then `run_log.events`, `run_log.of("result")`, `run_log.stop`."""
    from ._fixtures import RunLogFixture

    return RunLogFixture(tmp_path / "run.jsonl")


@pytest.fixture
def replay_log() -> Callable[..., Any]:
    """`replay_log(path, **replay_options)`: fails the test unless the replay stops where the log did
    (the same reason at the same step with nothing left over), under `limits=` overrides too."""
    from ._fixtures import assert_replays

    return assert_replays
