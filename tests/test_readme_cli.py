"""The README's command lines run as printed, in order, from the repo's root, with several logs present.

Every fenced block of README.md with no language (or sh, bash, console) that holds a `loopfence`
command is taken, in the page's order, except `make` (the page's first block: `make test` is this
suite) and a block under `<!-- no-test: WHY -->` (it needs a service the suite does not run). They
run in one bash (`set -euo pipefail`: a shell variable one block sets, the next uses), in a folder laid
out as the repo's root (docs/examples copied), where `runs/` already holds several logs, as it does
after `make run` and an example or two. Each command must exit 0 and print no traceback.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```\s*(\w*)\s*$")
NO_TEST = re.compile(r"^\s*<!--\s*no-test\s*:.*-->\s*$")


def command_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each shell block holding a loopfence command, in order."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = [ln for ln in lines[i + 1:end] if ln.strip()]
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if (m.group(1) in ("", "sh", "bash", "console") and any(ln.startswith("loopfence ") for ln in body)
                and not NO_TEST.match(before)):
            blocks.append((i + 2, body))
        i = end + 1
    return blocks


def test_the_readme_has_the_commands_a_newcomer_meets() -> None:
    commands = [ln.split()[1] for _, body in command_blocks(README.read_text()) for ln in body
                if ln.startswith("loopfence ")]
    assert {"run", "reconcile", "replay", "resume", "export", "schema", "batch", "report"} <= set(commands)
    assert not any(ln.startswith("make ") for _, body in command_blocks(README.read_text()) for ln in body)


def test_the_extractor_skips_what_it_must() -> None:
    text = "```\nmake run\n```\n<!-- no-test: needs a collector -->\n```\nloopfence export x\n```\n" \
           "```python\nloopfence = 1\n```\n```sh\nloopfence schema events\n```\n"
    assert command_blocks(text) == [(12, ["loopfence schema events"])]


def _several_logs(root: Path) -> None:
    """runs/ as a newcomer has it after a couple of tries: a run that answered, and one that was stopped."""
    runs = root / "runs"
    runs.mkdir()
    loop = root / "loop.jsonl"
    loop.write_text(json.dumps({"choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "list_dir", "arguments": "{}"}}]}}]}) + "\n")
    for i, script in enumerate(["docs/examples/replies.jsonl", str(loop), "docs/examples/replies.jsonl"]):
        subprocess.run([sys.executable, "-m", "loopfence", "run", "Read app/config.py", "--script", script,
                        "--workspace", "docs/examples", "--quiet", "--log", f"runs/run-2026010{i}-000000-000000.jsonl"],
                       cwd=root, capture_output=True, text=True, timeout=120, check=False)
    assert len(list(runs.glob("*.jsonl"))) == 3


def test_the_readme_commands_run_as_printed(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs" / "examples", root / "docs" / "examples")
    _several_logs(root)
    script = ["set -euo pipefail"]
    for line_no, body in command_blocks(README.read_text()):
        for offset, line in enumerate(body):
            script.append(f"echo {shlex.quote(f'>>> README.md:{line_no + offset}: {line}')} >&2")
            script.append(line)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPFENCE_", "OPENAI_", "OTEL_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `loopfence` as installed
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    ran = [ln for ln in proc.stderr.splitlines() if ln.startswith(">>> README.md:")]
    assert proc.returncode == 0, f"failed at {ran[-1] if ran else '?'} (exit {proc.returncode})\n{proc.stderr[-5000:]}"
    assert "Traceback" not in proc.stderr
    assert len(ran) >= 12
    assert (root / "runs" / "job" / "report.html").is_file() and (root / "trajectories.jsonl").is_file()
    assert len((root / "trajectories.jsonl").read_text().splitlines()) >= 4  # the README's run, and the three before
