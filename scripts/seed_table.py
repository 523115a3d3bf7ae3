"""Run one task on the embedded model over several seeds and print a Markdown table.

    .venv/bin/python scripts/seed_table.py                      # make run's sample task, seeds 0-9
    .venv/bin/python scripts/seed_table.py --task "..." --page pages/tl-intro.html --seeds 20

Why a script: the README's table must be something anyone can rerun, and it measures what
`make run` runs: each seed is the real CLI (`python -m loopfence run ... --seed N --temperature T`)
on a fresh copy of the sample workspace, read back from its own run log. Per seed: whether the
model read the page the task names (a `read_file` of it that returned ok), whether it answered
(stop `final_answer`), the stop, and the model requests it took. Seeds run one after another:
llama.cpp already uses the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# make run's sample task (Makefile: `run`); keep the two in step
SAMPLE_TASK = 'Read "pages/tl-intro.html" and make a note of it.'
SAMPLE_SYSTEM = ("You work in a folder of files. Use the tools to read what the task names. "
                 "When you have read it, reply with a short note in Markdown.")
DEFAULT_TEMPERATURE = 0.7


@dataclass(frozen=True)
class Row:
    seed: int
    read: bool
    answered: bool
    stop: str
    steps: int


def page_of(task: str) -> str:
    """The path a task names: the first quoted one, else the first word that looks like a file."""
    quoted = re.search(r'"([^"]+)"', task)
    if quoted:
        return quoted.group(1)
    bare = re.search(r"[\w./-]+\.\w+", task)
    if not bare:
        raise SystemExit(f"no file named in the task {task!r}: pass --page")
    return bare.group(0)


def read_log(path: Path, page: str) -> tuple[bool, str, int]:
    """(the page was read ok, the stop reason, model requests) from one run log."""
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    reads = {e["tool_call_id"] for e in events if e["event"] == "call" and e.get("name") == "read_file"
             and _same_path((e.get("arguments") or {}).get("path"), page)}
    read = any(e["event"] == "result" and e.get("tool_call_id") in reads and e.get("ok") is True for e in events)
    stop = events[-1]
    if stop["event"] != "stop":
        raise SystemExit(f"{path}: the log does not end with a stop")
    return read, str(stop["reason"]), int(stop["ledger"]["model_requests"])


def _same_path(value: Any, page: str) -> bool:
    return isinstance(value, str) and value.removeprefix("./") == page.removeprefix("./")


def run_seed(seed: int, args: argparse.Namespace, page: str) -> Row:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPFENCE_")}  # the embedded model
    with tempfile.TemporaryDirectory(prefix=f"seed{seed}-") as tmp:
        ws, log = Path(tmp) / "workspace", Path(tmp) / "run.jsonl"
        shutil.copytree(args.workspace, ws)
        cmd = [sys.executable, "-m", "loopfence", "run", args.task, "--workspace", str(ws), "--log", str(log),
               "--seed", str(seed), "--temperature", str(args.temperature), "--quiet"]
        if args.system:
            cmd += ["--system", args.system]
        for limit in args.limit:
            cmd += ["--limit", limit]
        done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode not in (0, 1) or not log.is_file():
            raise SystemExit(f"seed {seed}: loopfence run exited {done.returncode}\n{done.stderr}")
        read, stop, steps = read_log(log, page)
    return Row(seed, read, stop == "final_answer", stop, steps)


def table(rows: list[Row]) -> str:
    yes = {True: "yes", False: "no"}
    lines = ["| seed | read the page | answered | stop | steps |", "|---:|:---:|:---:|---|---:|"]
    lines += [f"| {r.seed} | {yes[r.read]} | {yes[r.answered]} | {r.stop} | {r.steps} |" for r in rows]
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    n = len(rows)
    stops = ", ".join(f"{reason} {count}" for reason, count in Counter(r.stop for r in rows).most_common())
    both = sum(r.read and r.answered for r in rows)
    return (f"reads {sum(r.read for r in rows)}/{n} · answers {sum(r.answered for r in rows)}/{n} "
            f"(after reading the page: {both}/{n}) · stops: {stops} · "
            f"median steps {statistics.median(r.steps for r in rows):g}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default=SAMPLE_TASK, help="the task (default: make run's sample task)")
    p.add_argument("--system", default=SAMPLE_SYSTEM, help="the system prompt (default: make run's)")
    p.add_argument("--page", help="the file the task names (default: the first quoted path in the task)")
    p.add_argument("--workspace", type=Path, default=ROOT / "examples" / "workspace")
    p.add_argument("--seeds", type=int, default=10, help="how many seeds (default: 10)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE)
    p.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE", help="passed to loopfence run")
    p.add_argument("--timeout", type=float, default=600, help="seconds one seed may take")
    args = p.parse_args(argv)
    page = args.page or page_of(args.task)
    print(f"task: {args.task}  \nsystem: {args.system}  \ntemperature {args.temperature}, seeds "
          f"{args.first_seed}-{args.first_seed + args.seeds - 1}, the page: {page}  \n"
          f"command: `{shlex.join(['python', 'scripts/seed_table.py', *(argv if argv is not None else sys.argv[1:])])}`\n",
          flush=True)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rows.append(run_seed(seed, args, page))
        print(f"seed {seed}: {rows[-1].stop}", file=sys.stderr, flush=True)
    print(table(rows))
    print()
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
