"""Issue 2 must-show 6: one canonical key per call, whatever the key order, spacing or defaults."""

from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from loopfence._contract import check_call
from loopfence._messages import ToolCall
from loopfence.tools import Registry, tool


def read_file(path: str, page: int = 1, encoding: str = "utf-8") -> str:
    return path


REG = Registry([tool(read_file, kind="read_only")])
texts = st.text(min_size=1, max_size=20)
pages = st.integers(min_value=1, max_value=10_000)
encodings = st.sampled_from(["utf-8", "latin-1", "ascii"])


def key(raw: str) -> str:
    checked = check_call(ToolCall("c", "read_file", raw), REG)
    assert hasattr(checked, "key"), checked
    return checked.key


def spaced(args: dict, seed: int) -> str:
    """The same object with its keys shuffled and random whitespace around the tokens."""
    rnd = random.Random(seed)
    items = list(args.items())
    rnd.shuffle(items)
    ws = lambda: rnd.choice(["", " ", "  ", "\n", "\t"])  # noqa: E731
    body = ",".join(f"{ws()}{json.dumps(k)}{ws()}:{ws()}{json.dumps(v)}{ws()}" for k, v in items)
    return f"{ws()}{{{body}}}{ws()}"


@given(texts, pages, encodings, st.integers())
def test_permutation_and_whitespace_give_one_key(path, page, enc, seed):
    args = {"path": path, "page": page, "encoding": enc}
    assert key(spaced(args, seed)) == key(json.dumps(args))


@given(texts, st.integers(), st.booleans(), st.booleans())
def test_defaults_filled_or_omitted_give_one_key(path, seed, with_page, with_enc):
    args = {"path": path}
    if with_page:
        args["page"] = 1
    if with_enc:
        args["encoding"] = "utf-8"
    assert key(spaced(args, seed)) == key(json.dumps({"path": path}))


@given(st.tuples(texts, pages, encodings), st.tuples(texts, pages, encodings))
def test_different_values_give_different_keys(a, b):
    ka = key(json.dumps(dict(zip(("path", "page", "encoding"), a))))
    kb = key(json.dumps(dict(zip(("path", "page", "encoding"), b))))
    assert (ka == kb) == (a == b)


def test_the_seed_001_spellings_are_one_call():
    spellings = ['{"path":"a.py"}', '{"path":"a.py","encoding":"utf-8"}', '{ "encoding": "utf-8", "path": "a.py" }']
    assert len({key(s) for s in spellings}) == 1
    assert key('{"path":"a.py"}') != key('{"path":"a.py","encoding":"latin-1"}')
