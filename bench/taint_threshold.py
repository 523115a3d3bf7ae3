"""How the taint fingerprint's (shingle, match) choice trades missed excerpts against matches of
unrelated text: `python bench/taint_threshold.py` (reads HTML pages under /usr/share/doc, this
repository's sources, Python's standard library, and the recorded tool results of the real runs in
/work/shared/fixtures/real-runs or tests/data/real-runs). Besides plain excerpts it sends each
page's excerpt through the cheap transforms of issue 31 (the real commands: sed, awk, base64, rev,
tr, xxd, od) and counts how many are still caught. Runs against whichever loopfence is imported, so
`PYTHONPATH=<old checkout>/src` gives the "before" column. Results and the choice:
tests/data/taint-threshold.md."""

from __future__ import annotations

import collections
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys

try:
    from loopfence.tools import _fingerprint as fp  # the normalised shingles (issue 31)
except ImportError:  # an older checkout: shingles lived in _provenance
    from loopfence.tools import _provenance as fp  # type: ignore[no-redef]
from loopfence.tools._html import html_to_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (8, 10, 12, 15, 20)
TRANSFORMS = {
    "sed s/ /_/g": ["sed", "s/ /_/g"],
    "awk numbering": ["awk", '{for (i = 1; i <= NF; i++) print i": "$i}'],
    "base64": ["base64"],
    "rev": ["rev"],
    "tr a-z n-za-m": ["tr", "a-z", "n-za-m"],
    "xxd": ["xxd"],
    "od -c": ["od", "-c"],
}


def real_run_results() -> list[str]:
    folder = next((d for d in ("/work/shared/fixtures/real-runs", f"{ROOT}/tests/data/real-runs")
                   if os.path.isdir(d)), None)
    out: list[str] = []
    for path in sorted(glob.glob(f"{folder}/*.json")) if folder else ():
        with open(path) as fh:
            scenario = json.load(fh)
        for t in scenario.get("canned_tools", {}).values():
            out += [r if isinstance(r, str) else json.dumps(r) for r in t.get("results", [])]
    return out


def transformed(excerpts: list[str]) -> dict[str, list[str]]:
    """Each excerpt through each transform's real command (skipped where the command is missing)."""
    out: dict[str, list[str]] = {}
    for name, argv in TRANSFORMS.items():
        if shutil.which(argv[0]) is None:
            continue
        out[name] = [subprocess.run(argv, input=e.encode() + b"\n", capture_output=True, check=True)
                     .stdout.decode(errors="replace") for e in excerpts]
    return out


def main() -> None:
    pages = [p for p in glob.glob("/usr/share/doc/**/*.html", recursive=True) if os.path.isfile(p)][:300]
    others = [p for p in glob.glob(f"{ROOT}/src/**/*.py", recursive=True) + glob.glob(f"{ROOT}/tests/**/*.py",
              recursive=True) + glob.glob("/usr/lib/python3*/**/*.py", recursive=True)[:3000] if os.path.isfile(p)]
    raw = {p: open(p, errors="replace").read() for p in pages}
    text = {p: html_to_text(t).text for p, t in raw.items()}
    unrelated = [open(p, errors="replace").read() for p in others]
    ours = sum(1 for p in others if p.startswith(ROOT))
    outputs = real_run_results()
    random.seed(1)
    excerpts: dict[int, list[str]] = collections.defaultdict(list)
    for p in pages:
        words = re.findall(r"\S+", text[p])
        if len(words) < 40:
            continue
        for n in SIZES:
            i = random.randrange(len(words) - n)
            excerpts[n].append(" ".join(words[i:i + n]))
    shapes = transformed(excerpts[20])
    print(f"{len(pages)} pages, {len(excerpts[20])} with 40+ words; {len(unrelated)} unrelated files; "
          f"{len(outputs)} real-run tool results; module {fp.__name__} ({fp.__file__})")
    for shingle, match in ((6, 2),) if "--chosen" in sys.argv else ((6, 2), (8, 2), (8, 3), (10, 2)):
        fp.SHINGLE, fp.MATCH = shingle, match
        fp._boilerplate.cache_clear()
        prints = fp.Fingerprints()
        for p in pages:
            prints.add(p, raw[p])
            prints.add(p, text[p])
        hits = [bool(prints.match(t)) for t in unrelated]
        fp_files, fp_ours = sum(hits), sum(hits[:ours])
        fp_runs = sum(1 for t in outputs if prints.match(json.dumps({"stdout": t})))
        tp = {n: sum(prints.match(json.dumps({"stdout": e})) is not None for e in excerpts[n]) for n in SIZES}
        print(f"{shingle}/{match}: unrelated files matched {fp_files} of {len(unrelated)} ({fp_ours} of this "
              f"repository's {ours}); real-run results "
              f"matched {fp_runs} of {len(outputs)}; excerpts caught: "
              + ", ".join(f"{n} words {tp[n] / len(excerpts[n]):.0%}" for n in SIZES))
        if (shingle, match) == (6, 2):
            caught = {name: sum(prints.match(json.dumps({"stdout": o})) is not None for o in outs)
                      for name, outs in shapes.items()}
            print("  20-word excerpts through a transform, caught: "
                  + ", ".join(f"{name} {k / len(excerpts[20]):.0%}" for name, k in caught.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
