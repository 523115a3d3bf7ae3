"""The plugin minds its own tests (issue 20): installing loopfence leaves an unrelated test's network
alone; tests that use loopfence's fixtures, carry the `loopfence_offline` marker or run under the ini
option `loopfence_block_network = true` reach loopback only. Each case runs in a pytest subprocess
(pytester), where the plugin is loaded through its entry point as in a user's environment."""

from __future__ import annotations

import pytest

_INNER = '''
import socket, pytest

def attempt():
    """A connection to TEST-NET-1 (never routed): the error it ends with, or None."""
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=0.2).close()
    except OSError as exc:
        return exc
    return None

def blocked(exc):
    return type(exc).__name__ == "NetworkBlockedError"

def test_unrelated_catches_its_own_error():
    assert not blocked(attempt())

def test_uses_a_fixture(run_log):
    assert blocked(attempt())

@pytest.mark.loopfence_offline
def test_opted_in_by_marker():
    assert blocked(attempt())

@pytest.mark.allow_network
def test_uses_a_fixture_but_allows_network(run_log):
    assert not blocked(attempt())
'''


@pytest.mark.allow_network  # the inner session's guard is under test, not this one's
def test_an_unrelated_test_keeps_its_network_and_passes_with_no_teardown_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=_INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=4, errors=2)  # the two guarded attempts fail at teardown, though caught
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_uses_a_fixture*"])
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_opted_in_by_marker*"])
    result.stdout.fnmatch_lines(["PASSED test_inner.py::test_unrelated_catches_its_own_error"])
    result.stdout.no_fnmatch_line("*teardown of test_unrelated*")


@pytest.mark.allow_network
def test_the_ini_option_guards_every_test(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nloopfence_block_network = true\n")
    pytester.makepyfile(test_inner="import socket\n\n"
                                   "def test_unrelated():\n"
                                   "    try:\n"
                                   "        socket.getaddrinfo('example.com', 443)\n"
                                   "    except OSError as exc:\n"
                                   "        assert type(exc).__name__ == 'NetworkBlockedError'\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*network access outside loopback was attempted*example.com*"])
