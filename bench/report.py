"""Markdown pieces for RESULTS.md: tables, the machine, the versions."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["QUIET_LOAD", "Section", "load_average", "load_note", "machine", "met", "table"]

QUIET_LOAD = 1.0  # ratios are judged only from a run whose 1-minute load average stayed under this


@dataclass
class Section:
    title: str
    markdown: str
    data: dict[str, Any] = field(default_factory=dict)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu,
            "cores": str(os.cpu_count()), "load average at start": load_average()}


def met(ok: bool) -> str:
    """A goal's verdict, as the report writes it."""
    return "met" if ok else "**NOT met**"


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as text ("n/a" where the OS has none)."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def load_note(start: str, end: str) -> str:
    """The load averages at a section's start and end, and whether its ratios may be judged."""
    ones = [float(x.split(",")[0]) for x in (start, end) if x != "n/a"]
    verdict = ("quiet enough to judge the ratios" if ones and max(ones) < QUIET_LOAD else
               "**too busy to judge the ratios: rerun on a quiet machine**" if ones else "unknown")
    return (f"Load average (1, 5, 15 min) at the start of this section: {start}; at the end: {end} on "
            f"{os.cpu_count()} cores. The ratios are to be judged with the 1-minute load under {QUIET_LOAD:g}: "
            f"{verdict}.")
