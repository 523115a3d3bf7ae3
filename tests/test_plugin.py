"""The pytest plugin: fixtures users expect, and no network but loopback unless a test opts in."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from loopfence import Reply, StopReason, run, workspace_tools
from loopfence.testing import text_reply, tool_call


def test_scripted_model_takes_builders_strings_and_lists(scripted_model: Any, run_log: Any,
                                                         tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    model = scripted_model(tool_call("read_file", path="a.py"),
                           [tool_call("list_dir"), tool_call("read_file", path="a.py", page=1)],
                           "x is 1")
    result = run("Read a.py", model=model, tools=workspace_tools(tmp_path), log=run_log.path)
    assert result.stop.reason is StopReason.FINAL_ANSWER and result.final_answer == "x is 1"
    assert run_log.stop.reason == "final_answer" and run_log.events[0].event == "header"
    assert [e.record["decision"] for e in run_log.of("result")] == ["executed", "executed", "reused"]


def test_scripted_model_accepts_reply_values_and_a_list_of_replies(scripted_model: Any) -> None:
    model = scripted_model([text_reply("one"), "two"])
    assert len(model.replies) == 2
    assert isinstance(scripted_model(Reply.from_response(text_reply("r"))).replies[0], Reply)
    with pytest.raises(TypeError, match="scripted reply"):
        scripted_model(42)


def test_replay_log_passes_on_a_log_and_fails_on_a_tampered_one(scripted_model: Any, run_log: Any,
                                                                 replay_log: Any, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    run("t", model=scripted_model(tool_call("read_file", path="a.py"), "done"), tools=workspace_tools(tmp_path),
        log=run_log.path)
    report = replay_log(run_log.path)
    assert report.same_stop
    text = run_log.path.read_text().replace("x = 1", "x = 2")  # a result that is not what was recorded
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text(text)
    with pytest.raises(pytest.fail.Exception, match="replay did not stop where the log did"):
        replay_log(tampered)


def test_fake_endpoint_serves_a_real_run_that_replays(fake_endpoint: Any, run_log: Any, replay_log: Any,
                                                      tmp_path: Path) -> None:
    from loopfence.models._openai import OpenAIModel

    (tmp_path / "a.py").write_text("x = 1\n")
    srv = fake_endpoint(tool_call("read_file", path="a.py"), "x is 1")
    result = run("Read a.py", model=OpenAIModel(srv.base_url, "fake"), tools=workspace_tools(tmp_path),
                 log=run_log.path)
    assert result.stop.reason is StopReason.FINAL_ANSWER and srv.served == 2
    assert srv.base_url.startswith("http://127.0.0.1:")
    replay_log(run_log.path)


def test_loopback_is_allowed() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    accepted = threading.Thread(target=lambda: server.accept()[0].close(), daemon=True)
    accepted.start()
    with socket.create_connection(("localhost", server.getsockname()[1]), timeout=5):
        pass
    accepted.join(5)
    server.close()


_INNER = '''
import socket, pytest

pytestmark = pytest.mark.loopfence_offline  # opted in (tests using loopfence's fixtures are, by default)

def test_blocked():
    with pytest.raises(OSError, match="blocked"):
        socket.create_connection(("192.0.2.1", 80), timeout=0.2)

def test_blocked_even_when_caught():
    try:
        socket.getaddrinfo("example.com", 443)
    except OSError:
        pass  # code under test swallowing the error must not hide the attempt

@pytest.mark.allow_network
def test_opted_in():
    assert socket.socket.connect.__name__ != "guarded_connect"
'''


@pytest.mark.allow_network  # the inner session's guard is under test, not this one's
def test_network_outside_loopback_fails_unless_opted_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=_INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)  # both attempts fail their test; the opted-in one passes
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_blocked *",
                                 "*network access outside loopback was attempted*192.0.2.1*"])
    result.stdout.fnmatch_lines(["*network access outside loopback was attempted*example.com*"])


@pytest.mark.allow_network
def test_the_ini_option_turns_the_guard_off(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nloopfence_allow_network = true\n")
    pytester.makepyfile(test_inner="import socket\n\ndef test_off():\n"
                                   "    assert socket.socket.connect.__name__ != 'guarded_connect'\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_plugin_is_registered_by_entry_point_and_import_light() -> None:
    """Loading the plugin adds no loopfence module but itself: fixtures import what they use."""
    code = ("import sys, loopfence.testing; before = set(sys.modules); "
            "import loopfence.testing._plugin; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('loopfence')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['loopfence.testing._plugin']", out.stdout + out.stderr
    from importlib.metadata import entry_points
    eps = {e.name: e.value for e in entry_points(group="pytest11")}
    assert eps.get("loopfence") == "loopfence.testing._plugin"


def test_replay_log_fails_when_a_limit_makes_the_replay_stop_elsewhere(scripted_model: Any, run_log: Any,
                                                                      replay_log: Any, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    run("t", model=scripted_model(tool_call("read_file", path="a.py"), tool_call("list_dir"), "done"),
        tools=workspace_tools(tmp_path), log=run_log.path)
    assert replay_log(run_log.path, limits={"max_steps": 5}).same_stop  # a looser limit: the same stop
    with pytest.raises(pytest.fail.Exception, match="replay did not stop where the log did"):
        replay_log(run_log.path, limits={"max_steps": 1})  # it would stop at step 1: max_steps
