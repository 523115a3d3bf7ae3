"""A copy of the guards (the proxy checks a reply's calls on one, `precheck`) is cheap and owns its
state: the built-in guards whose state is their settings are shared, the repetition guards copy their
small state, and a guard from elsewhere is copied whole, as deepcopy copies it."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopfence._guards import Guard, RepeatedCall, RepeatedCycle, RepeatedResult, StepLimit, _Settled, default_guards
from loopfence._limits import Limits
from loopfence._repeats import CycleTrail, RepeatCounts

KEYS = st.sampled_from(["a", "b", "c"])
OPS = st.lists(st.one_of(st.tuples(st.just("ask"), st.frozensets(KEYS)), st.tuples(st.just("change"), KEYS),
                         st.tuples(st.just("reply"), KEYS), st.tuples(st.just("streak"), KEYS),
                         st.tuples(st.just("trail"), KEYS, KEYS)), max_size=12)


def _of(guards: Any, kind: type) -> Any:
    return next(g for g in guards.guards if type(g) is kind)


def _apply(guards: Any, ops: list[tuple[Any, ...]]) -> None:
    calls, results, cycles = _of(guards, RepeatedCall), _of(guards, RepeatedResult), _of(guards, RepeatedCycle)
    for op, *args in ops:
        if calls.counts is None:
            calls.counts = RepeatCounts("change")
        if cycles.early is None:
            cycles.early = CycleTrail(2)
        if op == "ask":
            calls.counts.asked(args[0])
        elif op == "change":
            calls.counts.changed(args[0])
        elif op == "reply":
            calls.reply_keys.setdefault(args[0], f"call {args[0]}")
        elif op == "streak":
            results.streak.add(args[0])
        else:
            cycles.trail.add(*args)
            cycles.early.add(*args)


def _state(guards: Any) -> Any:
    calls, results, cycles = _of(guards, RepeatedCall), _of(guards, RepeatedResult), _of(guards, RepeatedCycle)
    return (None if calls.counts is None else dict(calls.counts.counts), dict(calls.reply_keys),
            (results.streak.last, results.streak.length), list(cycles.trail.recent),
            None if cycles.early is None else list(cycles.early.recent))


@settings(max_examples=200, deadline=None)
@given(OPS, OPS)
def test_a_copy_starts_where_the_guards_are_and_goes_on_alone(before: list[Any], after: list[Any]) -> None:
    guards = default_guards(Limits.coding())
    _apply(guards, before)
    then = _state(guards)
    sim = copy.deepcopy(guards)
    assert _state(sim) == then
    _apply(sim, after)
    assert _state(guards) == then  # the copy's calls changed nothing of the run's
    _apply(guards, after)
    assert _state(guards) == _state(sim)  # and it went on as the guards themselves would


class Counting(StepLimit):
    """A guard from elsewhere, built on a settled one, with state of its own."""

    def __init__(self) -> None:
        super().__init__(3)
        self.seen: list[str] = []


class Stateful(Guard):
    def __init__(self) -> None:
        self.seen: list[str] = []


class Remembering(RepeatedCall):
    """A repetition guard subclassed elsewhere, with state of its own."""

    def __init__(self) -> None:
        super().__init__(3)
        self.seen: list[str] = []


def test_settled_guards_are_shared_and_a_guard_from_elsewhere_is_copied_whole() -> None:
    kept = Stateful()
    guards = default_guards(Limits.coding(), [Counting(), Stateful(), Remembering(), kept])
    guards.name = "mine"
    sim = copy.deepcopy(guards, {id(kept): kept})
    pairs = list(zip(guards.guards, sim.guards, strict=True))
    assert any(a is b for a, b in pairs if type(a) is StepLimit)
    for a, b in pairs:
        if type(a) in (Counting, Stateful, Remembering) and a is not kept:
            assert a is not b and a.seen is not b.seen and a.seen == b.seen
        if type(a) in (RepeatedCall, RepeatedResult, RepeatedCycle):
            assert a is not b
    assert sim.guards[-1] is kept  # what the memo names stays shared
    assert [type(g) for g in sim.guards] == [type(g) for g in guards.guards]
    assert sim.name == "mine" and sim.before_execution.__self__ is sim  # its own phases, bound to the copy
    assert all(m.__self__ is g for m, g in zip(sim._after_execution, [g for g in sim.guards if type(g).after_execution
                                                                     is not Guard.after_execution], strict=True))


@settings(max_examples=200, deadline=None)
@given(OPS, OPS, st.booleans())
def test_a_trial_copies_what_it_asks_and_shares_only_guards_it_never_asks(before: list[Any], after: list[Any],
                                                                         both: bool) -> None:
    """The proxy tries a reply's calls on `trial`: every guard watching a phase the trial asks
    (before_execution; after_execution too when `both`) is its own copy there, and goes on alone as
    the guards themselves would; a guard watching neither is the run's own (never asked, never changed)."""
    guards = default_guards(Limits.coding(), [Counting(), Stateful(), Remembering()])
    _apply(guards, before)
    then = _state(guards)
    sim = guards.trial({}, both)
    asked = ("before_execution", "after_execution") if both else ("before_execution",)
    for g, t in zip(guards.guards, sim.guards, strict=True):
        watches = any(getattr(type(g), p) is not getattr(Guard, p) for p in asked)
        settled = isinstance(g, _Settled) and type(g).__module__ == _Settled.__module__  # (its copy: itself)
        assert (t is not g) == (watches and not settled), (type(g).__name__, watches)
    if both:  # the repetition guards' state, copied and going on alone
        assert _state(sim) == then
        _apply(sim, after)
        assert _state(guards) == then
        _apply(guards, after)
        assert _state(guards) == _state(sim)
    else:  # RepeatedCall, the built-in with state that before_execution reads and writes, goes on alone
        theirs = [op for op in after if op[0] in ("ask", "change", "reply")]
        assert _state(sim)[:2] == then[:2]
        _apply(sim, theirs)
        assert _state(guards)[:2] == then[:2]
        _apply(guards, theirs)
        assert _state(guards)[:2] == _state(sim)[:2]
    assert sim.before_execution.__self__ is sim and all(
        m.__self__ in sim.guards for m in sim._before_execution + sim._after_execution)
