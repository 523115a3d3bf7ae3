"""A restart: every run logged in the log folder is folded back, so it continues where it was.

As `loopfence resume` does, the log is read back to its last complete line (a torn last line is cut
off the file) and the run's limits, policy and tools come from its header (`_drivers._rebuild`). The
run's own steps are then run again over the recorded traffic, into a log kept in memory: each
recorded request through `before_request`, each recorded reply through the contract and the guards,
each recorded result through `FencedRun.call`. That rebuilds the ledger, the repeat counts, the
result streaks, cycles and the clock exactly as the run left them; the file is then appended to.

The proxy's notes (`.proxy/<run id>.jsonl`) give what the log does not hold: who opened the run, and
each request's digest with the answer it got. So a request answered before the crash gets the same
answer again, never forwarded twice; one whose reply was logged but not yet answered gets the answer
that reply makes; one sent upstream with no reply logged is forwarded once more, under the same count.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from .._log import LogError
from .._log._schema import ReplyLine, RequestLine, ResultLine, StopLine
from .._log._reader import RunLogFile, read_log
from .._log._writer import RunLog
from .._messages import Reply
from .._stops import Stop, StopReason
from .._drivers._rebuild import limits_of, policy_of
from .._setup import model_cap
from ..integrations._config import Fence
from ..integrations._fence import FenceStop, versions
from ._answer import Answer
from ._runs import FRAMEWORK, NOTES, Runs, WireRun, handed, keyed, precheck, value_of
from ._view import TEXT_TOOLS

__all__ = ["restore", "fold", "proxy_run"]


async def restore(runs: Runs) -> int:
    """Fold back every proxy run logged in the log folder; how many were restored."""
    logs = runs.settings.logs
    if logs is None or not logs.is_dir():
        return 0
    folded = []
    for path in sorted(logs.glob("*.jsonl")):
        try:
            one = await _restore_one(runs, path)
        except (LogError, ValueError, KeyError, TypeError):  # not a proxy run we can continue: left as it is
            continue
        if one is not None:
            folded.append((not one[0].fenced.finished, path.stat().st_mtime_ns, one))
    # Two runs may have reached the same conversation (two clients sending the same one): as when
    # live, the run that reached it last owns it, and a run still going wins over a finished one.
    folded.sort(key=lambda x: x[:2])
    n = 0
    for _, _, (run, notes, last_reply, named) in folded:
        if run.id in runs.runs:  # one run, one log: a copy of it is left as it is
            continue
        try:
            _answers(runs, run, notes, last_reply)
        except (ValueError, KeyError, TypeError):  # notes we cannot read: the run is not continued
            continue
        runs.add(run, named)
        runs.hold_open(run)
        n += 1
    return n


def _notes(path: Path) -> list[dict[str, Any]]:
    """The notes, each whole line; a torn last line (a kill mid-write) is cut off the file, so the
    notes written after the restart start on a line of their own."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        os.truncate(path, len(whole))
    out = []
    for line in whole.decode("utf-8", "replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


async def _restore_one(runs: Runs, path: Path) -> tuple[WireRun, list[dict[str, Any]], Reply | None, Any] | None:
    """The run logged at `path` folded back (its notes, the last reply logged, its name), or None."""
    log = read_log(path, tolerant=True)
    rid = proxy_run(log)
    if rid is None or rid in runs.runs:
        return None
    notes_path = path.parent / NOTES / f"{rid}.jsonl"
    notes = _notes(notes_path)
    start = next((n["start"] for n in notes if "start" in n), {})
    if log.torn_bytes:
        os.truncate(path, log.complete_bytes)
    run, last_reply = await fold(log, rid, start.get("owner"), start.get("model"), str(path))
    run.notes = notes_path
    run.opening, run.task = str(start.get("opening") or ""), frozenset(start.get("task") or ())
    reset = any("reset" in n for n in notes)  # reset: its name was freed, a restart does not give it back
    return run, notes, last_reply, None if reset else start.get("named")


def proxy_run(log: RunLogFile) -> str | None:
    """The proxy's id of the run `log` holds, or None for a log the proxy did not write."""
    framework = log.header.record.get("framework")
    proxy = log.header.record.get("proxy")
    if not (isinstance(framework, dict) and framework.get("name") == FRAMEWORK and isinstance(proxy, dict)):
        return None
    return str(proxy["run"])


async def fold(log: RunLogFile, rid: str, owner: str | None, model: str | None, path: str | None, *,
               t0: float | None = None) -> tuple[WireRun, Reply | None]:
    """The run `log` holds, its steps run again over the recorded traffic (the module doc), and the
    last reply logged. Its log goes on in the file `path` (appended) or, with None, in memory from the
    next line; its clock from `t0` (monotonic), else from where the log's last event left it."""
    h = log.header
    fence = Fence(limits=limits_of(h, log.path), policy=policy_of(h, log.path),
                  kinds={s.name: s.kind for s in h.specs})
    tools = [handed(fence, s.name, s.parameters, s.description) for s in h.specs]
    model = str(model or (h.model.get("model") if isinstance(h.model, dict) else "") or "")
    f = fence.start(h.task, tools, framework=FRAMEWORK, version=versions("loopfence"), model=model, system=h.system,
                    header={"proxy": h.record.get("proxy")},
                    model_max_tokens=model_cap(h.model) if h.version >= 6 else None)
    f.state.run_id = h.run_id  # the same run upstream: its requests carry the same id
    proxy = h.record.get("proxy") if isinstance(h.record.get("proxy"), dict) else {}
    run = WireRun(rid, f, owner, model, log=path, tools=frozenset(s.name for s in h.specs if s.name not in TEXT_TOOLS),
                  session=proxy.get("session"))
    last_reply, last_t = None, 0.0
    for e in log.events:
        last_t = e.t
        try:
            if isinstance(e, RequestLine):
                await f.before_request()
                last_reply = None
            elif isinstance(e, ReplyLine):
                last_reply = e.reply()
                f.reply(last_reply)
            elif isinstance(e, ResultLine) and e.decision != "rejected" and e.error != "not_executed" \
                    and not f.finished:
                await f.call(e.tool_call_id, value_of(e.content))
            elif isinstance(e, StopLine) and not f.finished:
                f.finish(Stop(e.reason, e.detail, e.data))
        except FenceStop:
            pass
    if path is None or not f.finished:  # the log goes on from here, the clock where it stopped
        live = RunLog(path, append=True, seq=log.next_seq, t0=time.monotonic() - last_t if t0 is None else t0)
        f.log = f.state.log = live
        f.state.t0 = live.t0
        run.reopened = last_reply is None and f.state.ledger.model_requests > 0 and isinstance(log.events[-1], RequestLine)
    return run, last_reply


def _answers(runs: Runs, run: WireRun, notes: list[dict[str, Any]], last_reply: Reply | None) -> None:
    """The run's latest request and its answer (noted, or made again from the logged reply), its stop."""
    f = run.fenced
    asked = [n for n in notes if "asked" in n]
    answered = {n["answered"]: Answer.from_json(n["answer"]) for n in notes if "answered" in n}
    for made in answered.values():  # the answers it gave: a rebuilt history is placed by its last one
        if made.stop is None:
            runs.gave(run, made)
    if f.result is not None and f.result.stop.reason is not StopReason.FINAL_ANSWER:
        runs.stop_answer(run, f.result.stop)
    tails = {n["asked"]: n["tail"] for n in asked}
    for n in notes:  # the conversations it reached: a request extending the last (or retrying it) finds the run
        if "answered" in n and n["answered"] in tails:
            runs.remember(run, tails[n["answered"]])
    if not asked:
        return
    whole, tail = asked[-1]["asked"], asked[-1]["tail"]
    made = answered.get(whole)
    logged = last_reply is not None and f.state.ledger.model_requests == asked[-1].get("step")
    if made is None and not run.reopened and logged:  # its reply logged, not yet answered
        if run.stopped is not None:
            made = run.stopped
        elif f.turn is not None:
            released, _ = precheck(f)
            run.held = {c.call.id for c in f.turn.calls} - {c.call.id for c in released}
            made = runs.reply_answer(run, last_reply, [c.call for c in released])
        else:
            made = runs.reply_answer(run, last_reply, [])
    if made is None:
        return
    fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    fut.set_result(made)
    run.latest = (whole, fut)
    run.delivered = f.finished  # a run that ended before the restart: the same request is a new one
    runs.by_latest[keyed(run.owner, whole)] = run
    if made is not answered.get(whole):
        runs.remember(run, tail)
