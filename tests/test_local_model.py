"""The embedded default: SmolLM2-135M in llama.cpp, in-process, no server, no key.

Whatever the tiny model does (invented paths, `{ "path": ... }` arguments, looping on list_dir),
the run ends with a named stop and a complete log, and the CLI prints no traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _local_support import SAMPLE_SYSTEM, SAMPLE_TASK, SAMPLE_WORKSPACE, needs_local_model, read_valid_log

from loopfence import Limits, Registry, Request, ScriptedModel, StopReason, run, workspace_tools
from loopfence._stops import StopError


# no LOOPFENCE_BASE_URL: with it set, `loopfence run` would talk HTTP instead of the embedded model
ENV = {k: v for k, v in os.environ.items() if not k.startswith("LOOPFENCE_")}


@pytest.fixture(scope="module")
def local_model():
    from loopfence.models._local import LocalModel

    return LocalModel()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    dest = tmp_path / "workspace"
    shutil.copytree(SAMPLE_WORKSPACE, dest)
    return dest


def _request(content: str, **params) -> Request:
    messages = [{"role": "system", "content": SAMPLE_SYSTEM}, {"role": "user", "content": content}]
    return Request(messages, Registry(workspace_tools(SAMPLE_WORKSPACE)).schemas(), params)


def test_sample_page_is_real_looking_html():
    page = (SAMPLE_WORKSPACE / "pages" / "tl-intro.html").read_text(encoding="utf-8")
    for part in ("<head>", "<style>", "<script", "<nav", "<article>", "<a href="):
        assert part in page
    assert page.count("<p") >= 4


def test_import_loopfence_does_not_import_llama_cpp():
    code = ("import sys, loopfence, loopfence.cli, loopfence._commands.run\n"
            "from loopfence.models import LocalModel, LocalModelUnavailable\n"
            "try:\n    LocalModel().describe()\nexcept LocalModelUnavailable:\n    pass\n"
            "print('llama_cpp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_missing_extra_is_a_one_line_usage_error(workspace):
    code = ("import sys; sys.modules['llama_cpp'] = None\n"  # as if loopfence[local] were not installed
            "from loopfence.cli import cli\n"
            f"sys.exit(cli(['run', 'hello', '--workspace', {str(workspace)!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=workspace, env=ENV)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "loopfence[local]" in lines[0] and "make run" in lines[0]
    assert not (workspace / "runs").exists()  # no run started, no log written


def test_legacy_function_call_name_with_colon_is_unknown_tool():
    # llama.cpp's chatml-function-calling may send only the legacy field, named "read_file:".
    legacy = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "function_call": {"name": "read_file:", "arguments": '{ "path": "pages/tl-intro.html" }'}}}]}
    result = run(SAMPLE_TASK, model=ScriptedModel([legacy]), tools=workspace_tools(SAMPLE_WORKSPACE))
    assert result.stop.reason is StopReason.UNKNOWN_TOOL
    assert "read_file:" in result.stop.detail
    assert result.ledger.tool_executions == 0


class TestEmbedded:
    pytestmark = needs_local_model

    def test_cli_run_ends_named_with_a_valid_log_and_no_traceback(self, workspace):
        log = workspace / "run.jsonl"
        out = subprocess.run(
            [sys.executable, "-m", "loopfence", "run", SAMPLE_TASK, "--workspace", str(workspace),
             "--system", SAMPLE_SYSTEM, "--log", str(log), "--limit", "max_steps=4"],
            capture_output=True, text=True, timeout=240, cwd=workspace, env=ENV)
        assert out.returncode in (0, 1), out.stderr
        assert "Traceback" not in out.stderr + out.stdout
        events = read_valid_log(log)
        assert events[0]["model"]["kind"] == "local"
        assert events[0]["model"]["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        stop = events[-1]
        assert f"stop {stop['reason']}" in out.stderr  # the live line
        assert str(log) in out.stderr  # the summary names the log
        assert any(e["event"] == "reply" for e in events)  # the real model answered at least once
        assert stop["ledger"]["model_requests"] <= 4

    def test_cli_without_system_prompt_still_ends_named(self, workspace):
        log = workspace / "bare.jsonl"
        out = subprocess.run(
            [sys.executable, "-m", "loopfence", "run", SAMPLE_TASK, "--workspace", str(workspace),
             "--log", str(log), "--limit", "max_steps=3"],
            capture_output=True, text=True, timeout=240, cwd=workspace, env=ENV)
        assert out.returncode in (0, 1), out.stderr
        assert "Traceback" not in out.stderr
        read_valid_log(log)

    def test_library_run_is_deterministic(self, local_model, tmp_path):
        def once(i: int):  # the tools may write: each run gets a fresh copy at the same path
            shutil.rmtree(tmp_path / "ws", ignore_errors=True)
            shutil.copytree(SAMPLE_WORKSPACE, tmp_path / "ws")
            return run(SAMPLE_TASK, model=local_model, tools=workspace_tools(tmp_path / "ws"),
                       system=SAMPLE_SYSTEM, limits=Limits(max_steps=3), log=tmp_path / f"r{i}.jsonl")

        a, b = once(1), once(2)
        assert a.stop.reason == b.stop.reason
        calls = [[(c["function"]["name"], c["function"]["arguments"]) for m in r.messages
                  for c in m.get("tool_calls") or []] for r in (a, b)]
        assert calls[0] and calls[0] == calls[1]
        for i in (1, 2):
            read_valid_log(tmp_path / f"r{i}.jsonl")

    def test_reply_is_a_chat_completion(self, local_model):
        reply = local_model.complete(_request(SAMPLE_TASK))
        assert reply.complete
        assert reply.raw["object"] == "chat.completion"
        assert reply.usage is not None and reply.usage.prompt_tokens
        assert reply.tool_calls or reply.content is not None

    def test_max_tokens_bounds_every_part_even_with_auto_tool_choice(self, local_model):
        # llama-cpp-python's chatml-function-calling handler (no longer used) dropped max_tokens on
        # "auto"; LocalModel now generates the whole reply in one bounded completion.
        reply = local_model.complete(_request(SAMPLE_TASK, max_tokens=5))
        assert reply.usage is not None
        assert reply.usage.completion_tokens is not None and reply.usage.completion_tokens <= 5

    def test_deadline_already_passed_is_not_started(self, local_model):
        request = Request([{"role": "user", "content": "hi"}], [], {}, deadline=time.monotonic() - 1)
        with pytest.raises(StopError) as exc:
            local_model.complete(request)
        assert "not started" in exc.value.stop.detail  # the run's clock, not the adapter, names the stop

    def test_context_overflow_is_a_named_stop_with_numbers(self, workspace):
        from loopfence.models._local import LocalModel

        small = LocalModel(n_ctx=256)
        long_task = SAMPLE_TASK + "\n" + (SAMPLE_WORKSPACE / "pages" / "tl-intro.html").read_text()
        log = workspace / "overflow.jsonl"
        result = run(long_task, model=small, tools=workspace_tools(workspace), system=SAMPLE_SYSTEM, log=log)
        assert result.stop.reason is StopReason.CONTEXT_OVERFLOW
        assert result.stop.data["n_ctx"] == 256
        assert result.stop.data["n_prompt_tokens"] > 256
        read_valid_log(log)

    def test_describe_names_the_model_and_no_secrets(self, local_model):
        d = local_model.describe()
        assert d["kind"] == "local" and d["temperature"] == 0.0 and d["seed"] == 0
        assert d["model"].endswith(".gguf")
