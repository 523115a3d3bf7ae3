"""Codex behind the fence (issue 56): the real CLI, pinned (`make agents`: build/agents-codex), as
`codex exec`, configured through a `config.toml` in a CODEX_HOME of the test's own (a model provider
whose `base_url` is the proxy and whose `wire_api` is "responses"), through `loopfence proxy` with no
header and no limit flag, in front of a scripted upstream that speaks the Responses wire on
127.0.0.1; a throwaway git repo, a HOME of its own, stdin from /dev/null, under `timeout`, every
address but loopback sent to a closed port.

- A runaway of identical `exec_command` calls reaches the upstream at most 3 times; the CLI exits by
  itself, and its output shows the stop text.
- A legitimate task (two reads, an edit, a test run, an answer) finishes untouched.
- Every log of both reconciles and replays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopfence.proxy import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _proxy_support import ROOT, Proxy, built, ended
from _responses_support import ResponsesReplies
from test_proxy_claude_code import fixed, repo
from test_proxy_coding_agents import isolated, run_agent

pytestmark = pytest.mark.timeout(600)
CODEX = ROOT / "build" / "agents-codex" / "node_modules" / ".bin" / "codex"
CONFIG = """model = "m1"
model_provider = "fence"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.fence]
name = "loopfence"
base_url = "{base_url}"
wire_api = "responses"
"""


class Scripted(ResponsesReplies):
    """The agent's requests (they carry exec_command): `script(turn)`, each call with an id of its own;
    any other: a short text. `main` counts the agent's requests that reached it."""

    def __init__(self, script: Any) -> None:
        self.script, self.main = script, 0
        super().__init__(self.pick)

    def pick(self, body: dict[str, Any]) -> dict[str, Any]:
        if "exec_command" not in {t.get("name") for t in body.get("tools") or []}:
            return text_reply("ok")
        self.main += 1
        form = self.script(sum(1 for it in body["input"] if it.get("type") == "function_call"))
        for c in form["choices"][0]["message"].get("tool_calls") or []:
            c["id"] = f"call_{self.main:03d}"
        return form


def codex(proxy: Proxy, work: Path, home: Path, prompt: str) -> str:
    """`codex exec PROMPT` through the proxy: what it printed (its last message is the answer)."""
    (home / "codex").mkdir(parents=True)
    (home / "codex" / "config.toml").write_text(CONFIG.format(base_url=proxy.base_url))
    done = run_agent([str(built(CODEX, "agents")), "exec", prompt], work, isolated(home, CODEX_HOME=str(home / "codex")))
    return done.stdout


def test_codex_runaway_of_identical_exec_commands_stops_within_three_requests(tmp_path: Path) -> None:
    work = repo(tmp_path)
    again = lambda turn: calls_reply(tool_call("exec_command", {"cmd": "cat calc.py"}), usage=(9_000, 30))  # noqa: E731
    with Scripted(again) as up, Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path / "logs"),
                                      stderr=tmp_path / "err") as proxy:
        out = codex(proxy, work, tmp_path / "home", "Keep reading calc.py until it changes.")
        assert STOP_MARKER in out and "repeated_call" in out, out[-2000:]
        assert up.main <= 3, up.main
        found = ended(proxy.base_url, tmp_path / "logs")
    assert {str(read_log(p).stop.reason) for p in found} >= {"repeated_call"}
    assert {read_log(p).header.record["proxy"]["wire"] for p in found} == {"responses"}


def test_codex_legitimate_task_finishes_untouched(tmp_path: Path) -> None:
    work = repo(tmp_path)
    steps = ["cat calc.py", "cat test_calc.py", "sed -i 's/return a - b/return a + b/' calc.py", "python3 test_calc.py"]
    answer = "Fixed: add adds now, and test_calc.py passes."

    def script(turn: int) -> dict[str, Any]:
        if turn < len(steps):
            return calls_reply(tool_call("exec_command", {"cmd": steps[turn]}), usage=(20_000, 40))
        return text_reply(answer, usage=(21_000, 20))

    with Scripted(script) as up, Proxy("--upstream", f"responses={up.root}", "--logs", str(tmp_path / "logs"),
                                       stderr=tmp_path / "err") as proxy:
        out = codex(proxy, work, tmp_path / "home", "Fix add in calc.py so that test_calc.py passes.")
        assert answer in out and STOP_MARKER not in out, out[-2000:]
        assert up.main == len(steps) + 1
        found = ended(proxy.base_url, tmp_path / "logs")
    fixed(work, found, len(steps))
