"""Limits and Policy are checked when they are built, with messages naming the field (issue 20)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopfence import Limits, Policy
from loopfence._limits import parse_limit

NUMBERS = [f.name for f in dataclasses.fields(Limits) if f.name != "no_progress"]


def test_a_limit_given_as_text_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"limit max_steps must be a number or None .*got '5'"):
        Limits(max_steps="5")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NUMBERS)
def test_a_negative_limit_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(ValueError, match=rf"limit {name} must be >= 0, got -1"):
        Limits(**{name: -1})


@pytest.mark.parametrize(("changes", "message"), [
    ({"max_steps": 2.5}, "limit max_steps must be a whole number, got 2.5"),
    ({"max_wall_seconds": float("nan")}, "limit max_wall_seconds must be a finite number"),
    ({"max_cost_usd": True}, "limit max_cost_usd must be a number or None"),
    ({"no_progress": 1}, "limit no_progress must be true or false"),
    ({"max_cycle_repeats": 1}, "limit max_cycle_repeats must be at least 2"),
    ({"max_tokens_per_request": 0}, "limit max_tokens_per_request must be at least 1"),
])
def test_replace_is_checked_as_the_constructor_is(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Limits().replace(**changes)


def test_none_stays_unlimited_and_a_whole_float_is_a_count() -> None:
    limits = Limits(max_steps=None, max_tool_calls=5.0, max_wall_seconds=3)
    assert limits.max_steps is None
    assert limits.max_tool_calls == 5 and type(limits.max_tool_calls) is int
    assert limits.max_wall_seconds == 3.0 and type(limits.max_wall_seconds) is float


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"on_bad_call": "ignore"}, "policy on_bad_call must be 'fail' or 'feedback', got 'ignore'"),
    ({"max_bad_calls": 0}, "policy max_bad_calls must be a positive integer"),
    ({"max_bad_calls": "2"}, "policy max_bad_calls must be a positive integer"),
    ({"repeat_scope": "forever"}, "policy repeat_scope must be 'change' or 'run'"),
    ({"nudge": "yes"}, "policy nudge must be true or false"),
    ({"last_answer": 1}, "policy last_answer must be true or false"),
])
def test_policy_fields_are_checked_when_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy(**kwargs)
    with pytest.raises(ValueError, match=message):  # and read from JSON (a batch line, a drill file)
        Policy.from_json(kwargs)


JSONISH = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=5))


@given(name=st.sampled_from(NUMBERS), value=JSONISH)
def test_a_limit_is_refused_by_name_or_reads_back_the_same_every_way(name: str, value: Any) -> None:
    """Built from Python, from JSON or from `--limit NAME=VALUE`: one rule. A refusal names the
    field; an accepted value reads back equal through to_json/from_json and the flag's text."""
    try:
        built = Limits(**{name: value})
    except ValueError as exc:
        assert f"limit {name} " in str(exc)
        with pytest.raises(ValueError):
            Limits.from_json({name: value})
        return
    assert Limits.from_json(built.to_json()) == built
    shown = getattr(built, name)
    assert parse_limit(f"{name}={'none' if shown is None else repr(shown)}") == (name, shown)
