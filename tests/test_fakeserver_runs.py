"""One FakeServer, many runs: each run gets its own reply sequence, keyed by the run id OpenAIModel
sends (`X-Loopfence-Run-Id`, the log header's run_id); clients that send none share one (issue 20)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
import pytest

from loopfence import StopReason, arun, run, workspace_tools
from loopfence.models._openai import RUN_ID_HEADER, OpenAIModel
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call
from loopfence.testing._fakeserver import RUN_HEADER

SCRIPT = [calls_reply(tool_call("read_file", path="a.txt")), calls_reply(tool_call("list_dir")), text_reply("done")]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("hello\n")
    return tmp_path


def _header_run_id(log: Path) -> str:
    return json.loads(log.read_text().splitlines()[0])["run_id"]


def _each_run_got_the_whole_script(srv: FakeServer, results: list, logs: list[Path]) -> None:
    for result in results:
        assert result.stop.reason is StopReason.FINAL_ANSWER, result.stop.detail
        assert result.ledger.model_requests == 3 and result.ledger.tool_executions == 2
    assert set(srv.runs) == {_header_run_id(log) for log in logs}  # one sequence per run, by its id
    assert all(len(bodies) == 3 for bodies in srv.runs.values())


def test_the_header_names_agree() -> None:
    assert RUN_ID_HEADER.lower() == RUN_HEADER


def test_two_concurrent_runs_each_get_their_own_script(ws: Path, tmp_path: Path) -> None:
    logs = [tmp_path / f"run{i}.jsonl" for i in range(2)]
    results: list = [None, None]
    with FakeServer(SCRIPT) as srv:
        model = OpenAIModel(srv.base_url, "fake")
        both = threading.Barrier(2)

        def go(i: int) -> None:
            both.wait()
            results[i] = run("Read a.txt", model=model, tools=workspace_tools(ws), log=logs[i])

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        model.close()
    _each_run_got_the_whole_script(srv, results, logs)


def test_twenty_concurrent_runs_on_one_loop_each_get_their_own_script(ws: Path, tmp_path: Path) -> None:
    logs = [tmp_path / f"run{i}.jsonl" for i in range(20)]

    async def main(srv: FakeServer) -> list:
        async with OpenAIModel(srv.base_url, "fake") as model:
            return await asyncio.gather(*(arun("Read a.txt", model=model, tools=workspace_tools(ws), log=log)
                                          for log in logs))

    with FakeServer(SCRIPT) as srv:
        results = asyncio.run(main(srv))
    _each_run_got_the_whole_script(srv, list(results), logs)


def test_a_second_run_starts_the_script_again(ws: Path, tmp_path: Path) -> None:
    with FakeServer(SCRIPT) as srv:
        model = OpenAIModel(srv.base_url, "fake")
        first = run("Read a.txt", model=model, tools=workspace_tools(ws), log=tmp_path / "1.jsonl")
        second = run("Read a.txt", model=model, tools=workspace_tools(ws), log=tmp_path / "2.jsonl")
        model.close()
    _each_run_got_the_whole_script(srv, [first, second], [tmp_path / "1.jsonl", tmp_path / "2.jsonl"])


def test_clients_that_send_no_run_id_share_one_sequence() -> None:
    with FakeServer([text_reply("one"), text_reply("two")]) as srv:
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        said = [httpx.post(f"{srv.base_url}/chat/completions", json=body).json()["choices"][0]["message"]["content"]
                for _ in range(3)]
        own = httpx.post(f"{srv.base_url}/chat/completions", json=body, headers={RUN_ID_HEADER: "r1"}).json()
    assert said == ["one", "two", "two"]  # the last reply repeats
    assert own["choices"][0]["message"]["content"] == "one"
    assert len(srv.runs[None]) == 3 and len(srv.runs["r1"]) == 1 and srv.served == 4
