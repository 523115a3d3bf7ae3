"""The adapter conformance kit (loopfence.testing.check_model / check_tool): our own adapters pass
it, and it catches the adapters that break the rules, naming the check."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from _local_support import needs_local_model
from loopfence import Request, StopReason
from loopfence._stops import StopError
from loopfence.models import OpenAIModel, ScriptedModel, Timeouts
from loopfence.testing import FakeServer, check_model, check_tool, text_reply
from loopfence.tools import Tool, tool, workspace_tools

OK = text_reply("hi", usage=(3, 1))
FAST = Timeouts(connect=2, read=2, write=2, pool=2)
CHUNK = {"choices": [{"index": 0, "delta": {"content": "a"}}]}
SLOW = Request([{"role": "user", "content": "hi"}], [], {"slow": True})  # the test models below take long on it


# -- our adapters pass -------------------------------------------------------------------------
def test_scripted_model_conforms() -> None:
    report = check_model(ScriptedModel([OK]), slow=ScriptedModel([OK], delay_s=30), failing=[
        ScriptedModel([OK], offset=1, repeat_last=False),  # exhausted
        ScriptedModel([{"choices": [{"index": 0}]}])])  # a reply without a message
    print(report)
    assert report.passed == ["protocol", "complete", "acomplete", "cancel", "deadline", "failures #1", "failures #2"]


@pytest.fixture
def servers() -> Iterator[dict[str, FakeServer]]:
    forms = {"ok": [OK], "stall": [{"fault": "stall", "delay_s": 30}], "500": [{"fault": "server_error"}],
             "garbage": [{"fault": "invalid_json"}], "overflow": [{"fault": "overflow", "shape": "vllm"}],
             "close": [{"fault": "close"}], "cut": [{"fault": "missing_done", "chunks": [CHUNK]}]}
    with ExitStack() as stack:
        yield {k: stack.enter_context(FakeServer(v)) for k, v in forms.items()}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_model_conforms_against_the_fake_server(servers: dict[str, FakeServer], stream: bool) -> None:
    def model(url: str) -> OpenAIModel:
        return OpenAIModel(url, "fake", stream=stream, max_retries=1, backoff_base=0.01, timeout=FAST)

    failing = [model(servers[k].base_url) for k in ("500", "garbage", "overflow", "close", "cut")]
    failing.append(model("http://127.0.0.1:9/v1"))  # nothing listens there
    report = check_model(model(servers["ok"].base_url), slow=model(servers["stall"].base_url), failing=failing)
    print(report)
    assert "cancel" in report.passed and len([p for p in report.passed if p.startswith("failures")]) == 6
    # the cancelled request at most once (a cancel is never retried; under load the cancel may land
    # before the request reached the server)
    assert servers["stall"].served <= 1


@pytest.mark.local_model
@pytest.mark.skipif(needs_local_model[1].args[0], reason=needs_local_model[1].kwargs["reason"])
def test_local_model_conforms() -> None:
    from loopfence.models import LocalModel

    report = check_model(LocalModel(max_tokens=16), failing=[LocalModel(n_ctx=8)])  # n_ctx: no room for the prompt
    print(report)
    assert "complete" in report.passed and "cancel" in report.skipped  # sync only: no acomplete


def test_workspace_tools_conform(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    tools = {t.name: t for t in workspace_tools(tmp_path)}
    report = check_tool(tools["read_file"], {"path": "a.txt"}, failing_args={"path": "missing.txt"})
    assert report.passed == ["schema", "call", "bad args", "failing"], report
    for name, t in tools.items():  # every schema and its refusals, whatever the tool
        required = t.parameters.get("required") or []
        if not required:
            check_tool(t, {})
        else:
            with pytest.raises(AssertionError, match=r"check_tool\[schema\]: the tool requires"):
                check_tool(t)


def test_a_plain_function_conforms() -> None:
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        if a < 0:
            raise ValueError("negative")
        return a + b

    report = check_tool(add, {"a": 2}, bad_args={"a": "two"}, failing_args={"a": -1})
    assert report.passed == ["schema", "call", "bad args", "failing"]


def test_an_async_tool_is_awaited() -> None:
    async def fetch(key: str) -> str:
        await asyncio.sleep(0)
        return f"value of {key}"

    assert "call (awaited)" in check_tool(fetch, {"key": "k"}).passed


# -- it catches what breaks the rules ----------------------------------------------------------
class _Base:
    def describe(self) -> dict[str, Any]:
        return {"kind": "test"}

    def complete(self, request: Request) -> Any:
        return ScriptedModel([OK]).complete(request)


def _fails(check: str, model: Any, **kw: Any) -> str:
    with pytest.raises(AssertionError, match=rf"check_model\[{check}") as e:
        check_model(model, **kw)
    return str(e.value)


def test_a_raw_exception_is_named() -> None:
    class Raw(_Base):
        def complete(self, request: Request) -> Any:
            raise KeyError("choices")

    assert "raised KeyError" in _fails("complete", Raw())


def test_a_stop_on_a_trivial_request_and_a_malformed_reply_fail() -> None:
    class Stops(_Base):
        def complete(self, request: Request) -> Any:
            raise StopError(StopReason.ENDPOINT_ERROR, "down")

    class Dict(_Base):
        def complete(self, request: Request) -> Any:
            return {"choices": []}

    assert "stopped endpoint_error" in _fails("complete", Stops())
    assert "not a loopfence Reply" in _fails("complete", Dict())


def test_protocol_problems_fail() -> None:
    class SyncNamedAsync(_Base):
        def acomplete(self, request: Request) -> Any:  # not async def
            return self.complete(request)

    class BadDescribe(_Base):
        def describe(self) -> Any:
            return {"key": object()}

    assert "must be `async def`" in _fails("protocol", SyncNamedAsync())
    assert "cannot be logged as JSON" in _fails("protocol", BadDescribe())


def test_a_swallowed_cancel_fails() -> None:
    class Swallows(_Base):
        async def acomplete(self, request: Request) -> Any:
            try:
                await asyncio.sleep(30 if request.params.get("slow") else 0)
            except asyncio.CancelledError:
                pass
            return self.complete(request)

    assert "swallowed the cancel" in _fails("cancel", Swallows(), slow=SLOW)


def test_work_left_in_a_thread_fails() -> None:
    class Abandons(_Base):
        async def acomplete(self, request: Request) -> Any:
            if request.params.get("slow"):
                await asyncio.to_thread(time.sleep, 1.5)  # the cancel cannot reach it
            return self.complete(request)

    message = _fails("cancel", Abandons(), slow=SLOW, grace_s=0.3)
    assert "thread" in message  # a thread still running, found before or by the loop's shutdown


def test_a_task_left_behind_fails() -> None:
    class Leaks(_Base):
        async def acomplete(self, request: Request) -> Any:
            if request.params.get("slow"):
                self.orphan = asyncio.ensure_future(asyncio.sleep(30))
                await asyncio.sleep(30)
            return self.complete(request)

    assert "left 1 task(s) running" in _fails("cancel", Leaks(), slow=SLOW)


def test_a_failing_adapter_must_stop_named() -> None:
    class Raw(_Base):
        def complete(self, request: Request) -> Any:
            raise ConnectionError("refused")

    class Pretends(_Base):
        pass  # answers as if nothing failed

    assert "raised ConnectionError" in _fails("failures #1 complete", ScriptedModel([OK]), failing=[Raw()])
    assert "the failure was not surfaced" in _fails("failures #2", ScriptedModel([OK]),
                                                     failing=[ScriptedModel([{"choices": []}]), Pretends()])


def test_tool_problems_fail() -> None:
    loose = Tool.from_schema("loose", lambda **kw: "ok", {"type": "object"})
    with pytest.raises(AssertionError, match=r"check_tool\[bad args\].*was accepted"):
        check_tool(loose, {}, bad_args={"anything": 1})
    with pytest.raises(AssertionError, match=r"check_tool\[schema\]: name"):
        check_tool(Tool.from_schema("no spaces allowed", lambda: "x"))
    with pytest.raises(AssertionError, match=r"check_tool\[schema\]: required"):
        check_tool(Tool.from_schema("t", lambda: "x", {"type": "object", "required": ["ghost"]}))

    def fine(x: int) -> str:
        return "fine"

    with pytest.raises(AssertionError, match=r"check_tool\[failing\]: failing_args gave an ok result"):
        check_tool(tool(fine), {"x": 1}, failing_args={"x": 2})
