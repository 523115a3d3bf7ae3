"""Gemini CLI behind the fence (issue 57): the real CLI, pinned (`make agents`: build/agents-gemini), as
`gemini -p ... --yolo --output-format json`, with a settings.json and HOME of the test's own
(`security.auth.selectedType: "gemini-api-key"`: with only GOOGLE_GEMINI_BASE_URL set it will not
start), `GOOGLE_GEMINI_BASE_URL` set to the proxy's root, no header and no limit flag, in front of a
scripted upstream that speaks the Gemini wire on 127.0.0.1; a throwaway git repo, stdin from
/dev/null, under `timeout`, every address but loopback sent to a closed port.

- A runaway of identical reads: loopfence stops it (at the third ask) before Gemini CLI's own loop
  detector, and the output says loopfence stopped it.
- A runaway Gemini's detector does not see (the same failing command with the same output,
  alternating with a read): loopfence stops it as a cycle.
- A legitimate task (a read, an edit, the test, an answer) finishes untouched.
- Every log reconciles and replays. Its side calls (the router's JSON-mode call, with no tools) are
  runs of their own, never merged into the agent's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _gemini_support import GeminiReplies
from _proxy_support import ROOT, Proxy, built, ended
from test_proxy_claude_code import fixed, repo
from test_proxy_coding_agents import isolated, run_agent

pytestmark = pytest.mark.timeout(600)
GEMINI = ROOT / "build" / "agents-gemini" / "node_modules" / ".bin" / "gemini"
SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"disableAutoUpdate": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


class Scripted(GeminiReplies):
    """The agent's requests (they declare read_file): `script(turn)`; the router's (no tools): its JSON."""

    def __init__(self, script: Any) -> None:
        self.script, self.main = script, 0
        super().__init__(self.pick)

    def pick(self, body: dict[str, Any]) -> dict[str, Any]:
        names = {d.get("name") for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []}
        if "read_file" not in names:
            return text_reply(json.dumps({"complexity_reasoning": "a small task", "complexity_score": 10}))
        self.main += 1
        return self.script(sum(1 for c in body["contents"] if c.get("role") == "model"))


def gemini(proxy: Proxy, work: Path, home: Path, prompt: str) -> dict[str, Any]:
    """`gemini -p PROMPT --yolo --output-format json` through the proxy: its JSON output."""
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
    env = isolated(home, GEMINI_API_KEY="client-key", GOOGLE_GEMINI_BASE_URL=proxy.base_url.removesuffix("/v1"),
                   GEMINI_CLI_TRUST_WORKSPACE="true")
    done = run_agent([str(built(GEMINI, "agents")), "-p", prompt, "--yolo", "--output-format", "json"], work, env)
    return json.loads(done.stdout)


def test_gemini_cli_runaway_of_identical_reads_is_stopped_by_loopfence_first(tmp_path: Path) -> None:
    work = repo(tmp_path)
    again = lambda turn: calls_reply(tool_call("read_file", {"file_path": str(work / "calc.py")}))  # noqa: E731
    with Scripted(again) as up, Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path / "logs"),
                                      stderr=tmp_path / "err") as proxy:
        out = gemini(proxy, work, tmp_path / "home", "Keep reading calc.py until it changes.")
        assert out["response"].startswith(STOP_MARKER) and "repeated_call" in out["response"], out.get("response")
        assert up.main <= 3, up.main
        found = ended(proxy.base_url, tmp_path / "logs")
    assert "repeated_call" in {str(read_log(p).stop.reason) for p in found}
    assert {read_log(p).header.record["proxy"]["wire"] for p in found} == {"gemini"}


def test_gemini_cli_runaway_its_detector_does_not_see_is_stopped_as_a_cycle(tmp_path: Path) -> None:
    """The same failing test, then the same read, over and over: no two calls in a row are the same."""
    work = repo(tmp_path)
    pair = [("run_shell_command", {"command": "python3 test_calc.py"}), ("read_file", {"file_path": str(work / "calc.py")})]
    loop = lambda turn: calls_reply(tool_call(*pair[turn % 2]))  # noqa: E731
    with Scripted(loop) as up, Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path / "logs"),
                                     stderr=tmp_path / "err") as proxy:
        out = gemini(proxy, work, tmp_path / "home", "Make the test pass.")
        assert out["response"].startswith(STOP_MARKER) and "repeated_result" in out["response"], out.get("response")
        assert up.main <= 7, up.main
        found = ended(proxy.base_url, tmp_path / "logs")
    assert "repeated_result" in {str(read_log(p).stop.reason) for p in found}


def test_gemini_cli_legitimate_task_finishes_untouched(tmp_path: Path) -> None:
    work = repo(tmp_path)
    steps = [("read_file", {"file_path": str(work / "calc.py")}),
             ("replace", {"file_path": str(work / "calc.py"), "old_string": "return a - b", "new_string": "return a + b",
                          "instruction": "add, not subtract"}),
             ("run_shell_command", {"command": "python3 test_calc.py", "description": "run the test"})]
    answer = "Fixed: add adds now, and test_calc.py passes."

    def script(turn: int) -> dict[str, Any]:
        if turn < len(steps):
            return calls_reply(tool_call(*steps[turn]), usage=(20_000, 40))
        return text_reply(answer, usage=(21_000, 20))

    with Scripted(script) as up, Proxy("--upstream", f"gemini={up.root}", "--logs", str(tmp_path / "logs"),
                                       stderr=tmp_path / "err") as proxy:
        out = gemini(proxy, work, tmp_path / "home", "Fix add in calc.py so that test_calc.py passes.")
        assert out["response"] == answer, out.get("response")
        found = ended(proxy.base_url, tmp_path / "logs")
    fixed(work, found, len(steps))
