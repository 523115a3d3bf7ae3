"""The docs' chat service (docs/examples/chat_service.py) under uvicorn on a loopback port, a real
httpx client reading its server-sent events, a FakeServer upstream streaming scripted replies: two
turns of one conversation (the second sent the first's messages), text reaching the client before
the reply ends, a runaway third turn ending with its named stop as the last event, and every turn's
log reconciling and replaying."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from loopfence import Agent, Limits, tool
from loopfence.models import OpenAIModel
from loopfence.models._sse import iter_events
from loopfence.runlog import reconcile, replay
from loopfence.testing import FakeServer, calls_reply, text_chunks, tool_call

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "chat_service.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("chat_service", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["chat_service"] = module
    spec.loader.exec_module(module)
    return module


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _slow(*pieces: str) -> dict:
    return {"fault": "slow_stream", "delay_s": 0.05, **text_chunks(*pieces)}


SCRIPT = [  # one sequence across the turns' runs
    _slow("The capital ", "of France ", "is Paris."),  # turn 1
    _slow("You asked ", "about France."),  # turn 2
    *(calls_reply(tool_call("lookup", key=f"k{i}")) for i in range(6)),  # turn 3: it never stops calling
]


class Service:
    def __init__(self, app) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Service:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def _turn(client: httpx.Client, url: str, message: str) -> list[tuple[float, str, dict]]:
    """(time received, event, data) for each server-sent event of one turn."""
    out = []
    with client.stream("POST", url, json={"message": message}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for ev in iter_events(resp.iter_lines()):
            out.append((time.monotonic(), ev.event, json.loads(ev.data)))
    return out


def test_chat_service_continues_streams_and_stops(tmp_path: Path) -> None:
    example = _load_example()
    with FakeServer(SCRIPT, across_runs=True) as upstream, \
            OpenAIModel(upstream.base_url, "fake", stream=True) as model:
        agent = Agent(model=model, tools=[lookup], limits=Limits(max_steps=3), log=str(tmp_path / "logs"))
        with Service(example.build_app(agent)) as svc, httpx.Client(timeout=30) as client:
            url = f"{svc.url}/chat/c1"
            first = _turn(client, url, "What is the capital of France?")
            second = _turn(client, url, "What did I ask about?")
            third = _turn(client, url, "Look up everything.")

        for events, answer in ((first, "The capital of France is Paris."), (second, "You asked about France.")):
            deltas = [(t, d["text"]) for t, kind, d in events if kind == "delta"]
            assert "".join(text for _, text in deltas) == answer
            assert len(deltas) >= 2 and deltas[0][0] < deltas[-1][0]  # text arrived before the reply ended
            assert events[-1][1] == "answer" and events[-1][2]["text"] == answer

        # the second turn's run started from the first's messages, plus the new user message
        turn2 = [body for body in upstream.requests if body["messages"][-1]["content"] == "What did I ask about?"]
        said = [(m["role"], m["content"]) for m in turn2[0]["messages"] if m["role"] != "system"]
        assert said == [("user", "What is the capital of France?"), ("assistant", "The capital of France is Paris."),
                        ("user", "What did I ask about?")]

        kind, data = third[-1][1], third[-1][2]  # the runaway: its named stop is the last event
        assert kind == "stop" and not [e for e in third[:-1] if e[1] in ("stop", "answer")]
        assert (data["reason"], data["limit"], data["value"]) == ("max_steps", 3, 4)

        for events in (first, second, third):  # each turn's log reconciles and replays to its stop
            log = events[-1][2]["log"]
            assert reconcile(log).ok, reconcile(log)
            report = replay(log)
            assert report.ok and report.same_stop


def test_the_service_as_uvicorn_builds_it_reads_the_file_and_stops_a_runaway(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`uvicorn chat_service:app` as the docs run it (from docs/examples, LOOPFENCE_BASE_URL set): its
    model has the workspace's read tools, so the docstring's question is answered from the file, and
    a model that keeps calling tools is stopped, named, as the turn's last event."""
    script = [calls_reply(tool_call("read_file", path="app/config.py")),
              _slow("app/config.py sets ", "DEBUG = False."),
              *(calls_reply(tool_call("list_dir", path=".")) for _ in range(30))]
    with FakeServer(script, across_runs=True) as upstream:
        monkeypatch.setenv("LOOPFENCE_BASE_URL", upstream.base_url)
        monkeypatch.setenv("LOOPFENCE_MODEL", "fake")
        monkeypatch.setenv("CHAT_WORKSPACE", str(EXAMPLE.parent))
        monkeypatch.setenv("CHAT_LOGS", str(tmp_path / "logs"))  # never inside the workspace (else: refused)
        example = _load_example()
        assert example.app is not None
        with Service(example.app) as svc, httpx.Client(timeout=30) as client:
            first = _turn(client, f"{svc.url}/chat/42", "What is in app/config.py?")
            runaway = _turn(client, f"{svc.url}/chat/42", "Keep listing.")
    results = [m["content"] for m in upstream.requests[1]["messages"] if m["role"] == "tool"]
    assert len(results) == 1 and "DEBUG = False" in results[0]  # the answer stands on the file as it is
    assert first[-1][1] == "answer" and first[-1][2]["text"] == "app/config.py sets DEBUG = False."
    kind, data = runaway[-1][1], runaway[-1][2]
    assert kind == "stop" and data["reason"] in ("max_steps", "repeated_call", "no_progress"), data
    assert not [e for e in runaway[:-1] if e[1] in ("stop", "answer")]
    assert reconcile(data["log"]).ok


def test_a_client_that_leaves_mid_answer_leaves_the_streamed_text_in_the_log(tmp_path: Path) -> None:
    example = _load_example()
    pieces = [f"piece {i}. " for i in range(150)]  # 15 s of text: the client leaves long before its end
    with FakeServer([{"fault": "slow_stream", "delay_s": 0.1, **text_chunks(*pieces)}]) as upstream, \
            OpenAIModel(upstream.base_url, "fake", stream=True) as model:
        agent = Agent(model=model, log=str(tmp_path / "logs"))
        with Service(example.build_app(agent)) as svc, httpx.Client(timeout=30) as client:
            got = []
            with client.stream("POST", f"{svc.url}/chat/1", json={"message": "Talk."}) as resp:
                for ev in iter_events(resp.iter_lines()):
                    got.append(json.loads(ev.data)["text"])
                    if len(got) == 3:
                        break  # the client leaves mid-answer
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                logs = list((tmp_path / "logs").glob("*.jsonl"))
                last = json.loads(logs[0].read_text(encoding="utf-8").splitlines()[-1]) if logs else {}
                if last.get("event") == "stop":
                    break
                time.sleep(0.05)
    assert last.get("event") == "stop" and last["reason"] == "cancelled", last
    assert last["partial_text"] and last["partial_text"].startswith("".join(got)), (last["partial_text"], got)
    assert len(last["partial_text"]) < len("".join(pieces))  # what was streamed, not the whole reply
    assert reconcile(logs[0]).ok
    assert replay(logs[0]).ok  # the replayed stop keeps the same partial_text


def test_the_service_refuses_logs_the_model_could_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPFENCE_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CHAT_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("CHAT_LOGS", str(tmp_path / "chat-logs"))
    with pytest.raises(SystemExit, match="inside CHAT_WORKSPACE"):
        _load_example()
