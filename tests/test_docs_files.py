"""The example files of the docs (docs/examples/) do what the pages say, on the command line too.

docs/fake-server.md shows `replies.jsonl` run by `loopfence run --script` and served by
`loopfence fake-server` to `loopfence run --base-url`; both are run here as a reader would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopfence.testing import FakeServer, load_forms

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
REPLIES = EXAMPLES / "replies.jsonl"
ANSWER = "app/config.py turns debugging off (DEBUG = False) and reads the port from PORT."


CONFIG = 'import os\n\nDEBUG = False\nPORT = int(os.environ.get("PORT", "8000"))\n'  # what ANSWER says of it


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "app").mkdir(parents=True)
    (ws / "app" / "config.py").write_text(CONFIG)
    return ws


def loopfence(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPFENCE_", "OPENAI_"))}
    return subprocess.run([sys.executable, "-m", "loopfence", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


EPISODES = EXAMPLES / "episodes.jsonl"  # the README's batch: episodes, not replies


def test_every_example_file_is_a_valid_script() -> None:
    files = sorted(set(EXAMPLES.glob("*.jsonl")) - {EPISODES})
    assert REPLIES in files
    for path in files:
        assert load_forms(path), path  # a bad form raises FormError naming the line


def test_the_episodes_example_loads_and_its_workspace_holds_the_config() -> None:
    from loopfence._batch import load_episodes

    episodes = load_episodes(EPISODES)
    assert [e.id for e in episodes] == ["config", "config-again"]
    assert all((Path(e.workspace or "") / "app" / "config.py").read_text() == CONFIG for e in episodes)


def test_replies_jsonl_with_run_script(workspace: Path) -> None:
    log = workspace.parent / "run.jsonl"
    proc = loopfence("run", "Read app/config.py", "--script", str(REPLIES), "--workspace", ".",
                     "--limit", "max_steps=5", "--log", str(log), cwd=workspace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ANSWER in proc.stdout
    stop = json.loads(log.read_text().splitlines()[-1])
    assert (stop["event"], stop["reason"], stop["ledger"]["tool_executions"]) == ("stop", "final_answer", 2)


def test_replies_jsonl_served_by_fake_server(workspace: Path) -> None:
    server = subprocess.Popen([sys.executable, "-m", "loopfence", "fake-server", "--script", str(REPLIES)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base_url = (server.stdout.readline() if server.stdout else "").strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), base_url
        log = workspace.parent / "http.jsonl"
        proc = loopfence("run", "Read app/config.py", "--base-url", base_url, "--model", "fake",
                         "--workspace", ".", "--log", str(log), cwd=workspace)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert ANSWER in proc.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_fault_example_in_process() -> None:
    """faults.jsonl as docs/fake-server.md describes it: three HTTP requests, two model requests."""
    with FakeServer(load_forms(EXAMPLES / "faults.jsonl")) as server:
        from loopfence import OpenAIModel, run, tool

        @tool(kind="read_only")
        def read_file(path: str) -> str:
            """Read a file."""
            return "DEBUG = False"

        result = run("Is debugging on?", model=OpenAIModel(server.base_url, "fake"), tools=[read_file])
    assert result.final_answer == "DEBUG is off."
    assert len(server.requests) == 3 and result.ledger.model_requests == 2
