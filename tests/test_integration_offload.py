"""A fenced step driven from sync code without an event loop (loopfence.integrations._offload, issue 22):
the blocking call it awaits runs on a worker thread up to its deadline, its value or exception comes
back in where it was awaited, past the deadline the step goes on without it, and a Ctrl-C cancels it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from loopfence._aio import Expired
from loopfence.integrations._offload import Offload, drive

FAR = 60.0  # a deadline no call here comes near


def _ident() -> int:
    return threading.get_ident()


def test_a_call_with_a_deadline_runs_on_a_worker_and_one_without_runs_right_here() -> None:
    async def step() -> tuple[int, int]:
        there = await Offload(_ident, (), time.monotonic() + FAR)
        here = await Offload(_ident, (), None)
        return there, here

    there, here = drive(step())
    assert here == threading.get_ident() and there != here


def test_values_and_exceptions_come_back_where_each_call_was_awaited() -> None:
    def fail(n: int) -> int:
        raise ValueError(f"bad {n}")

    async def step() -> list[Any]:
        seen: list[Any] = []
        for i in range(4):
            fn = fail if i % 2 else (lambda n: n * 10)
            try:
                seen.append(await Offload(fn, (i,), time.monotonic() + FAR))
            except ValueError as exc:
                seen.append(str(exc))
        return seen

    assert drive(step()) == [0, "bad 1", 20, "bad 3"]


def test_past_its_deadline_the_step_goes_on_without_the_call_which_finishes_unobserved() -> None:
    release, finished = threading.Event(), threading.Event()

    def hang() -> str:
        release.wait(30)
        finished.set()
        return "late"

    class Late(Exception):
        pass

    async def step(late: type[BaseException]) -> str:
        try:
            return await Offload(hang, (), time.monotonic() + 0.05, late)
        except late:
            return "went on"

    assert drive(step(Expired)) == "went on"  # Expired, unless the call names its own
    assert drive(step(Late)) == "went on"
    assert not finished.is_set()
    release.set()
    assert finished.wait(30)  # the worker ran it to its end, unobserved


def test_a_deadline_already_passed_starts_nothing() -> None:
    ran: list[int] = []

    async def step() -> str:
        try:
            await Offload(ran.append, (1,), time.monotonic() - 1)
        except Expired:
            return "expired"
        return "ran"

    assert drive(step()) == "expired" and ran == []


def test_a_ctrl_c_while_waiting_cancels_the_step_and_is_raised_on() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt  # as a Ctrl-C landing in the wait raises it

    seen: list[str] = []

    async def step() -> None:
        try:
            await Offload(interrupted, (), time.monotonic() + FAR)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(KeyboardInterrupt):
        drive(step())
    assert seen == ["cancelled"]


def test_awaiting_anything_but_an_offload_is_refused() -> None:
    async def step() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="outside an event loop"):
        drive(step())
