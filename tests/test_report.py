"""`loopfence report` (issue 17, must-show 3): self-contained HTML pages for a run and for a batch /
drill folder, checked as text here and in a real headless Chromium (Debian's `chromium`, driven by
Playwright through that executable; no browser download)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopfence import Guard, Limits, RunLog, ScriptedModel, refusal, run, tool, workspace_tools
from loopfence._report import read_dir, write_dir_report, write_run_report
from loopfence.cli import cli
from loopfence.models import OpenAIModel
from loopfence.testing import FakeServer, calls_reply, text_reply, tool_call

CHROMIUM = "/usr/bin/chromium"
RATE_LIMITED = {"status": 429, "body": {}, "headers": {"retry-after-ms": "20"}}
HOSTILE = '</pre></details><img src="http://203.0.113.9/x.png"><script>alert("pwned")</script>'


class NoWrites(Guard):
    def before_execution(self, s: Any, c: Any, reuse: bool) -> Any:
        return refusal("writes are off in this test") if c.tool.name == "write_file" else None


def _run_log(tmp_path: Path, name: str = "run.jsonl") -> Path:
    """A real run over loopback HTTP: a retried 429, a read, the read again (reused), a listing, a
    refused write, a hostile page read as a file, the answer."""
    ws = tmp_path / "ws"
    (ws / "app").mkdir(parents=True, exist_ok=True)
    (ws / "app" / "config.py").write_text("DEBUG = True\n", encoding="utf-8")
    (ws / "notes.txt").write_text(HOSTILE + "\n", encoding="utf-8")
    script = [RATE_LIMITED,
              calls_reply(tool_call("read_file", path="app/config.py"), usage=(50, 10)),
              calls_reply(tool_call("read_file", path="app/config.py"), tool_call("list_dir"),
                          tool_call("write_file", path="x.txt", content=HOSTILE), usage=(80, 12)),
              calls_reply(tool_call("read_file", path="notes.txt"), usage=(120, 9)),
              text_reply("DEBUG is True " + HOSTILE, usage=(150, 30))]
    log = tmp_path / name
    with FakeServer(script) as srv, OpenAIModel(srv.base_url, "fake-model") as model:
        result = run("Read app/config.py", model=model, tools=workspace_tools(ws), limits=Limits(max_steps=8),
                     log=RunLog(log), guards=[NoWrites()])
    assert result.stop.reason == "final_answer"
    return log


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_log(tmp_path_factory.mktemp("run"))


# -- the run page as text -----------------------------------------------------------------------------
def test_the_run_page_is_self_contained_and_escapes_what_the_run_saw(run_log: Path, tmp_path: Path) -> None:
    page = write_run_report(run_log, tmp_path / "run.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in page and "default-src 'none'" in page
    # nothing to fetch: no src=, no stylesheet link, no URL outside the escaped text
    assert not re.search(r"<(img|script|link|iframe)[^>]*\s(src|href)=", page, re.I)
    assert page.count("<script>") == 1  # ours, at the end; the hostile one is text
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert 'id="stop-reason">final_answer<' in page and 'class="stop SHIP"' in page
    assert page.count('<details class="step"') == 4
    for decision in ("executed", "reused", "refused"):
        assert re.search(f'<span class="badge {decision}"( title="[^"]+")?>{decision}</span>', page), decision
    assert "retry: attempt 1 failed (HTTP 429" in page
    chart = re.search(r'<svg id="token-chart".*?</svg>', page, re.S)
    assert chart and chart.group(0).count("<rect") == 2 * 4  # prompt + completion, per turn
    assert "max_steps" in page and "4 of 8 (50%)" in page  # a budget against its limit


def test_a_lone_surrogate_the_run_saw_is_written_as_its_escape(tmp_path: Path) -> None:
    """"\\ud800" is valid JSON a model may send; UTF-8 cannot hold it, so the page shows its escape."""
    log = tmp_path / "r.jsonl"
    run("t", model=ScriptedModel([text_reply("before \ud800 after")]), log=log)
    page = write_run_report(log, tmp_path / "r.html")
    assert "before \\ud800 after" in page.read_text(encoding="utf-8")


def test_a_long_result_is_clipped_and_a_log_without_its_stop_says_so(tmp_path: Path) -> None:
    def big() -> str:
        """A large result."""
        return "x" * 50_000

    log = tmp_path / "big.jsonl"
    run("t", model=ScriptedModel([calls_reply(tool_call("big")), text_reply("ok")]), tools=[tool(big)],
        log=RunLog(log))
    page = write_run_report(log).read_text(encoding="utf-8")
    (content,) = [e["content"] for e in map(json.loads, log.read_text(encoding="utf-8").splitlines())
                  if e["event"] == "result"]
    assert len(content) > 10_000
    assert "x" * 4_000 in page and "x" * 4_001 not in page
    assert f"{len(content) - 4_000:,} more characters in the log" in page
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]) + '{"event": "sto', encoding="utf-8")  # killed mid-write
    page = write_run_report(cut).read_text(encoding="utf-8")
    assert "NO STOP" in page and "torn last line" in page and 'class="stop NONE"' in page


def test_a_resumed_log_shows_every_segments_stop_under_the_limits_it_went_on_with(tmp_path: Path) -> None:
    from loopfence.runlog import resume

    (tmp_path / "a.txt").write_text("hello\n", encoding="utf-8")
    log = tmp_path / "resumed.jsonl"
    down = {"status": 400, "body": {"error": {"message": "the endpoint is down"}}}  # not retried
    read = calls_reply(tool_call("read_file", path="a.txt"))
    with FakeServer([read, down]) as srv, OpenAIModel(srv.base_url, "m1") as model:
        first = run("Read a.txt", model=model, tools=workspace_tools(tmp_path), limits=Limits(max_steps=2),
                    log=RunLog(log))
    assert first.stop.reason == "endpoint_error"
    listing = calls_reply(tool_call("list_dir"))
    with FakeServer([listing, text_reply("all read")]) as srv, OpenAIModel(srv.base_url, "m2") as model:
        went_on = resume(log, model=model, tools=workspace_tools(tmp_path), limits={"max_steps": 4})
    assert went_on.result is not None and went_on.result.stop.reason == "final_answer"
    stops = [(n, e) for n, e in enumerate(map(json.loads, log.read_text(encoding="utf-8").splitlines()), 1)
             if e["event"] == "stop"]
    assert [e["reason"] for _, e in stops] == ["endpoint_error", "final_answer"]
    page = write_run_report(log).read_text(encoding="utf-8")
    line, stop1 = stops[0]
    assert page.count("endpoint_error") >= 2  # in the stop block's segments and on the timeline
    assert f"endpoint_error</span> (KILL, line {line})" in page and f"(KILL, line {line}) at " in page
    assert stop1["detail"].split(";")[0] in page
    assert page.index("endpoint_error</b>") < page.index("resumed after line")  # the stop, then the resume
    used = stops[1][1]["ledger"]["model_requests"]
    assert used > 2 and f"{used} of 4 ({used / 4:.0%})" in page  # max_steps as the run went on, not 2


def test_report_command_for_a_log(run_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "page.html"
    assert cli(["report", str(run_log), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.stat().st_size > 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "header"}\n', encoding="utf-8")
    assert cli(["report", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert cli(["report", str(tmp_path / "nothing")]) == 2
    assert cli(["report", str(tmp_path)]) == 2  # a folder that is neither a batch nor a drill
    assert "neither a batch folder" in capsys.readouterr().err


def test_report_command_reads_the_log_once(run_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The order check and the page read the same lines: one read of the log (up to 256 MiB), not two."""
    import loopfence._commands.report as command
    import loopfence._report._run as page
    from loopfence._log._reader import read_log
    reads: list[str] = []

    def counted(path: Any, *args: Any, **kw: Any) -> Any:
        reads.append(str(path))
        return read_log(path, *args, **kw)

    for module in (command, page):
        monkeypatch.setattr(module, "read_log", counted)
    assert cli(["report", str(run_log), "-o", str(tmp_path / "page.html")]) == 0
    assert reads == [str(run_log)] and "DEBUG" in (tmp_path / "page.html").read_text(encoding="utf-8")
    capsys.readouterr()


# -- batch and drill folders ----------------------------------------------------------------------------
STOPS = [("final_answer", "SHIP")] * 6 + [("max_steps", "KILL"), ("repeated_call", "KILL"), ("no_progress", "KILL")]


def make_batch(folder: Path, n: int, log: Path) -> Path:
    """A batch folder in `loopfence batch`'s format: job.json, results.jsonl, summary.json and
    episodes/ID.jsonl (a copy of one real log each); every other episode expects final_answer."""
    (folder / "episodes").mkdir(parents=True)
    rnd = random.Random(17)
    rows = []
    for i in range(n):
        stop, verdict = STOPS[i % len(STOPS)]
        ident = f"ep-{i:05d}"
        shutil.copyfile(log, folder / "episodes" / f"{ident}.jsonl")
        prompt, completion = rnd.randint(100, 90_000), rnd.randint(5, 400)
        rows.append({"id": ident, "stop": stop, "verdict": verdict, "detail": f"{stop} detail",
                     "requests": rnd.randint(1, 12), "tool_calls": 3, "executions": 2, "reuses": 1,
                     "refusals": 0, "rejections": 0, "prompt_tokens": prompt, "completion_tokens": completion,
                     "tokens": prompt + completion, "seconds": round(rnd.random() * 5, 6), "final_answer": None,
                     "metadata": {"expected_stop": "final_answer"} if i % 2 else {}, "attempts": 1,
                     "resumed": False, "log": f"episodes/{ident}.jsonl", "cpu_s": None})
    rows.append({"id": "broken", "stop": None, "verdict": None, "detail": "workspace missing", "metadata": {},
                 "attempts": 1, "resumed": False, "log": None, "error": "workspace missing"})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps({"format": "loopfence.batch", "version": 1,
                                                     "episodes": n + 1, "pending": 0}), encoding="utf-8")
    (folder / "job.json").write_text(json.dumps({"format": "loopfence.batch.job", "version": 1,
                                                 "created_at": "2026-01-01T00:00:00+00:00", "episodes": n + 1}),
                                     encoding="utf-8")
    return folder


def test_the_batch_page_counts_stops_and_links_each_episode_page(run_log: Path, tmp_path: Path) -> None:
    folder = make_batch(tmp_path / "job", 18, run_log)
    index = write_dir_report(folder)
    assert index == folder / "report.html"
    page = index.read_text(encoding="utf-8")
    view = read_dir(folder)
    assert view.kind == "batch" and len(view.rows) == 19 and view.ship_rate == 12 / 18
    assert "66.7%" in page and "SHIP rate (12 of 18)" in page
    chart = re.search(r'<svg id="stop-chart".*?</svg>', page, re.S)
    assert chart and "final_answer: 12" in chart.group(0) and "max_steps: 2" in chart.group(0) \
        and "error: 1" in chart.group(0)
    assert page.count('<a href="episodes/ep-') == 18 and (folder / "episodes" / "ep-00003.html").exists()
    episode = (folder / "episodes" / "ep-00003.html").read_text(encoding="utf-8")
    assert '<a href="../report.html">' in episode and 'id="stop-reason">final_answer<' in episode
    assert "workspace missing" in page
    # expectations: 9 episodes expect final_answer; 1, 5 and 7 (of 1..17 odd) ended otherwise
    assert "with expectations passed" in page and 'class="badge fail">FAIL' in page


def test_a_drill_folder_gets_its_decision_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    drills = Path(__file__).resolve().parent.parent / "drills"
    picked = tmp_path / "scenarios"
    picked.mkdir()
    for name in ("000-invalid-json.json", "000-same-read-3x.json"):
        shutil.copy(drills / name, picked / name)
    out = tmp_path / "drill-out"
    cli(["drill", str(picked), "--out", str(out)])
    capsys.readouterr()
    assert cli(["report", str(out), "-o", str(tmp_path / "drill.html")]) == 0
    page = (tmp_path / "drill.html").read_text(encoding="utf-8")
    assert "loopfence drill" in page and '<table id="decisions">' in page
    assert "2/2 with expectations passed" in page and page.count('class="badge pass">pass') >= 2
    assert 'href="drill-out/000-invalid-json.html"' in page


# -- in a real headless Chromium -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} missing: `make chromium` installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} missing (`make chromium` installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class Watched:
    """A page with every console message, page error, request and dialog recorded."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1200, "height": 900})
        self.page = self.context.new_page()
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, path: Path) -> Any:
        url = path.resolve().as_uri()
        self.page.goto(url, wait_until="load")
        self.page.wait_for_load_state("networkidle")
        assert self.requests == [url], f"the page fetched: {self.requests[1:]}"
        return self.page

    def check_clean(self) -> None:
        bad = [m for m in self.console if m[0] in ("error", "warning")]
        assert not bad and not self.errors and not self.dialogs, (bad, self.errors, self.dialogs)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    w = Watched(browser)
    yield w
    w.close()


def test_the_run_page_in_chromium(run_log: Path, tmp_path: Path, watched: Watched) -> None:
    page = watched.open(write_run_report(run_log, tmp_path / "run.html"))
    assert page.locator("#stop-reason").inner_text() == "final_answer"
    assert page.locator("#stop .verdict").inner_text() == "SHIP"
    chart = page.locator("#token-chart")
    assert chart.is_visible() and chart.bounding_box()["height"] > 100
    assert page.locator("#token-chart rect").count() == 8
    step = page.locator("#step-2")
    calls = step.locator("tr.call")
    assert step.get_attribute("open") is None and not calls.first.is_visible()
    step.locator("> summary").click()  # expand a step
    assert step.get_attribute("open") is not None and calls.count() == 3 and calls.first.is_visible()
    assert [calls.nth(i).locator(".badge").first.inner_text() for i in range(3)] == ["reused", "executed", "refused"]
    step.locator("> summary").scroll_into_view_if_needed()
    shot = tmp_path / "run-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    page.locator("button[data-open='1']").click()  # expand all
    assert page.locator("details.step:not([open])").count() == 0
    page.locator("#step-4 details.inner > summary").first.click()  # the reply text: hostile, and text
    reply = page.locator("#step-4 pre").first
    assert reply.is_visible() and 'alert("pwned")' in reply.inner_text()
    assert page.locator("img").count() == 0
    watched.check_clean()


def test_the_batch_page_with_1000_episodes_loads_and_sorts_in_chromium(
        run_log: Path, tmp_path: Path, watched: Watched) -> None:
    folder = make_batch(tmp_path / "job", 1000, run_log)
    page = watched.open(write_dir_report(folder, episode_pages=False))
    rows = page.locator("#episodes tbody tr")
    assert rows.count() == 1001
    assert "SHIP rate" in page.locator("#summary").inner_text()
    assert page.locator("#stop-chart").is_visible()

    def column(index: int) -> list[str]:
        return page.evaluate(f"Array.from(document.querySelectorAll('#episodes tbody tr'))"
                             f".map(r => r.cells[{index}].getAttribute('data-v'))")

    tokens = page.locator("#episodes th", has_text="tokens")
    at = page.evaluate("Array.from(document.querySelectorAll('#episodes th')).findIndex(t => t.textContent == 'tokens')")
    tokens.click()
    values = [int(v) for v in column(at)]
    assert values == sorted(values) and values[0] < values[-1]
    assert page.locator("#episodes").get_attribute("data-sorted") == f"+{at}"
    tokens.click()
    values = [int(v) for v in column(at)]
    assert values == sorted(values, reverse=True)
    page.locator("#episodes th", has_text="episode").click()
    ids = column(0)
    assert ids == sorted(ids)
    page.locator("input[data-filter]").fill("ep-00421")
    assert page.locator("#episodes tbody tr:visible").count() == 1
    shot = tmp_path / "batch-page.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    watched.check_clean()


def test_an_episode_link_opens_its_page_and_leads_back(run_log: Path, tmp_path: Path, watched: Watched) -> None:
    folder = make_batch(tmp_path / "job", 9, run_log)
    page = watched.open(write_dir_report(folder))
    page.locator("#episodes a", has_text="ep-00004").click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/episodes/ep-00004.html")
    assert page.locator("#stop-reason").inner_text() == "final_answer"
    page.locator("a", has_text="the batch").click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/job/report.html")
    assert all(u.startswith("file://") for u in watched.requests)
    watched.check_clean()
