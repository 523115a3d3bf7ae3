"""The JSON boundary's fast paths against the stdlib, for any value (lone surrogates, huge numbers):
a log line (`_json.line`, pydantic-core's serializer with the stdlib behind it) reads back as `dumps`
writes it; the C encoder that canonical_json and dumps reuse writes byte for byte what a fresh
stdlib encoder writes; `loads`, which skips the depth walk when the text has too few brackets,
refuses exactly what nests deeper than its limit."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence._json import (
    MAX_LOG_DEPTH,
    JsonLimitError,
    _canonical,
    _plain,
    canonical_json,
    depth,
    dumps,
    line,
    loads,
)

_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20)  # surrogates too
_scalars = st.none() | st.booleans() | st.integers(min_value=-(10**60), max_value=10**60) | \
    st.floats(allow_nan=False) | _text
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) |
                       st.dictionaries(_text, inner, max_size=4), max_leaves=20)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, _values, max_size=5))
def test_a_line_reads_back_as_the_stdlib_writes_it(record: dict) -> None:
    data = line(record)
    assert data.endswith(b"\n") and data.count(b"\n") == 1  # one line, whatever the strings hold
    back = loads(data.decode("utf-8"), max_depth=MAX_LOG_DEPTH)
    assert _same(back, loads(dumps(record), max_depth=MAX_LOG_DEPTH))


def test_a_lone_surrogate_and_non_finite_numbers_are_written_as_dumps_writes_them() -> None:
    record = {"s": "a\ud800b", "n": float("inf"), "big": 10**400}
    assert loads(line(record)) == loads(dumps(record))
    assert b"\\ud800" in line(record)  # escaped: the line is valid UTF-8


_any = st.recursive(_scalars | st.floats() | st.tuples(st.integers()) | st.sets(st.integers(), max_size=2),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4) |
                    st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=3), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(_any)
def test_the_reused_encoders_write_what_a_fresh_stdlib_encoder_writes(value: object) -> None:
    """canonical_json and dumps reuse one C encoder: byte for byte what json.dumps writes (NaN, sets
    through `default`, non-string keys, surrogates), and what it raises it still raises."""
    try:
        want = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except TypeError:  # keys of mixed types cannot be sorted: the same error either way
        with pytest.raises(TypeError):
            _canonical(value)
    else:
        assert _canonical(value) == want
    assert _plain(value) == json.dumps(value, ensure_ascii=False, default=str)


def test_a_cycle_is_still_refused_as_json_dumps_refuses_it() -> None:
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json({"a": loop})
    assert canonical_json({"b": [1, 2.5], "a": 3.0}) == '{"a":3,"b":[1,2.5]}'  # and it goes on working


_nested = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) |
                       st.dictionaries(st.sampled_from(["a", "[", "{"]), inner, max_size=3), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(_nested, st.integers(min_value=0, max_value=8))
def test_loads_refuses_exactly_what_nests_deeper_than_its_limit(value: object, limit: int) -> None:
    """`loads` skips the walk when the text holds too few brackets to nest past the limit: it must
    still refuse every value deeper than `max_depth`, and only those."""
    text = json.dumps(value)
    if depth(value) > limit:
        with pytest.raises(JsonLimitError, match=f"the limit is {limit}"):
            loads(text, max_depth=limit)
    else:
        assert _same(loads(text, max_depth=limit), json.loads(text))


_numbers_and_text = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**1100), max_value=10**1100) |
    st.floats(allow_nan=True) | st.sampled_from([1e308 * 10, "\ud800", "\ufeff", "a\x00b"]) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(_numbers_and_text, st.booleans(), st.sampled_from(["", "\ufeff", " "]), st.booleans(), st.booleans())
def test_the_fast_parse_reads_what_the_stdlib_reads_and_leaves_no_bound(value: object, strict: bool, lead: str,
                                                                      ascii: bool, as_bytes: bool) -> None:
    """`loads(deep=False)` (pydantic-core's parser, the stdlib's behind it) gives the stdlib's value
    for any text, refuses what it refuses (NaN when strict), and leaves no bound unchecked: with
    `check_depth` after it, an integer past MAX_INT_DIGITS digits is refused as `loads` refuses it."""
    from loopfence._json import check_depth

    text = lead + json.dumps(value, ensure_ascii=ascii)
    data: str | bytes = text
    if as_bytes:
        try:
            data = text.encode("utf-8")  # (a body's bytes; a lone surrogate cannot be UTF-8: read as text)
        except UnicodeEncodeError:
            pass
    try:
        expected = loads(data, strict=strict, max_depth=10_000)
    except ValueError as exc:
        with pytest.raises(ValueError) as refused:
            check_depth(loads(data, strict=strict, deep=False), 10_000)
        assert type(refused.value) is type(exc)  # (the limit's message may name another of the long integers)
        assert str(refused.value).split(" with ")[0] == str(exc).split(" with ")[0]
        return
    got = loads(data, strict=strict, deep=False)
    assert _same(got, expected)
    check_depth(got, 10_000)


def test_a_long_integer_read_fast_is_still_refused_by_the_check() -> None:
    from loopfence._json import MAX_INT_DIGITS, check_depth

    for digits in (MAX_INT_DIGITS + 1, 4_300, 5_000):
        got = loads('{"n": [' + "9" * (digits - 1) + "1]}", strict=True, deep=False) if digits <= 4_300 else None
        if got is not None:
            with pytest.raises(JsonLimitError, match=f"an integer with {digits:,} digits"):
                check_depth(got)
        else:
            with pytest.raises(JsonLimitError, match=f"an integer with {digits:,} digits"):
                loads('{"n": ' + "1" * digits + "}", strict=True, deep=False)
    check_depth(loads("-" + "9" * MAX_INT_DIGITS, deep=False))  # the longest allowed
