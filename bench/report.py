"""Markdown pieces for RESULTS.md: tables, the machine, the versions."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Section", "table", "machine"]


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
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu,
            "cores": str(os.cpu_count()), "load average at start": load}  # 1, 5, 15 minutes
