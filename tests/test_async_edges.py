"""The asyncio API at its edges: observers that fail, adapters that misbehave, streams left early,
cancels that are not the run's. Each run still ends named, counts truly and leaves a log that
reconciles."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from loopfence import Limits, Reply, ScriptedModel, StopReason, arun, run, stream, tool
from loopfence.runlog import reconcile
from loopfence.testing import calls_reply, text_reply, tool_call

UNREPEATED = Limits(max_repeats=None, max_identical_results=None, max_cycle_repeats=None)


def _reconciled(log: Path) -> list[dict[str, Any]]:
    rec = reconcile(log)
    assert rec.ok, [(c.name, c.detail) for c in rec.failed]
    return [json.loads(line) for line in log.read_text().splitlines()]


def _charges(n: int) -> tuple[ScriptedModel, list[int], Any]:
    done: list[int] = []

    async def charge(x: int) -> str:
        """a side effect"""
        done.append(x)
        await asyncio.sleep(0.05)
        return f"charged {x}"

    model = ScriptedModel([calls_reply(tool_call("charge", x=i)) for i in range(n)] + [text_reply("done")])
    return model, done, tool(charge)


# -- observers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("on", ["header", "request", "result", "stop"])
def test_an_on_event_that_raises_changes_nothing_but_a_warning(tmp_path: Path, on: str) -> None:
    model, done, charge = _charges(2)

    def observer(event: Any) -> None:
        if event.event == on:
            raise RuntimeError(f"observer failed on {on}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run("t", model=model, tools=[charge], log=tmp_path / "r.jsonl", on_event=observer)
    assert r.stop.reason is StopReason.FINAL_ANSWER and r.ledger.tool_executions == len(done) == 2
    assert [str(w.message) for w in caught if "event callback" in str(w.message)] == [
        f"loopfence: the run's event callback raised RuntimeError: observer failed on {on} (on a {on!r} event); "
        "the run goes on without it"]
    assert _reconciled(tmp_path / "r.jsonl")[-1]["event"] == "stop"


def test_an_async_on_event_is_refused_before_anything_runs(tmp_path: Path) -> None:
    async def observer(event: Any) -> None:
        pass

    with pytest.raises(TypeError, match="on_event must be a plain function"):
        run("t", model=ScriptedModel([text_reply("x")]), log=tmp_path / "r.jsonl", on_event=observer)
    assert not (tmp_path / "r.jsonl").exists()


# -- adapters ----------------------------------------------------------------------------------------
class _Late:
    """An async model that blocks the event loop (a sync call inside `async def`) past the deadline."""

    async def acomplete(self, request: Any) -> Reply:
        time.sleep(0.6)
        return Reply.from_response(text_reply("done"))

    def describe(self) -> dict[str, Any]:
        return {"kind": "late"}


def test_a_reply_that_comes_after_max_wall_seconds_is_not_used(tmp_path: Path) -> None:
    r = asyncio.run(arun("t", model=_Late(), limits=Limits(max_wall_seconds=0.3), log=tmp_path / "r.jsonl"))
    assert r.stop.reason is StopReason.MAX_WALL_SECONDS and r.final_answer is None
    assert "max_wall_seconds=0.3" in r.stop.detail
    _reconciled(tmp_path / "r.jsonl")


@pytest.mark.parametrize("value", [{"choices": []}, None, "done"])
def test_a_model_that_returns_no_reply_is_named_as_the_adapters_fault(tmp_path: Path, value: Any) -> None:
    class Odd:
        async def acomplete(self, request: Any) -> Any:
            return value

    r = asyncio.run(arun("t", model=Odd(), log=tmp_path / "r.jsonl"))
    assert r.stop.reason is StopReason.ENDPOINT_ERROR
    assert r.stop.detail == f"the model adapter returned {type(value).__name__}, not a Reply"
    _reconciled(tmp_path / "r.jsonl")


def test_a_cancel_inside_an_async_tool_is_the_tools_failure_not_the_runs(tmp_path: Path) -> None:
    async def fetch(url: str) -> str:
        """awaits a job some other part of the program cancels"""
        job = asyncio.get_running_loop().create_task(asyncio.sleep(10))
        asyncio.get_running_loop().call_later(0.02, job.cancel)
        await job
        return "page"

    model = ScriptedModel([calls_reply(tool_call("fetch", url="http://x")), text_reply("done")])
    r = asyncio.run(arun("t", model=model, tools=[tool(fetch)], log=tmp_path / "r.jsonl"))
    assert r.stop.reason is StopReason.FINAL_ANSWER and r.ledger.tool_executions == 1
    result = next(e for e in _reconciled(tmp_path / "r.jsonl") if e["event"] == "result")
    assert result["ok"] is False and "CancelledError" in result["content"]


# -- streams left early ------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["break", "raise", "async with", "timeout"])
def test_leaving_an_async_stream_early_cancels_the_run(tmp_path: Path, how: str) -> None:
    model, done, charge = _charges(7)
    log = tmp_path / "r.jsonl"

    async def main() -> int:
        def s() -> Any:
            return stream("t", model=model, tools=[charge], log=log, limits=UNREPEATED)

        try:
            if how == "async with":
                async with s() as events:
                    async for e in events:
                        if e.event == "call":
                            break
            elif how == "timeout":
                async with asyncio.timeout(0.08):
                    async for e in s():
                        pass
            else:
                async for e in s():  # the stream is held by the loop only
                    if e.event == "call":
                        if how == "break":
                            break
                        raise ValueError("the consumer failed")
        except (ValueError, TimeoutError):
            pass
        gc.collect()
        left = len(done)
        for _ in range(100):  # the run ends at its next await
            await asyncio.sleep(0.01)
            if '"event":"stop"' in log.read_text().rstrip().rsplit("\n", 1)[-1]:
                break
        assert len(done) == left  # nothing ran after the consumer left
        return left

    left = asyncio.run(main())
    events = _reconciled(log)
    assert events[-1]["reason"] == "cancelled" and left <= 2


def test_a_streams_on_event_is_called_too(tmp_path: Path) -> None:
    seen: list[str] = []

    async def main() -> list[str]:
        s = stream("t", model=ScriptedModel([text_reply("x")]), log=tmp_path / "r.jsonl",
                   on_event=lambda e: seen.append(e.event))
        return [e.event async for e in s]

    assert asyncio.run(main()) == seen == ["header", "request", "reply", "stop"]


def test_aclose_passes_on_a_cancel_meant_for_its_caller(tmp_path: Path) -> None:
    model, _, charge = _charges(5)

    async def main() -> str:
        s = stream("t", model=model, tools=[charge], log=tmp_path / "r.jsonl", limits=UNREPEATED)
        async for e in s:
            if e.event == "call":
                break

        async def shutdown() -> None:
            await s.aclose()

        task = asyncio.ensure_future(shutdown())
        await asyncio.sleep(0)
        task.cancel()  # the caller of aclose() is cancelled while it waits
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "finished"

    assert asyncio.run(main()) == "cancelled"
