"""How the taint fingerprint's (shingle, match) choice trades missed excerpts against matches of
unrelated files: `python bench/taint_threshold.py` (reads HTML pages under /usr/share/doc).
Results and the choice: tests/data/taint-threshold.md."""

from __future__ import annotations

import collections
import glob
import json
import os
import random
import re

from loopfence.tools import _provenance as prov
from loopfence.tools._html import html_to_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    pages = [p for p in glob.glob("/usr/share/doc/**/*.html", recursive=True) if os.path.isfile(p)][:300]
    others = [p for p in glob.glob(f"{ROOT}/src/**/*.py", recursive=True) + glob.glob(f"{ROOT}/tests/**/*.py",
              recursive=True) + glob.glob("/usr/lib/python3*/**/*.py", recursive=True)[:3000] if os.path.isfile(p)]
    raw = {p: open(p, errors="replace").read() for p in pages}
    text = {p: html_to_text(t).text for p, t in raw.items()}
    unrelated = [open(p, errors="replace").read() for p in others]
    for shingle, match in ((6, 2), (8, 2), (8, 3), (10, 2)):
        prov.SHINGLE, prov.MATCH = shingle, match
        prov._boilerplate.cache_clear()
        prints = prov.Fingerprints()
        for p in pages:
            prints.add(p, raw[p])
            prints.add(p, text[p])
        fp = sum(1 for t in unrelated if prints.match(t))
        random.seed(1)
        tp: collections.Counter[int] = collections.Counter()
        tried = 0
        for p in pages:
            words = re.findall(r"\S+", text[p])
            if len(words) < 40:
                continue
            tried += 1
            for n in (8, 10, 12, 15, 20):
                i = random.randrange(len(words) - n)
                tp[n] += prints.match(json.dumps({"stdout": " ".join(words[i:i + n])})) is not None
        print(f"{shingle}/{match}: {fp} of {len(unrelated)} unrelated files match; excerpts caught: "
              + ", ".join(f"{n} words {tp[n] / tried:.0%}" for n in (8, 10, 12, 15, 20)))


if __name__ == "__main__":
    main()
