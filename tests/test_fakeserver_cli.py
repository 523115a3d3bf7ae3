"""`loopfence fake-server` as a real subprocess, `loopfence run --base-url` against it, reply forms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _local_support import read_valid_log

from loopfence.cli import cli
from loopfence.testing import FakeServer, FormError, calls_reply, load_forms, text_reply, tool_call
from loopfence.testing._replyforms import validate_form

LOOPFENCE = [sys.executable, "-c", "import sys; from loopfence.cli import main; sys.argv[0] = 'loopfence'; main()"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPFENCE_")}
    env["NO_PROXY"] = "*"
    return env


def test_fake_server_subprocess_serves_a_script_to_loopfence_run(tmp_path: Path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha")
    script = tmp_path / "script.jsonl"
    script.write_text("\n".join(json.dumps(f) for f in [
        calls_reply(tool_call("read_file", path="a.txt")),
        {"fault": "server_error"},
        text_reply("a.txt says alpha")]) + "\n")
    server = subprocess.Popen([*LOOPFENCE, "fake-server", "--script", str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env())
    try:
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert httpx.get(f"{url}/models", timeout=5).json()["data"][0]["id"] == "fake"
        log = tmp_path / "run.jsonl"
        done = subprocess.run([*LOOPFENCE, "run", "Read a.txt", "--workspace", str(tmp_path / "ws"),
                               "--base-url", url, "--model", "fake", "--stream", "--log", str(log), "--quiet"],
                              capture_output=True, text=True, timeout=60, env=_env())
        assert done.returncode == 0, done.stderr
        assert "a.txt says alpha" in done.stdout
        events = read_valid_log(log)
        assert events[0]["model"]["kind"] == "openai" and events[0]["model"]["stream"] is True
        assert events[-1]["reason"] == "final_answer"
    finally:
        server.send_signal(signal.SIGINT)
        rc = server.wait(timeout=10)
        err = server.stderr.read()
    assert rc == 0, err
    assert "stopped after 3 request(s)" in err  # 2 model requests, one of them retried once


def test_bad_script_is_a_usage_error_naming_the_line(tmp_path: Path, capsys):
    script = tmp_path / "bad.jsonl"
    script.write_text(json.dumps(text_reply("x")) + "\n" + json.dumps({"fault": "meteor"}) + "\n")
    assert cli(["fake-server", "--script", str(script)]) == 2
    assert f"{script}:2: unknown fault 'meteor'" in capsys.readouterr().err
    assert cli(["fake-server", "--script", str(tmp_path / "missing.json")]) == 2


def test_run_reads_the_endpoint_from_the_environment(tmp_path: Path, monkeypatch):
    with FakeServer([text_reply("from env")]) as srv:
        monkeypatch.setenv("LOOPFENCE_BASE_URL", srv.base_url)
        monkeypatch.setenv("LOOPFENCE_MODEL", "envmodel")
        monkeypatch.setenv("LOOPFENCE_API_KEY", "sk-env-secret-123")
        log = tmp_path / "r.jsonl"
        assert cli(["run", "hi", "--workspace", str(tmp_path), "--log", str(log), "--quiet"]) == 0
        assert srv.requests[0]["model"] == "envmodel"
        assert srv.headers[0]["authorization"] == "Bearer sk-env-secret-123"
    assert "sk-env-secret-123" not in log.read_text()


def test_load_forms_json_array_and_errors(tmp_path: Path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps([text_reply("a"), {"chunks": []}, {"sse": ""}, {"status": 500}, {"fault": "close"}]))
    assert len(load_forms(p)) == 5
    p.write_text("[\n{\"x\": 1}\n]")
    with pytest.raises(FormError, match=r"s.json:1: unknown reply form"):
        load_forms(p)
    p.write_text("")
    with pytest.raises(FormError, match="empty"):
        load_forms(p)


@pytest.mark.parametrize("form", [[], {"status": 99}, {"chunks": {}}, {"sse": 1}, {"fault": "overflow", "shape": "x"},
                                  {"fault": "reset", "reply": {"nope": 1}},
                                  {"fault": "stall", "delay_s": "x"}, {"fault": "reset", "after": 1.5},
                                  {"fault": "truncated", "at": -1}, {"fault": "overflow", "n_ctx": True}])
def test_invalid_forms_are_refused(form):
    with pytest.raises(FormError):
        validate_form(form)
    with pytest.raises(FormError):
        FakeServer([form])
