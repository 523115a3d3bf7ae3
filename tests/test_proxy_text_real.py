"""False stops of text actions (issue 40): real successful runs, re-rendered as a text-acting agent
renders its turns, finish through `loopfence proxy --limits coding`.

Each run is first played by `loopfence drill` (the 8 shared real runs, their limits those of the
coding profile; the drill's legitimate scenarios as they are), which records every reply and every
result. Then each is re-rendered as a bash-block conversation: a reply is a THOUGHT, then one block
per call (a `command` argument as it is, any other call as `name {arguments}`); the results of its
calls are the next user message; the last reply is the text it was. A real HTTP upstream on
127.0.0.1 serves those replies in turn, a client sends the outputs back, and no answer may be a stop.
The one poll among them (a job polled until done) is declared as a user would: `--kinds` names its
program a poll.
Once every conversation is done, its run is ended (the reset route) and its log reconciles.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence import Limits
from loopfence.cli import cli
from loopfence.runlog import read_log
from loopfence.testing import text_reply

from _proxy_support import ROOT, Proxy, ReplyServer, kinds_file, logs_in, reconciles, reset_all

pytestmark = pytest.mark.timeout(900)
REAL_RUNS = ROOT / "tests" / "data" / "real-runs"
LEGIT = sorted((ROOT / "drills").glob("legit-*.json"))


def _drilled(tmp: Path) -> list[Path]:
    """The logs of the real runs (coding profile) and the legitimate drills, played by `loopfence drill`."""
    folder = tmp / "scenarios"
    folder.mkdir()
    for f in sorted(REAL_RUNS.glob("*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        data["limits"] = Limits.profile("coding").to_json()
        (folder / f.name).write_text(json.dumps(data), encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = cli(["drill", str(folder), *map(str, LEGIT), "--json", "--out", str(tmp / "drilled")])
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    assert rc == 0 and len(rows) == 8 + len(LEGIT), [r.get("detail") for r in rows if r.get("stop") != "final_answer"]
    return [Path(r["log"]) for r in rows]


def _block(name: str, raw: str) -> str:
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        args = raw
    command = args.get("command") if isinstance(args, dict) else None
    return f"```bash\n{command if isinstance(command, str) else f'{name} {raw}'}\n```"


def render(log_path: Path) -> tuple[str, list[tuple[str, tuple[int, int] | None]], list[str]]:
    """(the task, each reply as text with its usage, each reply's output as the next user message)."""
    log = read_log(log_path)
    replies, outputs = [], []
    for line in log.of("reply"):
        r = line.reply()
        usage = (r.usage.prompt_tokens or 0, r.usage.completion_tokens or 0) if r.usage is not None else None
        if not r.tool_calls:
            replies.append((r.content or "Done.", usage))
            continue
        blocks = "\n\n".join(_block(c.name, c.raw_arguments) for c in r.tool_calls)
        replies.append((f"THOUGHT: {(r.content or '').strip() or 'Next step.'}\n\n{blocks}", usage))
        results = [e.content for e in log.of("result") if e.step == line.step]
        outputs.append("\n\n".join(f"<output>\n{text}\n</output>" for text in results))
    return f"[{log_path.stem}] {log.header.task}", replies, outputs


def test_real_runs_and_the_legit_drills_rendered_as_bash_blocks_finish_under_coding(tmp_path: Path) -> None:
    conversations = {task: (replies, outputs) for task, replies, outputs in map(render, _drilled(tmp_path))}

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        task = body["messages"][1]["content"]
        replies = conversations[task][0]
        text, usage = replies[sum(1 for m in body["messages"] if m["role"] == "assistant")]
        return text_reply(text, usage=usage)

    # the polls the scenarios declare, declared as a careful user would (a program's name, --kinds)
    polls = {name: "poll" for f in [*REAL_RUNS.glob("*.json"), *LEGIT]
             for name, tool in (json.loads(f.read_text(encoding="utf-8")).get("canned_tools") or {}).items()
             if tool.get("kind") == "poll"}
    assert polls == {"poll_job": "poll"}
    logs = tmp_path / "logs"
    with ReplyServer(reply) as up, Proxy("--upstream", up.base_url, "--logs", str(logs), "--limits", "coding",
                                         "--kinds", str(kinds_file(tmp_path, polls)),
                                         stderr=tmp_path / "err") as proxy:
        for task, (replies, outputs) in conversations.items():
            messages = [{"role": "system", "content": "Reply with a THOUGHT, then one bash block."},
                        {"role": "user", "content": task}]
            for i in range(len(replies)):
                r = httpx.post(f"{proxy.base_url}/chat/completions", json={"model": "m", "messages": messages},
                               timeout=120)
                assert r.status_code == 200 and "x-loopfence-stop" not in r.headers, (task[:60], i, r.text[:500])
                if i < len(outputs):
                    messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                                 {"role": "user", "content": outputs[i]}]
        assert len(up.requests) == sum(len(r) for r, _ in conversations.values())
        ended = reset_all(proxy.base_url)
    assert len(ended) == len(conversations)
    assert {e["stop"]["reason"] for e in ended} == {"final_answer"}
    for log in logs_in(logs):
        reconciles(log)
