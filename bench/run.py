"""Benchmarks: loopfence against the frameworks people would pick instead.

    python bench/run.py                       # everything; writes bench/RESULTS.md
    python bench/run.py --quick               # small sizes, prints the report (the test suite runs this)
    python bench/run.py --only overhead,stream --frameworks loopfence
    python bench/run.py --json out.json       # the numbers as JSON too

Peers (bench/requirements.txt) are installed only in bench's own virtual environment; a framework
that is not installed is reported and skipped.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.pop("OPENAI_API_KEY", None)  # nothing here may reach a real endpoint (or trace exporter)

from bench.frameworks import ALL, available  # noqa: E402
from bench.report import Section, load_average, machine, table  # noqa: E402
from bench.sections import SECTIONS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--frameworks", default=",".join(ALL), help=f"comma list of {', '.join(ALL)}")
    p.add_argument("--quick", action="store_true", help="small sizes: checks that it runs, not numbers")
    p.add_argument("--out", help="write the report here (default: bench/RESULTS.md for a full run, "
                                 "stdout otherwise)")
    p.add_argument("--json", help="also write the numbers as JSON here")
    args = p.parse_args(argv)
    args.only = _pick(args.only, SECTIONS, "--only")
    args.frameworks = _pick(args.frameworks, ALL, "--frameworks")
    return args


def _pick(text: str, known: list[str], flag: str) -> list[str]:
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise SystemExit(f"{flag}: unknown {unknown[0]!r} (known: {', '.join(known)})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    found = available(args.frameworks)
    frameworks = {n: m for n, m in found.items() if not isinstance(m, str)}
    missing = {n: why for n, why in found.items() if isinstance(why, str)}
    started = time.monotonic()
    header = _header(args, frameworks, missing)
    sections: list[Section] = []
    for name in args.only:
        t0 = time.monotonic()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        sections.append(_run_section(name, frameworks, args.quick))
        print(f"[bench] {name} done in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    load = load_average()
    text = "\n\n".join([header, *(f"## {s.title}\n\n{s.markdown}" for s in sections),
                        f"_Total bench time: {time.monotonic() - started:.0f} s; load average at the "
                        f"end: {load} on {os.cpu_count()} cores (shared machines make timings noisy)._\n"])
    out = args.out or (str(RESULTS) if not args.quick and args.only == SECTIONS else None)
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"[bench] wrote {out}", file=sys.stderr)
    else:
        print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({s.title: s.data for s in sections}, indent=1, default=str),
                                   encoding="utf-8")
    return 0


def _run_section(name: str, frameworks: dict, quick: bool) -> Section:
    return importlib.import_module(f"bench.sections.{name}").run(frameworks, quick)


def _header(args: argparse.Namespace, frameworks: dict, missing: dict[str, str]) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mode = "quick (small sizes; not for quoting)" if args.quick else "full"
    rows = [[k, v] for k, v in machine().items()]
    versions = [[fw.NAME, fw.version()] for fw in frameworks.values()]
    versions += [[n, why] for n, why in missing.items()]
    versions += [[dist, _dist(dist)] for dist in ("openai", "pydantic", "httpx")]
    return "\n\n".join([
        "# loopfence benchmarks", f"Generated {when} by `make bench` (`python bench/run.py`); mode: {mode}.",
        "Machine:", table(["", ""], rows), "Versions:", table(["package", "version"], versions)])


def _dist(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    raise SystemExit(main())
