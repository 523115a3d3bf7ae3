"""Claude Code behind the fence (issue 55): the real CLI, pinned (`make agents`:
build/agents-claude), as `claude -p`, through `loopfence proxy` started with no limit flag and no
header, `ANTHROPIC_BASE_URL` set to the address the proxy prints, in front of a scripted upstream
that speaks the Anthropic wire on 127.0.0.1. Run as the suite runs (root: `IS_SANDBOX=1` lets
`--dangerously-skip-permissions` through), in a throwaway git repo, with a HOME of its own, stdin
from /dev/null, under `timeout`, every address but loopback sent to a closed port.

- A runaway of identical reads reaches the upstream at most 3 times; the CLI exits by itself, and
  its JSON output is the stop text.
- A legitimate task (two reads, an edit, a test run, an answer), the upstream reporting real-sized
  usage (20,000 prompt tokens a request: the defaults' 60,000 would stop it), finishes untouched.
- Every log of both reconciles and replays.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _anthropic_support import AnthropicReplies
from _proxy_support import ROOT, Proxy, built, ended
from test_proxy_coding_agents import isolated, run_agent

pytestmark = pytest.mark.timeout(600)
CLAUDE = ROOT / "build" / "agents-claude" / "node_modules" / ".bin" / "claude"


def repo(tmp_path: Path) -> Path:
    """A throwaway git repo: calc.py whose add subtracts, and its test."""
    work = tmp_path / "repo"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (work / "test_calc.py").write_text("from calc import add\nassert add(1, 2) == 3\nprint('ok')\n")
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(["git", *argv], cwd=work, check=True, capture_output=True)
    return work


class Scripted(AnthropicReplies):
    """The agent's requests (they carry the Read tool): `script(turn)`; any other (a side request of
    Claude Code's: no tools): a short text. `main` counts the agent's requests that reached it."""

    def __init__(self, script: Any) -> None:
        self.script, self.main = script, 0
        super().__init__(self.pick)

    def pick(self, body: dict[str, Any]) -> dict[str, Any]:
        if "Read" not in {t.get("name") for t in body.get("tools") or []}:
            return text_reply("Fix the calculator", usage=(300, 5))
        self.main += 1
        form = self.script(sum(1 for m in body["messages"] if m.get("role") == "assistant"))
        for c in form["choices"][0]["message"].get("tool_calls") or []:
            c["id"] = f"toolu_{self.main:03d}"  # a new id each reply, as a real model's
        return form


def claude(proxy: Proxy, work: Path, home: Path, prompt: str) -> dict[str, Any]:
    """`claude -p PROMPT --output-format json` through the proxy: its JSON result."""
    env = isolated(home, IS_SANDBOX="1", ANTHROPIC_BASE_URL=proxy.anthropic_url, ANTHROPIC_API_KEY="sk-ant-client",
                   DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1")
    done = run_agent([str(built(CLAUDE, "agents")), "-p", prompt, "--output-format", "json",
                      "--dangerously-skip-permissions"], work, env)
    return json.loads(done.stdout)


def test_claude_code_runaway_of_identical_reads_stops_within_three_requests(tmp_path: Path) -> None:
    work = repo(tmp_path)
    again = lambda turn: calls_reply(tool_call("Read", {"file_path": str(work / "calc.py")}, id=f"toolu_{turn:03d}"),  # noqa: E731
                                     usage=(20_000, 30))
    with Scripted(again) as up, Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path / "logs"),
                                      stderr=tmp_path / "err") as proxy:
        assert proxy.anthropic_url == proxy.base_url.removesuffix("/v1")  # the root, with no /v1
        out = claude(proxy, work, tmp_path / "home", "Keep reading calc.py until it changes.")
        assert out["result"].startswith(STOP_MARKER) and "repeated_call" in out["result"], out["result"]
        assert up.main <= 3, up.main
        found = ended(proxy.base_url, tmp_path / "logs")
    stops = {str(read_log(p).stop.reason) for p in found if read_log(p).stop is not None}
    assert "repeated_call" in stops
    assert {read_log(p).header.record["proxy"]["wire"] for p in found} == {"anthropic"}


def test_claude_code_legitimate_task_finishes_untouched_with_no_limit_flags(tmp_path: Path) -> None:
    work = repo(tmp_path)
    steps = [("Read", {"file_path": str(work / "calc.py")}), ("Read", {"file_path": str(work / "test_calc.py")}),
             ("Edit", {"file_path": str(work / "calc.py"), "old_string": "return a - b", "new_string": "return a + b"}),
             ("Bash", {"command": "python3 test_calc.py", "description": "Run the test"})]
    answer = "Fixed: add adds now, and test_calc.py passes."

    def script(turn: int) -> dict[str, Any]:
        if turn < len(steps):
            return calls_reply(tool_call(steps[turn][0], steps[turn][1], id=f"toolu_{turn:03d}"), usage=(20_000, 40))
        return text_reply(answer, usage=(21_000, 20))

    with Scripted(script) as up, Proxy("--upstream", f"anthropic={up.root}", "--logs", str(tmp_path / "logs"),
                                       stderr=tmp_path / "err") as proxy:
        assert "limits: coding" in proxy.line
        out = claude(proxy, work, tmp_path / "home", "Fix add in calc.py so that test_calc.py passes.")
        assert out["result"] == answer and out["is_error"] is False, out
        assert up.main == len(steps) + 1
        found = ended(proxy.base_url, tmp_path / "logs")
    agent = fixed(work, found, len(steps))
    assert agent.stop.ledger["prompt_tokens"] > 60_000  # past the defaults: the coding profile let it finish


def fixed(work: Path, found: list[Path], executions: int) -> Any:
    """The repo's calc.py fixed, and the agent's one run (its log) finished with `executions` calls
    run, the test last, for real."""
    assert (work / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    agent = [read_log(p) for p in found if read_log(p).stop is not None and read_log(p).stop.ledger["tool_executions"]]
    assert len(agent) == 1 and agent[0].stop.reason == "final_answer"
    assert agent[0].stop.ledger["tool_executions"] == executions
    results = [r.content for r in agent[0].of("result") if r.decision == "executed"]
    assert "ok" in results[-1]  # the test ran for real, after the edit
    return agent[0]

