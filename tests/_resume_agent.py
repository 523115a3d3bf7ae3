"""A killable agent for the kill-and-resume trials.

    python _resume_agent.py LOG COUNTER     # a real run: scripted model, a side-effecting tool

`append_line(text)` appends one line to COUNTER (fsynced), so every real execution leaves a mark;
`count_lines(after)` reads it (read-only). Environment:
  LOOPFENCE_TRIAL_DELAY_S   seconds each tool spends before and after its effect (default 0.01)
  LOOPFENCE_TRIAL_DIE_AT    "before:line-3" / "after:line-3": SIGKILL itself inside append_line,
                            before or after the effect; "event:N": right after the N-th log line
  LOOPFENCE_SCRIPTED_DELAY_S seconds each scripted reply takes (read by ScriptedModel itself); with the
                            tool delay it bounds the run's length from below, so timed kills land in it
The resume side imports `trial_tools` and `trial_script` from here (same tools, same schemas).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from loopfence import RunLog, ScriptedModel, Tool, run, tool
from loopfence.testing import calls_reply, text_reply, tool_call

__all__ = ["trial_tools", "trial_script", "TURNS"]

TURNS = 8


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def trial_tools(counter: Path, delay: float = 0.0, die_at: str | None = None) -> list[Tool]:
    def append_line(text: str) -> str:
        """Append one line to the counter file (a side effect)."""
        if die_at == f"before:{text}":
            _die()
        time.sleep(delay)
        with counter.open("a", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if die_at == f"after:{text}":
            _die()
        time.sleep(delay)
        return f"appended {text}"

    def count_lines(after: str) -> str:
        """How many lines the counter file holds (read-only)."""
        time.sleep(delay / 2)
        return str(len(counter.read_text(encoding="utf-8").splitlines())) if counter.exists() else "0"

    return [tool(append_line, kind="side_effect"), tool(count_lines, kind="read_only")]


def trial_script(turns: int = TURNS) -> list[dict[str, Any]]:
    replies = [calls_reply(tool_call("append_line", text=f"line-{i}"), tool_call("count_lines", after=f"line-{i}"),
                           usage=(100 + 10 * i, 12)) for i in range(turns)]
    return [*replies, text_reply(f"wrote {turns} lines", usage=(200, 4))]


def main(argv: list[str]) -> int:
    log_path, counter = Path(argv[0]), Path(argv[1])
    delay = float(os.environ.get("LOOPFENCE_TRIAL_DELAY_S") or 0.01)
    die_at = os.environ.get("LOOPFENCE_TRIAL_DIE_AT") or None
    on_event = None
    if die_at and die_at.startswith("event:"):
        n = int(die_at.split(":", 1)[1])

        def on_event(event: Any) -> None:
            if event.seq + 1 >= n:
                _die()

    result = run("Append the lines.", model=ScriptedModel(trial_script()), tools=trial_tools(counter, delay, die_at),
                 log=RunLog(log_path, on_event=on_event))
    print(result.stop.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
