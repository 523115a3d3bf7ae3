"""The proxy with agents that act in text and with named runs (issue 40), through `loopfence proxy`
as a real process in front of a real HTTP upstream on 127.0.0.1.

- Text actions: a conversation with no tools, each reply a bash block, its output the next user
  message: the same command with the same output stops within 6 upstream requests; an edit-and-test
  loop and a poll whose output changes finish; their logs reconcile and replay, one request line per
  request.
- Named runs are one set of budgets for as long as the name lives (text answers do not end them),
  `--budget-per-turn` gives each text answer's next turn fresh budgets, the reset route ends a run
  and frees its name, session headers name runs per client key.
- Every stop answer is a complete chat.completion (the `openai` SDK's types, usage set), streamed
  and not, with the fixed marker, the same for every later request.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from loopfence.cli import cli
from loopfence.proxy._answer import STOP_MARKER
from loopfence.runlog import read_log
from loopfence.testing import calls_reply, text_reply, tool_call

from _proxy_support import Proxy, ReplyServer, logs_in, reconciles, replays, reset_all, tag

pytestmark = pytest.mark.timeout(300)
SYSTEM = "You are a helpful assistant that can interact with a computer. Reply with a THOUGHT, then one bash block."


def bash(thought: str, command: str) -> str:
    """A reply as mini-swe-agent's text mode renders one: the thought, then one bash block."""
    return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"


def observation(output: str, rc: int = 0) -> str:
    return f"<returncode>{rc}</returncode>\n<output>\n{output}</output>"


def post(url: str, messages: list[dict[str, Any]], headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json={"model": "m-asked", "messages": messages, **body},
                      headers=headers, timeout=60)


def text_loop(url: str, task: str, outputs: list[str], headers: dict[str, str] | None = None) -> list[httpx.Response]:
    """A bash-block agent: each answer's output (`outputs`, in turn) goes back as the next user
    message, until the outputs run out or an answer is a stop. Every response, in order."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    got = []
    for out in [*outputs, None]:
        r = post(url, messages, headers)
        assert r.status_code == 200, r.text
        got.append(r)
        if "x-loopfence-stop" in r.headers or out is None:
            break
        messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": observation(out)}]
    return got


def turn_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


def one_log(logs: Path) -> Path:
    found = logs_in(logs)
    assert len(found) == 1, found
    return found[0]


def ends_whole(url: str, logs: Path, upstream: int) -> None:
    """The client is done: reset ends its run; the log reconciles and replays, one request line per
    request that reached the upstream."""
    reset_all(url)
    log = one_log(logs)
    reconciles(log)
    replays(log)
    assert len(read_log(log).of("request")) == upstream


# ---------------------------------------------------------------------------- text actions
def test_the_same_bash_block_with_the_same_output_stops_within_six(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply(bash("Let me look.", "ls -la"))) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        got = text_loop(proxy.base_url, "Fix the bug.", ["total 0\nfile.py"] * 30)
        assert len(up.requests) <= 6, len(up.requests)
        last = got[-1]
        assert last.headers["x-loopfence-stop"] in {"repeated_call", "repeated_result", "cycle"}
        assert last.json()["choices"][0]["message"]["content"].startswith(STOP_MARKER)
        log = read_log(one_log(tmp_path))
        assert log.stop is not None and len(log.of("request")) == len(up.requests)
        executed = [r for r in log.of("result") if r.decision == "executed"]
        assert executed and all(r.name == "text_action" for r in executed)
        assert json.loads(log.of("call")[0].raw_arguments)["action"] == "ls -la"
        reconciles(one_log(tmp_path))
        replays(one_log(tmp_path))


def test_an_edit_and_test_loop_and_a_poll_whose_output_changes_finish(tmp_path: Path) -> None:
    edit_test = [bash("Edit.", "sed -i 's/a/b/' x.py"), bash("Test.", "pytest -q"),
                 bash("Edit again.", "sed -i 's/b/c/' x.py"), bash("Test.", "pytest -q"),
                 bash("Edit again.", "sed -i 's/c/d/' x.py"), bash("Test.", "pytest -q"), "All tests pass. Done."]
    outputs = ["", "1 failed in 0.05s", "", "1 failed in 0.04s", "", "3 passed in 0.06s"]
    poll = [bash("Wait for the job.", "curl -s localhost:9/status")] * 8 + ["The job is ready."]
    polled = [f"pending: {i} of 8 done" for i in range(1, 8)] + ["ready"]
    for name, replies, outs in (("edit", edit_test, outputs), ("poll", poll, polled)):
        logs = tmp_path / name
        with ReplyServer(lambda body, r=replies: text_reply(r[min(turn_of(body), len(r) - 1)])) as up, \
                Proxy("--upstream", up.base_url, "--logs", str(logs), stderr=tmp_path / f"{name}.err") as proxy:
            got = text_loop(proxy.base_url, f"Make the tests pass ({name}).", outs)
            assert all("x-loopfence-stop" not in r.headers for r in got), [r.text for r in got][-1]
            assert len(got) == len(replies) == len(up.requests)
            ends_whole(proxy.base_url, logs, len(replies))
        log = read_log(one_log(logs))
        assert log.stop is not None and log.stop.reason == "final_answer"
        assert log.stop.ledger["tool_executions"] == len(outs)
    page = tmp_path / "report.html"
    assert cli(["report", str(one_log(tmp_path / "edit")), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert "text_action" in html and "pytest -q" in html  # the report shows each action


def test_a_text_run_goes_on_after_kill_9_and_a_restart(tmp_path: Path) -> None:
    replies = [bash("Look.", "ls"), bash("Read.", "cat a.py"), bash("Edit.", "sed -i s/1/2/ a.py"),
               bash("Test.", "pytest -q"), "Fixed."]
    outs = ["a.py", "x = 1", "", "1 passed in 0.01s"]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix a.py."}]
    with ReplyServer(lambda body: text_reply(replies[min(turn_of(body), len(replies) - 1)])) as up:
        for turn in range(len(replies)):
            proxy = Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err")
            r = post(proxy.base_url, messages)
            assert r.status_code == 200 and "x-loopfence-stop" not in r.headers, r.text
            if turn < len(outs):
                messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": observation(outs[turn])}]
                proxy.kill()  # kill -9 between two requests: the next proxy folds the log back
        assert len(up.requests) == len(replies)
        ends_whole(proxy.base_url, tmp_path, len(replies))
        proxy.stop()
    log = read_log(one_log(tmp_path))
    assert log.stop is not None and log.stop.ledger["tool_executions"] == len(outs)


def test_sigterm_ends_the_runs_waiting_on_their_clients_unless_keep_runs(tmp_path: Path) -> None:
    replies = [bash("Look.", "ls"), bash("Read.", "cat a.py")]
    for keep in (False, True):
        logs = tmp_path / str(keep)
        with ReplyServer(lambda body: text_reply(replies[min(turn_of(body), 1)])) as up, \
                Proxy("--upstream", up.base_url, "--logs", str(logs), *(["--keep-runs"] if keep else []),
                      stderr=tmp_path / "err") as proxy:
            text_loop(proxy.base_url, "Look around.", ["a.py"])
        log = one_log(logs)  # the proxy is gone (SIGTERM, exit 0)
        if keep:
            assert read_log(log).stop is None  # a restart on the same --logs continues it
        else:
            stop = read_log(log).stop
            assert stop is not None and stop.reason == "final_answer" and "shut down" in stop.detail
            reconciles(log)
            replays(log)


def test_the_same_task_twice_with_no_reset_reaches_the_upstream_every_time(tmp_path: Path) -> None:
    """A second episode of one task (no reset between) repeats the first request for request: each
    is a new one once the answer before was delivered, never answered from the first episode; a
    one-shot prompt sampled three times reaches the upstream three times (pass@k)."""
    replies = [bash("Look.", "ls"), bash("Read.", "cat a.py"), "Fixed."]
    with ReplyServer(lambda body: text_reply(replies[min(turn_of(body), len(replies) - 1)])) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        first = text_loop(proxy.base_url, "Fix a.py.", ["a.py", "x = 1"])
        second = text_loop(proxy.base_url, "Fix a.py.", ["a.py", "x = 1"])
        assert len(first) == len(second) == 3 and len(up.requests) == 6
        assert [r.json()["choices"][0]["message"]["content"] for r in second] == replies
        assert first[0].headers["x-loopfence-run"] != second[0].headers["x-loopfence-run"]
        assert len({r.headers["x-loopfence-run"] for r in second}) == 1  # the second episode is one run
        samples = [post(proxy.base_url, [{"role": "user", "content": "Name a colour."}]) for _ in range(3)]
        assert len(up.requests) == 9 and all(r.status_code == 200 for r in samples)
        reset_all(proxy.base_url)
    for episode in (first, second):  # both ran their two actions: both logs count them executed
        log = read_log(tmp_path / f"{episode[0].headers['x-loopfence-run']}.jsonl")
        assert log.stop is not None and log.stop.ledger["tool_executions"] == 2
        assert [r.tool_call_id for r in log.of("result") if r.error == "not_executed"] == ["text-3"]  # "Fixed."


REMINDER = "Reminder: reply with one edit block."


def rebuilt(task: str, turns: list[tuple[str, str]], files: str) -> list[dict[str, Any]]:
    """A request as aider builds one: the system prompt and its examples, the finished turns (the task,
    each answer, aider's own "Ok."), the file block (its content changes as files change), the
    current message with the reminder appended: no request is a prefix of the next."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Change foo to bar."},
        {"role": "assistant", "content": "foo.py\n<<<<<<< SEARCH\nfoo\n=======\nbar\n>>>>>>> REPLACE"},
        {"role": "user", "content": "I switched to a new code base."}, {"role": "assistant", "content": "Ok."}]
    asked = task
    for answer, output in turns:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answer},
                     {"role": "user", "content": "I committed the changes."}, {"role": "assistant", "content": "Ok."}]
        asked = output
    messages += [{"role": "user", "content": f"I have added these files: {files}"},
                 {"role": "assistant", "content": "Ok."}, {"role": "user", "content": f"{asked}\n\n{REMINDER}"}]
    return messages


def test_an_agent_that_rebuilds_its_history_is_one_run_by_its_task_and_last_answer(tmp_path: Path) -> None:
    """No request extends the one before it; each brings back its task and the last answer the proxy
    gave: one run, so the same failing edit after the same output stops at the repetition rule. Two
    tasks interleaved, under one system prompt and with the very same answers, are never glued."""
    same_edit = bash("Fix it.", "sed -i 's/a/b/' x.py")
    with ReplyServer(lambda body: text_reply(same_edit)) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        turns: dict[str, list[tuple[str, str]]] = {"Fix x.py.": [], "Fix y.py.": []}
        got: dict[str, list[httpx.Response]] = {task: [] for task in turns}
        for i in range(8):
            for task, done in turns.items():
                if got[task] and "x-loopfence-stop" in got[task][-1].headers:
                    continue
                r = post(proxy.base_url, rebuilt(task, done, f"x.py v{i}"))
                got[task].append(r)
                if "x-loopfence-stop" not in r.headers:
                    done.append((r.json()["choices"][0]["message"]["content"], "1 failed"))
        lost = post(proxy.base_url, rebuilt("Fix z.py.", [(same_edit, "1 failed")], "z.py"))
        lost_again = post(proxy.base_url, rebuilt("Fix w.py.", [(same_edit, "2 failed")], "w.py"))
    for task, seen in got.items():
        assert seen[-1].headers.get("x-loopfence-stop") == "repeated_call", (task, seen[-1].text)
        assert len(seen) <= 4 and len({r.headers["x-loopfence-run"] for r in seen}) == 1, task
    assert got["Fix x.py."][0].headers["x-loopfence-run"] != got["Fix y.py."][0].headers["x-loopfence-run"]
    assert len(up.requests) == sum(len(v) for v in got.values()) + 2  # the third same edit is the reply refused
    # a request that carries answers of no run it can be placed in: said once on stderr, and in its header
    err = (tmp_path / "err").read_text()
    assert err.count("continues no run this proxy knows") == 1, err
    for r in (lost, lost_again):
        assert "x-loopfence-stop" not in r.headers
        header = read_log(tmp_path / f"{r.headers['x-loopfence-run']}.jsonl").header.record["proxy"]
        assert "/run/NAME/v1" in header["unplaced"]


def test_a_base_url_names_the_run(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply(bash("Look.", "ls"))) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=2",
                  stderr=tmp_path / "err") as proxy:
        root = proxy.base_url.removesuffix("/v1")
        named = f"{root}/run/task-7/v1"
        seen = [post(named, [{"role": "user", "content": f"unrelated {i}"}]) for i in range(3)]
        assert [r.headers["x-loopfence-run"] for r in seen] == ["task-7"] * 3
        assert seen[-1].headers.get("x-loopfence-stop") == "max_steps" and len(up.requests) == 2
        bad = post(f"{root}/run/no%20spaces/v1", [{"role": "user", "content": "x"}])
        twice = post(named, [{"role": "user", "content": "x"}], {"X-Loopfence-Run": "other"})
        models, plain = (httpx.get(f"{url}/models", timeout=10) for url in (named, proxy.base_url))
    assert bad.status_code == 400 and "/run/NAME/v1" in bad.json()["error"]["message"]
    assert twice.status_code == 400 and "named twice" in twice.json()["error"]["message"]
    assert (models.status_code, models.json()) == (plain.status_code, plain.json())  # the same route, named


MINI_EMPTY = "<returncode>0</returncode>\n<output>\n</output>"
FAILING = "<returncode>1</returncode>\n<output>\nFAILED test_x.py::test_x - assert 1 == 2\n1 failed in 0.05s\n</output>"


def tool_loop(url: str, task: str, outputs: list[str]) -> list[httpx.Response]:
    """A tool-calling agent: each call of an answer gets the next output, until they run out or an
    answer is a stop or has no calls. Every response, in order."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    got, outs = [], iter(outputs)
    while True:
        r = post(url, messages, tools=[BASH])
        assert r.status_code == 200, r.text
        got.append(r)
        message = r.json()["choices"][0]["message"]
        if "x-loopfence-stop" in r.headers or not message.get("tool_calls"):
            return got
        messages.append(message)
        for c in message["tool_calls"]:
            out = next(outs, None)
            if out is None:
                return got
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})


BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def _calls_or_blocks(commands: list[str], final: str, as_text: bool) -> Any:
    """The reply at each turn: a bash block (text) or a bash call, one command a turn, then `final`."""
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        turn = turn_of(body)
        if turn >= len(commands):
            return text_reply(final)
        if as_text:
            return text_reply(bash("Next.", commands[turn]))
        return calls_reply(tool_call("bash", {"command": commands[turn]}, id=f"call_{turn}"))
    return reply


@pytest.mark.parametrize("as_text", [True, False], ids=["bash-blocks", "tool-calls"])
def test_ten_writes_with_empty_output_finish_in_both_renderings(tmp_path: Path, as_text: bool) -> None:
    writes = [f"cat <<'EOF' > pkg/m{i}.py\nx = {i}\nEOF" for i in range(6)] + \
        [f"echo 'line {i}' >> fix.py" for i in range(4)]
    with ReplyServer(_calls_or_blocks(writes, "Written.", as_text)) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limits", "coding",
                  stderr=tmp_path / "err") as proxy:
        loop = text_loop if as_text else tool_loop
        got = loop(proxy.base_url, "Write the package.", [MINI_EMPTY] * len(writes))
        assert all("x-loopfence-stop" not in r.headers for r in got), got[-1].text
        assert got[-1].json()["choices"][0]["message"]["content"] == "Written."
        assert len(up.requests) == len(writes) + 1
        reset_all(proxy.base_url)
    reconciles(one_log(tmp_path))


@pytest.mark.parametrize("as_text", [True, False], ids=["bash-blocks", "tool-calls"])
def test_the_same_edit_and_the_same_failing_test_stop_within_six_in_both_renderings(tmp_path: Path,
                                                                                     as_text: bool) -> None:
    commands = ["sed -i 's/1/2/' x.py", "pytest -q"] * 10
    with ReplyServer(_calls_or_blocks(commands, "Done.", as_text)) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limits", "coding",
                  stderr=tmp_path / "err") as proxy:
        loop = text_loop if as_text else tool_loop
        got = loop(proxy.base_url, "Make the test pass.", [MINI_EMPTY, FAILING] * 10)
        assert got[-1].headers.get("x-loopfence-stop") == "repeated_result", got[-1].text
        assert len(up.requests) <= 6, len(up.requests)
        reset_all(proxy.base_url)
    reconciles(one_log(tmp_path))


def test_a_storm_of_different_commands_with_one_error_stops_within_six_as_bash_blocks(tmp_path: Path) -> None:
    commands = [f"./deploy.sh --attempt {i}" for i in range(20)]
    denied = "<returncode>126</returncode>\n<output>\nbash: ./deploy.sh: Permission denied\n</output>"
    with ReplyServer(_calls_or_blocks(commands, "Done.", True)) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limits", "coding",
                  stderr=tmp_path / "err") as proxy:
        got = text_loop(proxy.base_url, "Deploy.", [denied] * 20)
        assert got[-1].headers.get("x-loopfence-stop") == "repeated_result", got[-1].text
        assert len(up.requests) <= 6, len(up.requests)


def test_a_delivered_answer_under_a_session_makes_the_same_request_new_and_an_unread_one_is_a_retrys(
        tmp_path: Path) -> None:
    """Under a session id too, the same request after its answer was delivered reaches the upstream
    again. A client that gave up before its answer came (a timeout) gets that answer on its retry,
    even when the answer ended the run, and the upstream is not asked twice."""
    slow = {"fault": "slow_stream", "delay_s": 0.6, "reply": text_reply("late but whole")}
    with ReplyServer(lambda body: slow if "slow" in str(body["messages"]) else text_reply("hello")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        sid = {"x-session-id": "ses_again"}
        for _ in range(2):
            assert post(proxy.base_url, [{"role": "user", "content": "say hi"}], sid, tools=[READ]).status_code == 200
        assert len(up.requests) == 2
        body = {"model": "m", "messages": [{"role": "user", "content": "slow one"}], "tools": [READ]}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{proxy.base_url}/chat/completions", json=body, headers=sid, timeout=0.2)
        import time
        time.sleep(1.5)  # the answer is made (the run ended with it), never read
        retry = httpx.post(f"{proxy.base_url}/chat/completions", json=body, headers=sid, timeout=30)
    assert retry.status_code == 200 and retry.json()["choices"][0]["message"]["content"] == "late but whole"
    assert len(up.requests) == 3


def test_a_reply_with_code_tags_or_several_blocks_is_one_action(tmp_path: Path) -> None:
    replies = ["Thought: compute.\n<code>\nprint(1 + 1)\n</code>",
               "Two steps:\n```bash\ncd src\n```\nthen\n```bash\nmake\n```"]
    with ReplyServer(lambda body: text_reply(replies[min(turn_of(body), 1)])) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        text_loop(proxy.base_url, "Compute.", ["2"])
        reset_all(proxy.base_url)
    actions = [json.loads(c.raw_arguments)["action"] for c in read_log(one_log(tmp_path)).of("call")]
    assert actions == ["print(1 + 1)", "cd src\n\nmake"]


# ---------------------------------------------------------------------------- re-rendered results
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_results_re_rendered_as_user_messages_answer_the_calls_they_name_else_all_in_order(tmp_path: Path) -> None:
    """smolagents' rendering: the calls as "Calling tools:" text, their results as user messages
    (one "Observation:" for parallel calls, or one per call naming its id, in any order)."""
    replies = [calls_reply(tool_call("get", {"city": "Paris"}, id="c_a"), tool_call("get", {"city": "Rome"}, id="c_b")),
               calls_reply(tool_call("get", {"city": "Oslo"}, id="c_c"), tool_call("get", {"city": "Bern"}, id="c_d")),
               text_reply("All sunny.")]
    with ReplyServer(lambda body: replies[min(turn_of(body), 2)]) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "New task:\nWeather?"}]}]
        observations = [[{"role": "user", "content": "Observation:\nParis: sunny\nRome: sunny"}],
                        [{"role": "user", "content": "Call id: c_d\nObservation:\nBern: sunny"},
                         {"role": "user", "content": "Call id: c_c\nObservation:\nOslo: sunny"}]]
        for turn in range(3):
            r = post(proxy.base_url, messages, tools=TOOLS)
            assert r.status_code == 200 and "x-loopfence-stop" not in r.headers, r.text
            if turn < 2:
                calls = [{"id": c["id"], "type": "function", "function": {"name": "get", "arguments": json.loads(
                    c["function"]["arguments"])}} for c in r.json()["choices"][0]["message"]["tool_calls"]]
                messages += [{"role": "assistant", "content": f"Calling tools:\n{calls!r}"}, *observations[turn]]
    log = read_log(one_log(tmp_path))
    got = {e.tool_call_id: e.content for e in log.of("result") if e.decision == "executed"}
    assert got == {"c_a": "Observation:\nParis: sunny\nRome: sunny", "c_b": "Observation:\nParis: sunny\nRome: sunny",
                   "c_c": "Call id: c_c\nObservation:\nOslo: sunny", "c_d": "Call id: c_d\nObservation:\nBern: sunny"}
    assert log.stop is not None and log.stop.reason == "final_answer" and log.stop.ledger["tool_executions"] == 4
    reconciles(one_log(tmp_path))
    replays(one_log(tmp_path))


# ---------------------------------------------------------------------------- named runs
def test_twenty_text_answers_under_one_name_share_one_budget_of_ten(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply(f"Answer to: {body['messages'][-1]['content']}")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=10",
                  stderr=tmp_path / "err") as proxy:
        got = [post(proxy.base_url, [{"role": "user", "content": f"question {i}"}], {"X-Loopfence-Run": "mini-1"})
               for i in range(20)]
    assert len(up.requests) == 10
    assert {r.headers["x-loopfence-run"] for r in got} == {"mini-1"}
    stops = [r for r in got if "x-loopfence-stop" in r.headers]
    assert len(stops) == 10 and {r.headers["x-loopfence-stop"] for r in stops} == {"max_steps"}
    assert len({r.text for r in stops}) == 1  # every answer to a stopped run is the same
    assert stops[0].json()["choices"][0]["message"]["content"].startswith(STOP_MARKER)
    log = read_log(one_log(tmp_path))
    assert len(log.of("request")) == 10 and log.stop is not None and log.stop.reason == "max_steps"
    reconciles(one_log(tmp_path))


def test_budget_per_turn_gives_each_turn_after_a_text_answer_fresh_budgets(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply("ok")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=1", "--budget-per-turn",
                  stderr=tmp_path / "err") as proxy:
        got = [post(proxy.base_url, [{"role": "user", "content": f"turn {i}"}], {"X-Loopfence-Run": "chat"})
               for i in range(3)]
        at_once = asyncio.run(_branches(proxy.base_url, 3, {"X-Loopfence-Run": "busy"}))
    assert len(up.requests) == 6 and all("x-loopfence-stop" not in r.headers for r in got + at_once)
    assert [r.headers["x-loopfence-run"] for r in got] == ["chat", "chat-2", "chat-3"]
    # requests queued behind the one whose answer ended the run each start a run, never get a "stop"
    assert sorted(r.headers["x-loopfence-run"] for r in at_once) == ["busy", "busy-2", "busy-3"]
    for log in logs_in(tmp_path):
        reconciles(log)


async def _branches(url: str, n: int, headers: dict[str, str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(*(client.post(f"{url}/chat/completions", headers=headers, json={
            "model": "m", "messages": [{"role": "user", "content": f"branch {i}"}]}) for i in range(n)))


def test_fifty_concurrent_branches_under_one_name_against_room_for_ten(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply(f"done with {body['messages'][-1]['content']}")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=10",
                  stderr=tmp_path / "err") as proxy:
        got = asyncio.run(_branches(proxy.base_url, 50, {"X-Loopfence-Run": "fan"}))
    assert {r.status_code for r in got} == {200}
    assert len(up.requests) == 10
    assert [r.headers.get("x-loopfence-stop") for r in got].count("max_steps") == 40
    assert {r.headers["x-loopfence-run"] for r in got} == {"fan"}


def test_reset_ends_a_stopped_named_run_and_the_name_starts_afresh(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply("ok")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=2", "--key", "alice",
                  "--key", "bob", stderr=tmp_path / "err") as proxy:
        alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
        root = proxy.base_url.removesuffix("/v1")
        for i in range(3):
            r = post(proxy.base_url, [{"role": "user", "content": f"q{i}"}], {**alice, "X-Loopfence-Run": "job"})
        assert r.headers["x-loopfence-stop"] == "max_steps"
        assert httpx.post(f"{root}/loopfence/runs/job/reset", headers=bob, timeout=30).status_code == 404
        ended = httpx.post(f"{root}/loopfence/runs/job/reset", headers=alice, timeout=30)
        assert ended.status_code == 200 and ended.json()["stop"]["reason"] == "max_steps", ended.text
        again = post(proxy.base_url, [{"role": "user", "content": "a new task"}], {**alice, "X-Loopfence-Run": "job"})
        assert again.headers["x-loopfence-run"] == f"{tag('alice')}.job-2" and "x-loopfence-stop" not in again.headers
        # the same name under another key is another run: names are scoped to the client's key, and its
        # id owes nothing to alice's (no "-3" telling bob that someone else has a "job")
        other = post(proxy.base_url, [{"role": "user", "content": "bob's task"}], {**bob, "X-Loopfence-Run": "job"})
        assert other.headers["x-loopfence-run"] == f"{tag('bob')}.job" and "x-loopfence-stop" not in other.headers
        # the same conversation from two keys is two runs (the routes are per key too)
        mine = post(proxy.base_url, [{"role": "user", "content": "the same"}], alice)
        theirs = post(proxy.base_url, [{"role": "user", "content": "the same"}], bob)
        assert mine.status_code == theirs.status_code == 200, theirs.text
        assert mine.headers["x-loopfence-run"] != theirs.headers["x-loopfence-run"]
        assert len(up.requests) == 6
        reconciles(tmp_path / f"{tag('alice')}.job.jsonl")


def test_session_headers_scope_conversations_per_client_key(tmp_path: Path) -> None:
    """A session header names a scope, not one run: each conversation of the session is a run of its
    own (`SESSION`, `SESSION-2`), a conversation continues only within its session, and the same
    session from another key is another's."""
    with ReplyServer(lambda body: text_reply("ok")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--session-header", "X-My-Session",
                  "--key", "k1", "--key", "k2", stderr=tmp_path / "err") as proxy:
        k1, k2 = {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}
        seen = {}
        for header, value in (("x-session-id", "ses_abc"), ("x-litellm-session-id", "lite-1"),
                              ("x-claude-code-session-id", "0b9f1d2e-4c55-4a8e-9f00-5d1c2b3a4e5f"),
                              ("session-id", "codex-1"), ("X-My-Session", "mine")):
            one = [{"role": "user", "content": f"{header} one"}]
            a = post(proxy.base_url, one, {**k1, header: value})
            b = post(proxy.base_url, [{"role": "user", "content": f"{header} two"}], {**k1, header: value})
            more = [*one, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
            a2 = post(proxy.base_url, more, {**k1, header: value})
            elsewhere = post(proxy.base_url, more, {**k1, header: value + "x"})
            c = post(proxy.base_url, one, {**k2, header: value})
            seen[header] = [r.headers["x-loopfence-run"] for r in (a, b, a2, elsewhere, c)]
        odd = post(proxy.base_url, [{"role": "user", "content": "odd"}], {**k1, "x-session-id": "has spaces/and:colons"})
    for header, (a, b, a2, elsewhere, c) in seen.items():
        assert a == a2 and len({a, b, elsewhere, c}) == 4, (header, a, b, a2, elsewhere, c)
        assert b.startswith(a + "-"), (a, b)  # the session's second conversation
    k1_tag = tag("k1")
    assert seen["x-session-id"][0] == f"{k1_tag}.ses_abc" and seen["X-My-Session"][0] == f"{k1_tag}.mine"
    assert all(c == f"{tag('k2')}.{a.removeprefix(k1_tag + '.')}" for a, _, _, _, c in seen.values())  # its own ids
    assert odd.status_code == 200 and odd.headers["x-loopfence-run"].startswith(f"{k1_tag}.s-")
    assert len(up.requests) == 26
    header = read_log(tmp_path / f"{k1_tag}.ses_abc-2.jsonl").header.record["proxy"]
    assert header["session"] == "ses_abc"


READ = {"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
GREP = {"type": "function", "function": {"name": "grep", "parameters": {
    "type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}}


def test_a_session_opened_by_a_toolless_title_request_releases_the_agents_first_call(tmp_path: Path) -> None:
    """opencode: the title generator (no tools) opens the session; the agent's request with tools
    [read] is judged against its own tools, so its first call is released, not `unknown_tool`."""
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("tools"):
            return text_reply("Reading the config")
        return calls_reply(tool_call("read", {"path": "a.py"}))
    with ReplyServer(reply) as up, Proxy("--upstream", up.base_url, "--logs", str(tmp_path),
                                         stderr=tmp_path / "err") as proxy:
        sid = {"x-session-id": "ses_title"}
        title = post(proxy.base_url, [{"role": "system", "content": "You are a title generator."},
                                      {"role": "user", "content": "fix the config"}], sid)
        first = post(proxy.base_url, [{"role": "system", "content": "You are opencode."},
                                      {"role": "user", "content": "fix the config"}], sid, tools=[READ])
    assert title.status_code == first.status_code == 200
    assert "x-loopfence-stop" not in first.headers, first.text
    calls = first.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["read"]
    assert title.headers["x-loopfence-run"] != first.headers["x-loopfence-run"]


def test_a_sessions_conversations_share_its_budgets(tmp_path: Path) -> None:
    """A conversation opened in a session starts with the session's budgets less what its other
    conversations spent (`Limits.left_after`): its header records what it was given."""
    with ReplyServer(lambda body: text_reply("a title")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=5",
                  stderr=tmp_path / "err") as proxy:
        sid = {"x-session-id": "ses_budget"}
        runs = [post(proxy.base_url, [{"role": "user", "content": f"side {i}"}], sid).headers["x-loopfence-run"]
                for i in range(3)]
    steps = [read_log(tmp_path / f"{rid}.jsonl").header.limits["max_steps"] for rid in runs]
    assert steps == [5, 4, 3]


# ---------------------------------------------------------------------------- the stop answer
def _sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("{}`~<>/ codeCODE\n\"':xy[]")), max_size=60) | st.text(max_size=60))
def test_inert_text_holds_no_json_object_fence_or_code_tag_and_keeps_the_rest(text: str) -> None:
    from loopfence.proxy._answer import inert
    out = inert(text)
    assert not set(out) & set("{}`") and "~~~" not in out
    assert "<code" not in out.lower().replace(" ", "") and "</code" not in out.lower().replace(" ", "")
    if not set(text) & set("{}`~<"):
        assert out == text  # nothing else is touched
    assert inert(out) == out


def test_every_stop_answer_is_a_complete_chat_completion_streamed_and_not(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply("ok", usage=(7, 2))) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), "--limit", "max_steps=1",
                  stderr=tmp_path / "err") as proxy:
        named = {"X-Loopfence-Run": "s1"}
        first = post(proxy.base_url, [{"role": "user", "content": "q0"}], named, stream=True,
                     stream_options={"include_usage": True})
        chunks = _sse(first.text)
        for c in chunks:
            ChatCompletionChunk.model_validate(c)
        assert {(c["id"], c["model"], c["created"] > 0) for c in chunks} == {(chunks[0]["id"], "m-asked", True)}
        plain = post(proxy.base_url, [{"role": "user", "content": "q1"}], named)
        streamed = post(proxy.base_url, [{"role": "user", "content": "q2"}], named, stream=True,
                        stream_options={"include_usage": True})
        bare = post(proxy.base_url, [{"role": "user", "content": "q3"}], named, stream=True)
        again = post(proxy.base_url, [{"role": "user", "content": "q4"}], named)
        retried = post(proxy.base_url, [{"role": "user", "content": "q1"}], named)  # the stopped request again
    answer = ChatCompletion.model_validate(plain.json())
    assert plain.headers["x-loopfence-stop"] == "max_steps"
    assert answer.usage is not None and answer.usage.total_tokens == 0
    assert answer.model == "m-asked" and answer.created > 0 and answer.id.startswith("chatcmpl-")
    text = answer.choices[0].message.content or ""
    assert text.startswith(STOP_MARKER) and "max_steps" in text and "limit 1" in text
    assert again.json() == plain.json() == retried.json()  # every answer to a stopped run is the same
    for r in (streamed, bare):
        parts = [ChatCompletionChunk.model_validate(c) for c in _sse(r.text)]
        assert {(p.id, p.model, p.created) for p in parts} == {(answer.id, "m-asked", answer.created)}
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == text
    usage = [p for p in (ChatCompletionChunk.model_validate(c) for c in _sse(streamed.text)) if p.usage is not None]
    assert len(usage) == 1 and usage[0].usage is not None and usage[0].usage.total_tokens == 0
    assert len(up.requests) == 1


def test_an_unknown_route_is_a_json_404_in_its_wire_s_shape_naming_what_is_served(tmp_path: Path) -> None:
    with ReplyServer(lambda body: text_reply("ok")) as up, \
            Proxy("--upstream", up.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as proxy:
        root = proxy.base_url.removesuffix("/v1")
        anthropic = httpx.post(f"{root}/v1/messages/batches", json={"requests": []}, timeout=30)
        doubled = httpx.post(f"{root}/v1/v1/messages", json={"model": "m", "messages": []}, timeout=30)
        gemini = httpx.post(f"{root}/v1beta/models/g:embedContent", json={}, timeout=30)
        responses = httpx.post(f"{root}/v1/embeddings", json={"model": "m", "input": "hi"}, timeout=30)
        nowhere = httpx.get(f"{root}/nowhere", timeout=30)
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "not_found_error"
    assert gemini.status_code == 404 and gemini.json()["error"]["status"] == "NOT_FOUND"
    for r in (responses, nowhere):
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_route"
    assert doubled.status_code == 404 and "with no /v1" in doubled.json()["error"]["message"]  # ANTHROPIC_BASE_URL
    for r, path in ((anthropic, "/v1/messages/batches"), (gemini, "/v1beta/models/g:embedContent"),
                    (responses, "/v1/embeddings"), (nowhere, "/nowhere")):
        message = (r.json()["error"]["message"])
        assert path in message and "POST /v1/chat/completions" in message, message
    assert up.requests == []
