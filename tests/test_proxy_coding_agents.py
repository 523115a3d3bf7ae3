"""Coding agents nobody here wrote, pinned (`make agents`: build/agents-opencode, build/agents-aider),
through `loopfence proxy` by base URL, with no header (issue 53), against a scripted upstream: a real
HTTP server on 127.0.0.1. Each runs under `timeout`, with stdin from /dev/null, a HOME of its own and
loopback addresses only.

- opencode 1.18 (`opencode run`), its default config with titles on: it sends `x-session-id` on every
  request, and its title generator (no tools) opens the session. A legitimate five-step task finishes
  untouched; a runaway that reads one file again and again stops within 3 upstream requests. Under
  `--limits coding`: each opencode request carries ~13k prompt tokens (its system prompt and ten tool
  schemas), so the default 60,000 cumulative prompt tokens stop the fifth request.
- aider 0.86 (`--message`, edit blocks, `--auto-test`) rebuilds its history each turn: a runaway that
  repeats the same failing edit stops within 6 requests, named by base URL (`/run/NAME/v1`) and
  without a name.

After each agent, its runs are ended (the reset route) and every log reconciles and replays.
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

from _proxy_support import ROOT, Proxy, ReplyServer, built, ended

pytestmark = pytest.mark.timeout(600)
OPENCODE = ROOT / "build" / "agents-opencode" / "node_modules" / ".bin" / "opencode"
AIDER = ROOT / "build" / "agents-aider" / "bin" / "aider"
AGENT_S = 180  # an agent run's own time limit (`timeout`): bounds a failure, not a speed


NOWHERE = "http://127.0.0.1:9"  # a closed loopback port: what an agent asks of anything but loopback fails at once


def isolated(home: Path, **env: str) -> dict[str, str]:
    """The environment of an agent run: a HOME and XDG folders of its own, nothing of ours, and every
    address but loopback sent to a closed port (its update checks, plugin and price downloads)."""
    for d in ("config", "data", "cache", "state"):
        (home / d).mkdir(parents=True, exist_ok=True)
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_STATE_HOME": str(home / "state"), "TMPDIR": str(home), "LANG": "C.UTF-8",
            "HTTP_PROXY": NOWHERE, "HTTPS_PROXY": NOWHERE, "http_proxy": NOWHERE, "https_proxy": NOWHERE,
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "npm_config_registry": NOWHERE,
            **env}


def run_agent(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["timeout", str(AGENT_S), *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=AGENT_S + 30)
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done


# ---------------------------------------------------------------------------- opencode
def opencode(base_url: str, work: Path, home: Path, message: str) -> list[dict[str, Any]]:
    """One `opencode run` against `base_url` with a provider of its own (`@ai-sdk/openai-compatible`,
    bundled), its events (`--format json`)."""
    config = {"$schema": "https://opencode.ai/config.json", "model": "local/m1", "enabled_providers": ["local"],
              "autoupdate": False, "share": "disabled",
              "provider": {"local": {"npm": "@ai-sdk/openai-compatible", "name": "Local",
                                     "options": {"baseURL": base_url, "apiKey": "sk-client"},
                                     "models": {"m1": {"name": "m1", "tool_call": True,
                                                       "limit": {"context": 32000, "output": 4096}}}}}}
    env = isolated(home, OPENCODE_CONFIG_CONTENT=json.dumps(config), OPENCODE_DISABLE_MODELS_FETCH="1",
                   OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_SHARE="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
                   OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_CLAUDE_CODE="1",
                   OPENCODE_DISABLE_EXTERNAL_SKILLS="1")
    done = run_agent([str(built(OPENCODE, "agents")), "run", "--format", "json", message], work, env)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


class OpencodeUpstream(ReplyServer):
    """The title generator (no tools) gets a title; the agent's requests, `script(turn, work)` at their
    turn (assistant messages so far). `main` counts the agent's requests that reached it."""

    def __init__(self, script: Any) -> None:
        self.script, self.main, self.titles = script, 0, 0
        super().__init__(self.pick)

    def pick(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("tools"):
            self.titles += 1
            return text_reply("Reading the notes")
        self.main += 1
        return self.script(sum(1 for m in body["messages"] if m.get("role") == "assistant"))


def test_opencode_with_titles_finishes_a_legitimate_five_step_task_untouched(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(3):
        (work / f"n{i}.txt").write_text(f"note {i}: the build needs step {i}\n")
    steps = [("read", {"filePath": str(work / "n0.txt")}), ("read", {"filePath": str(work / "n1.txt")}),
             ("read", {"filePath": str(work / "n2.txt")}), ("glob", {"pattern": "*.txt", "path": str(work)}),
             ("grep", {"pattern": "step", "path": str(work)})]

    def script(turn: int) -> dict[str, Any]:
        if turn < len(steps):
            return calls_reply(tool_call(steps[turn][0], steps[turn][1], id=f"call_{turn}"))
        return text_reply("The build needs steps 0, 1 and 2.")

    with OpencodeUpstream(script) as up, Proxy("--upstream", up.base_url, "--logs", str(tmp_path / "logs"),
                                               "--limits", "coding", stderr=tmp_path / "err") as proxy:
        events = opencode(proxy.base_url, work, tmp_path / "home", "What does the build need? Read the notes.")
        texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
        assert texts and texts[-1] == "The build needs steps 0, 1 and 2.", events[-3:]
        assert not any(STOP_MARKER in t for t in texts)
        assert up.main == len(steps) + 1 and up.titles == 1
        found = ended(proxy.base_url, tmp_path / "logs")
    main = [read_log(p) for p in found if read_log(p).header.record["proxy"].get("session", "").startswith("ses_")]
    agent = [log for log in main if log.stop is not None and log.stop.ledger["tool_executions"]]
    assert len(main) == 2 and len(agent) == 1  # the title's run and the agent's, under one session
    assert agent[0].stop.reason == "final_answer" and agent[0].stop.ledger["tool_executions"] == len(steps)


def test_opencode_runaway_stops_within_three_upstream_requests(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "status.txt").write_text("pending\n")
    again = lambda turn: calls_reply(tool_call("read", {"filePath": str(work / "status.txt")}, id=f"call_{turn}"))  # noqa: E731
    with OpencodeUpstream(again) as up, Proxy("--upstream", up.base_url, "--logs", str(tmp_path / "logs"),
                                              "--limits", "coding", stderr=tmp_path / "err") as proxy:
        events = opencode(proxy.base_url, work, tmp_path / "home", "Wait until status.txt says done.")
        texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
        assert texts and texts[-1].startswith(STOP_MARKER), events[-3:]
        assert up.main <= 3, up.main
        found = ended(proxy.base_url, tmp_path / "logs")
    stops = {str(read_log(p).stop.reason) for p in found if read_log(p).stop is not None}
    assert "repeated_call" in stops, stops


# ---------------------------------------------------------------------------- aider
FAILING_EDIT = ("I will fix it.\n\ncalc.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n"
                "    return a - b\n>>>>>>> REPLACE\n```\n")


@pytest.mark.parametrize("named", [True, False], ids=["named-by-base-url", "no-name"])
def test_aider_repeating_the_same_failing_edit_stops_within_six_requests(tmp_path: Path, named: bool) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    home = tmp_path / "home"
    (home / ".aider" / "caches").mkdir(parents=True)  # a fresh model-price cache: aider fetches none
    (home / ".aider" / "caches" / "model_prices_and_context_window.json").write_text("{}")
    with ReplyServer(lambda body: text_reply(FAILING_EDIT)) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path / "logs"), stderr=tmp_path / "err") as proxy:
        base = proxy.base_url.removesuffix("/v1") + "/run/calc-fix/v1" if named else proxy.base_url
        done = run_agent([str(built(AIDER, "agents")), "--model", "openai/m", "--openai-api-base", base,
                          "--openai-api-key", "sk-client", "--edit-format", "diff", "--no-git", "--yes-always",
                          "--no-check-update", "--analytics-disable", "--no-show-model-warnings", "--map-tokens", "0",
                          "--no-pretty", "--auto-test", "--test-cmd",
                          "python3 -c 'import calc; assert calc.add(1, 2) == 3'",
                          "--message", "Fix add in calc.py so that the test passes.", "calc.py"],
                         work, isolated(home, LITELLM_LOCAL_MODEL_COST_MAP="True"))
        assert STOP_MARKER in done.stdout, done.stdout[-3000:]
        assert len(up.requests) <= 6, len(up.requests)
        found = ended(proxy.base_url, tmp_path / "logs")
    assert len(found) == 1, found  # one run: named, or placed by its task and last answer
    if named:
        assert found[0].name == "calc-fix.jsonl"
    assert read_log(found[0]).stop is not None and read_log(found[0]).stop.reason == "repeated_call"
