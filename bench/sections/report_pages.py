"""`loopfence report` pages at size: the run page of a 500-step log and the batch page of 5,000
episodes (issue 17, must-show 4): time to write them, file size, and load time in headless Chromium
(Debian's /usr/bin/chromium driven by Playwright: the navigation's loadEventEnd, and for the batch
page the time one click on a column takes to sort every row).

    python -m bench.sections.report_pages [--quick]      # alone (bench/sections/__init__.py's
                                                         # SECTIONS lists the sections run.py runs)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..report import Section, table

TITLE = "Report pages"
CHROMIUM = "/usr/bin/chromium"
FULL = {"steps": 500, "episodes": 5_000}
QUICK = {"steps": 50, "episodes": 200}
STOPS = [("final_answer", "SHIP")] * 6 + [("max_steps", "KILL"), ("repeated_call", "KILL"), ("no_progress", "KILL")]


def _long_log(path: Path, steps: int) -> Path:
    from loopfence import Limits, RunLog, ScriptedModel, run, tool
    from loopfence.testing import calls_reply, text_reply, tool_call

    def probe(n: int) -> str:
        """Answer with a line about n."""
        return f"probe {n}: " + "status ok; " * (n % 7 + 1)

    replies = [calls_reply(tool_call("probe", n=i), usage=(400 + 60 * i, 25 + i % 40)) for i in range(steps - 1)]
    run("probe many times", model=ScriptedModel([*replies, text_reply("done")]), tools=[tool(probe, kind="read_only")],
        limits=Limits(max_steps=None, max_tool_calls=None, max_prompt_tokens=None, max_completion_tokens=None,
                      max_wall_seconds=None), log=RunLog(path))
    return path


def _batch(folder: Path, n: int, log: Path) -> Path:
    (folder / "episodes").mkdir(parents=True)
    rows = []
    for i in range(n):
        stop, verdict = STOPS[i % len(STOPS)]
        ident = f"ep-{i:05d}"
        shutil.copyfile(log, folder / "episodes" / f"{ident}.jsonl")
        rows.append({"id": ident, "stop": stop, "verdict": verdict, "detail": "", "requests": 1 + i % 12,
                     "executions": i % 5, "reuses": i % 3, "refusals": 0, "rejections": 0,
                     "prompt_tokens": 100 + (i * 7919) % 90_000, "completion_tokens": 5 + i % 400,
                     "tokens": 105 + (i * 7919) % 90_000 + i % 400, "seconds": (i % 97) / 10, "metadata": {},
                     "attempts": 1, "log": f"episodes/{ident}.jsonl"})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps({"format": "loopfence.batch", "version": 1, "episodes": n}),
                                         encoding="utf-8")
    return folder


def _load(pages: dict[str, Path]) -> dict[str, dict[str, float]] | str:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing (make chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "playwright not installed"
    out: dict[str, dict[str, float]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        for name, path in pages.items():
            page = browser.new_page()
            page.goto(path.resolve().as_uri(), wait_until="load")
            nav = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
            row = {"load_ms": round(nav, 1)}
            if page.locator("#episodes").count():
                row["sort_ms"] = round(page.evaluate(
                    "(() => { const th = [...document.querySelectorAll('#episodes th')]"
                    ".find(h => h.textContent.startsWith('tokens')); const t0 = performance.now(); th.click();"
                    " return performance.now() - t0; })()"), 1)
            out[name] = row
            page.close()
        browser.close()
    return out


def run(frameworks: dict[str, Any] | None = None, quick: bool = False) -> Section:
    from loopfence._report import write_dir_report, write_run_report

    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="loopfence-bench-report-") as tmp:
        root = Path(tmp)
        log = _long_log(root / "long.jsonl", size["steps"])
        small = _long_log(root / "small.jsonl", 3)
        t0 = time.perf_counter()
        run_page = write_run_report(log)
        run_s = time.perf_counter() - t0
        folder = _batch(root / "job", size["episodes"], small)
        t0 = time.perf_counter()
        index = write_dir_report(folder, episode_pages=False)
        batch_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_dir_report(folder)
        pages_s = time.perf_counter() - t0
        loads = _load({"run": run_page, "batch": index})
        sizes = {"run": run_page.stat().st_size, "batch": index.stat().st_size}
    data: dict[str, Any] = {"steps": size["steps"], "episodes": size["episodes"], "bytes": sizes,
                            "write_s": {"run": round(run_s, 3), "batch": round(batch_s, 3),
                                        "batch_with_episode_pages": round(pages_s, 3)},
                            "chromium": loads}
    ok = isinstance(loads, dict)
    rows = [[f"run page, {size['steps']:,} steps", f"{sizes['run'] / 1024:,.0f} KiB", f"{run_s:.2f}",
             f"{loads['run']['load_ms']:,.0f}" if ok else loads, "–"],
            [f"batch page, {size['episodes']:,} episodes", f"{sizes['batch'] / 1024:,.0f} KiB",
             f"{batch_s:.2f} ({pages_s:.1f} with every episode's page)",
             f"{loads['batch']['load_ms']:,.0f}" if ok else loads,
             f"{loads['batch'].get('sort_ms', 0):,.0f}" if ok else "–"]]
    md = ("Self-contained pages (inline CSS, script and SVG). Load: the navigation's loadEventEnd in "
          "headless Chromium; sort: one click on the tokens column of the episodes table.\n\n"
          + table(["page", "size", "write (s)", "load (ms)", "sort (ms)"], rows))
    return Section(TITLE, md, data)


if __name__ == "__main__":
    section = run(quick="--quick" in sys.argv)
    print(f"## {section.title}\n\n{section.markdown}")
