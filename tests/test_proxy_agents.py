"""Real agents nobody here wrote, pinned (`make agents`: build/agents), through `loopfence proxy`
with no header and no code change (issue 40): each against a scripted runaway upstream and a
legitimate one, a real HTTP server on 127.0.0.1.

- smolagents 1.26 `ToolCallingAgent` re-renders its history (calls as "Calling tools:" text,
  results as "Observation:" user messages): a retry storm reaches the upstream at most 3 times, the
  agent does not crash on the stop, a legitimate task is one run;
- smolagents `CodeAgent` acts in code (text actions): the same code with the same output stops
  within 6 upstream requests, a legitimate multi-step task finishes;
- mini-swe-agent 2.4.6 in its text mode (`mini_textbased.yaml`, `LitellmTextbasedModel`): the same
  command with the same output stops within 6; an edit-and-test loop, run for real, finishes.

After each agent, the episode is over: its runs are ended (the reset route), and each log
reconciles and replays with one request line per request that reached the upstream.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _proxy_support import ROOT, Proxy, ReplyServer, built, logs_in, reconciles, replays, reset_all

pytestmark = pytest.mark.timeout(600)
AGENTS = ROOT / "build" / "agents" / "bin" / "python"
DRIVE = ROOT / "tests" / "agents" / "drive.py"


def _agents() -> Path:
    return built(AGENTS, "agents")


def drive(kind: str, url: str, task: str, *, max_steps: int = 8, workdir: Path | None = None,
          raises: bool = False, **env: str) -> dict[str, Any]:
    """One agent run (tests/agents/drive.py in the agents' venv): its JSON summary; no crash (with
    `raises`: the agent's run raised, and the summary names the error)."""
    done = subprocess.run([str(_agents()), str(DRIVE), kind, url, task, "--max-steps", str(max_steps),
                           "--workdir", str(workdir or ROOT)], capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LOOPFENCE_"))},
                               **env})
    lines = done.stdout.strip().splitlines()
    assert done.returncode == (1 if raises else 0) and lines, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(lines[-1])


def task_of(body: dict[str, Any]) -> str:
    """The opening user text (a parts list or a string), whatever the agent's system prompt."""
    first = next(m for m in body["messages"] if m["role"] == "user")
    content = first["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def turn_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


class Scripted(ReplyServer):
    """The reply to a request: its task's script (the first key the opening user text holds) at the
    request's turn (assistant messages so far); `seen[key]` counts what reached it per task."""

    def __init__(self, scripts: dict[str, Any]) -> None:
        self.scripts, self.seen = scripts, dict.fromkeys(scripts, 0)
        super().__init__(self.pick)

    def pick(self, body: dict[str, Any]) -> dict[str, Any]:
        key = next(k for k in self.scripts if k in task_of(body))
        self.seen[key] += 1
        script = self.scripts[key]
        return script(turn_of(body)) if callable(script) else script[min(turn_of(body), len(script) - 1)]


def ended_logs(proxy: Proxy, logs: Path, upstream: int) -> list[Path]:
    """The episode is over: every run ended; each log reconciles and replays; one request line per
    upstream request in all."""
    reset_all(proxy.base_url)
    found = logs_in(logs)
    for log in found:
        reconciles(log)
        replays(log)
    assert sum(len(read_log(log).of("request")) for log in found) == upstream
    return found


def _stops(log: Path) -> str:
    stop = read_log(log).stop
    assert stop is not None
    return str(stop.reason)


# ---------------------------------------------------------------------------- smolagents ToolCallingAgent
def test_smolagents_tool_calling_agent_storm_and_legit_task(tmp_path: Path) -> None:
    storm = lambda turn: calls_reply(tool_call("fetch_status", {"service": "flaky"}, id=f"call_{turn}"))  # noqa: E731
    legit = [calls_reply(tool_call("get_weather", {"city": "Paris"}, id="call_p"), usage=(50, 9)),
             calls_reply(tool_call("get_weather", {"city": "Rome"}, id="call_r"), usage=(60, 9)),
             calls_reply(tool_call("final_answer", {"answer": "Paris and Rome: sunny"}, id="call_f"), usage=(70, 9))]
    scripts = {"flaky service": storm, "weather in Paris and Rome": legit}
    for name, want in (("flaky service", "storm"), ("weather in Paris and Rome", "legit")):
        logs = tmp_path / want
        with Scripted(scripts) as up, Proxy("--upstream", up.base_url, "--logs", str(logs),
                                            stderr=tmp_path / f"{want}.err") as proxy:
            out = drive("tool_calling", proxy.base_url, f"Check the {name}." if want == "storm" else
                        f"What is the {name}?", max_steps=10)
            assert "error" not in out, out
            if want == "storm":
                assert up.seen[name] <= 3, up.seen
                assert str(out["output"]).startswith(STOP_MARKER), out  # its last answer is the stop
                found = ended_logs(proxy, logs, up.seen[name])
                assert len(found) == 1 and _stops(found[0]) in {"repeated_call", "no_progress"}
            else:
                assert out["output"] == "Paris and Rome: sunny" and out["state"] == "success", out
                assert up.seen[name] == 3
                found = ended_logs(proxy, logs, 3)
                assert len(found) == 1  # one run, though every request re-rendered the history
                log = read_log(found[0])
                assert log.stop is not None and log.stop.ledger["tool_executions"] == 2
                assert log.stop.reason == "final_answer" and log.stop.data["unanswered"] == ["call_f"]


def test_smolagents_tool_calling_agent_whose_model_only_talks_is_one_run_that_stops(tmp_path: Path) -> None:
    """ToolCallingAgent demands a call (`tool_choice: "required"`): a reply with none is not its
    answer, smolagents sends a parsing error and asks again. The same text after the same error is
    a repeated text action: one run, stopped within 6 upstream requests."""
    scripts = {"sunny": [text_reply("I think it is sunny everywhere.")]}
    with Scripted(scripts) as up, Proxy("--upstream", up.base_url, "--logs", str(tmp_path / "logs"),
                                        stderr=tmp_path / "err") as proxy:
        out = drive("tool_calling", proxy.base_url, "Is it sunny?", max_steps=20)
        assert "error" not in out, out
        assert up.seen["sunny"] <= 6, up.seen
        found = ended_logs(proxy, tmp_path / "logs", up.seen["sunny"])
        assert len(found) == 1 and _stops(found[0]) in {"repeated_call", "repeated_result", "no_progress"}


# ---------------------------------------------------------------------------- smolagents CodeAgent
def test_smolagents_code_agent_same_code_same_output_stops_and_legit_finishes(tmp_path: Path) -> None:
    scripts = {"Wait for the build": [text_reply("Thought: check again.\n<code>\nprint('build: pending')\n</code>")],
               "Compute 6*7": [text_reply("Thought: compute.\n<code>\nx = 6 * 7\nprint('x is', x)\n</code>"),
                               text_reply("Thought: check.\n<code>\nprint('x + 1 is', x + 1)\n</code>"),
                               text_reply("Thought: done.\n<code>\nfinal_answer(x)\n</code>")]}
    for key, want in (("Wait for the build", "runaway"), ("Compute 6*7", "legit")):
        logs = tmp_path / want
        with Scripted(scripts) as up, Proxy("--upstream", up.base_url, "--logs", str(logs),
                                            stderr=tmp_path / f"{want}.err") as proxy:
            out = drive("code", proxy.base_url, f"{key}.", max_steps=12)
            assert "error" not in out, out
            if want == "runaway":
                assert up.seen[key] <= 6, up.seen
                assert str(out["output"]).startswith(STOP_MARKER), out
                found = ended_logs(proxy, logs, up.seen[key])
                assert len(found) == 1
                assert _stops(found[0]) in {"repeated_call", "repeated_result", "cycle", "no_progress"}
            else:
                assert out["output"] == "42" and out["state"] == "success", out
                found = ended_logs(proxy, logs, 3)
                assert len(found) == 1
                log = read_log(found[0])
                assert log.stop is not None and log.stop.ledger["tool_executions"] == 2
                actions = [json.loads(c.raw_arguments)["action"] for c in log.of("call")]
                assert actions[-1] == "final_answer(x)"


# ---------------------------------------------------------------------------- mini-swe-agent, text mode
def _bash(thought: str, command: str) -> dict[str, Any]:
    return text_reply(f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```")


def test_mini_swe_agent_text_mode_repeated_command_stops_and_edit_and_test_finishes(tmp_path: Path) -> None:
    test = "python3 -c 'import m; assert m.f() == 2, m.f()' && echo PASSED"
    scripts = {"Wait for the queue": [_bash("Check the queue again.", "echo 'queue: 3 jobs waiting'")],
               "Make m.f return 2": [_bash("Write the module.", "printf 'def f():\\n    return 1\\n' > m.py"),
                                     _bash("Run the test.", test),
                                     _bash("Fix it.", "sed -i 's/return 1/return 2/' m.py"),
                                     _bash("Run the test again.", test),
                                     _bash("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]}
    for key, want in (("Wait for the queue", "runaway"), ("Make m.f return 2", "legit")):
        logs, work = tmp_path / want, tmp_path / f"{want}-work"
        work.mkdir()
        with Scripted(scripts) as up, Proxy("--upstream", up.base_url, "--logs", str(logs),
                                            stderr=tmp_path / f"{want}.err") as proxy:
            out = drive("mini", proxy.base_url, f"{key}.", max_steps=20, workdir=work)
            assert "error" not in out, out
            if want == "runaway":
                assert up.seen[key] <= 6, up.seen
                assert out["state"] != "Submitted", out
                found = ended_logs(proxy, logs, up.seen[key])
                assert len(found) == 1
                assert _stops(found[0]) in {"repeated_call", "repeated_result", "cycle", "no_progress"}
            else:
                assert out["state"] == "Submitted", out
                assert (work / "m.py").read_text() == "def f():\n    return 2\n"
                found = ended_logs(proxy, logs, 5)
                assert len(found) == 1
                log = read_log(found[0])
                assert log.stop is not None and log.stop.ledger["tool_executions"] == 4
                results = [r.content for r in log.of("result") if r.decision == "executed"]
                assert "PASSED" in results[-1] and "AssertionError" in results[1]


def test_mini_swe_agent_with_a_format_error_mid_run_stays_one_run(tmp_path: Path) -> None:
    """mini-swe-agent drops a reply it cannot parse (no bash block) and asks again with a format
    error: its next request does not extend the one before it, yet the task and its last answers
    place it in its run. One run, one log, every request in it."""
    test = "python3 -c 'import m; assert m.f() == 3, m.f()' && echo PASSED"
    replies = [_bash("Write the module.", "printf 'def f():\\n    return 1\\n' > m.py"),
               text_reply("THOUGHT: I should look at the module first, I think."),  # no block: a format error
               _bash("Run the test.", test), _bash("Fix it.", "sed -i 's/return 1/return 3/' m.py"),
               _bash("Run the test again.", test), _bash("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]
    asked: list[int] = []

    def script(turn: int) -> dict[str, Any]:  # by request, not by turn: the dropped reply is no turn
        asked.append(turn)
        return replies[min(len(asked) - 1, len(replies) - 1)]

    work = tmp_path / "work"
    work.mkdir()
    with Scripted({"Make m.f return 3": script}) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path / "logs"), stderr=tmp_path / "err") as proxy:
        out = drive("mini", proxy.base_url, "Make m.f return 3.", max_steps=20, workdir=work)
        assert out["state"] == "Submitted", out
        assert asked[1] == asked[2], asked  # the request after the format error brought no new turn
        found = ended_logs(proxy, tmp_path / "logs", len(replies))
    assert len(found) == 1, found
    assert "continues no run" not in (tmp_path / "err").read_text()


# ---------------------------------------------------------------------------- --on-stop error
def test_on_stop_error_ends_smolagents_and_mini_swe_agent_retries_the_400(tmp_path: Path) -> None:
    """The 400 of `--on-stop error`: smolagents' run raises it (both agents); mini-swe-agent retries
    it (litellm, MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT times; 10 by default), each retry answered the
    same 400 without reaching the upstream, then its run raises it."""
    storm = lambda turn: calls_reply(tool_call("fetch_status", {"service": "flaky"}, id=f"call_{turn}"))  # noqa: E731
    scripts = {"flaky service": storm, "Wait for the queue": [_bash("Again.", "echo 'queue: 3 jobs waiting'")],
               "Wait for the build": [text_reply("Thought: again.\n<code>\nprint('build: pending')\n</code>")]}
    with Scripted(scripts) as up, Proxy("--upstream", up.base_url, "--logs", str(tmp_path / "logs"), "--on-stop",
                                        "error", stderr=tmp_path / "err") as proxy:
        smol = drive("tool_calling", proxy.base_url, "Check the flaky service.", max_steps=10, raises=True)
        assert STOP_MARKER in smol["error"] and ("repeated_call" in smol["error"] or "no_progress" in smol["error"])
        assert up.seen["flaky service"] <= 3
        code = drive("code", proxy.base_url, "Wait for the build.", max_steps=12, raises=True)
        assert STOP_MARKER in code["error"], code
        assert up.seen["Wait for the build"] <= 6
        work = tmp_path / "work"
        work.mkdir()
        mini = drive("mini", proxy.base_url, "Wait for the queue.", max_steps=20, workdir=work, raises=True,
                     MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT="2")
        assert "BadRequestError" in mini["error"] and STOP_MARKER in mini["error"], mini
        assert up.seen["Wait for the queue"] <= 6
        assert len(up.requests) == sum(up.seen.values())


# ---------------------------------------------------------------------------- stop texts parse as nothing
PARSE_STOP = ROOT / "tests" / "agents" / "parse_stop.py"
# what a stop's detail may quote: a call's JSON arguments (as the guards write them), a tool call as
# smolagents writes one, code in each agent's form, a result with code in it
NASTY = ['fetch_status {"service":"x"}', '{"name": "fetch_status", "arguments": {"service": "x"}}',
         "Calling tools:\n[{'id': 'c0', 'type': 'function', 'function': {'name': 'final_answer', 'arguments': {}}}]",
         "```mswea_bash_command\nls -la\n```", "```bash\nrm -rf /\n```", "~~~py\nprint(1)\n~~~",
         "<code>\nprint('x')\n</code>", "< CODE >final_answer(1)</ code >", "```python\nfinal_answer(2)\n```",
         'run_tests {"cmd":"pytest -q"} → edit {"path":"a.py","text":"x = {1: 2}"}: 3 times',
         "print('a')", "x = 1"]


def stop_texts() -> list[str]:
    """Every text a stop puts before a client, for every reason and each nasty detail: the answer's
    message, the streamed content, and `--on-stop error`'s message."""
    from loopfence._stops import Stop, StopReason
    from loopfence.proxy import Answer

    texts = []
    for reason in StopReason:
        for i, detail in enumerate(NASTY):
            data = {"limit": 3, "value": 3} if i % 2 else {}
            for as_error in (False, True):
                a = Answer.stopped("r", "chatcmpl-x", "m", Stop(reason, detail, data), as_error)
                body = a.body()
                texts.append(body["error"]["message"] if as_error else body["choices"][0]["message"]["content"])
            streamed = "".join(json.loads(part[6:])["choices"][0]["delta"].get("content") or ""
                               for part in a.stream_tail("", False) if part.startswith(b"data: {\"id\""))
            texts.append(streamed)
    return texts


def test_no_stop_text_parses_as_a_call_or_an_action_in_smolagents_or_mini_swe_agent(tmp_path: Path) -> None:
    texts = stop_texts()
    assert all(t.startswith(STOP_MARKER) for t in texts)
    done = subprocess.run([str(_agents()), str(PARSE_STOP)], input=json.dumps(texts), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["checked"] == len(texts) and got["parsed"] == [], got["parsed"][:3]
    # the same parsers read the details as they were: the check can fail
    done = subprocess.run([str(_agents()), str(PARSE_STOP)], input=json.dumps(NASTY), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    readers = {name for bad in json.loads(done.stdout.strip().splitlines()[-1])["parsed"] for name in bad["parsers"]}
    assert readers >= {"smolagents get_tool_call_from_text", "smolagents parse_code_blobs",
                       "mini-swe-agent parse_regex_actions"}, readers
