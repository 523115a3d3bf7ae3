"""Runs on the wire: which run a request belongs to, and the fence's steps run around it.

Each request is, for its run, what a framework's hooks are for an integration (`FencedRun`):

    the results its tool messages carry -> `FencedRun.call` for each call the last answer released
      (executions counted, results fingerprinted, repeated_result, cycles), in the reply's order
    -> `model_request`: after_turn, the budgets, context fit, `max_tokens` capped -> the upstream
    -> the reply: the complete-object gate, the contract against the run's tools, keys bound to the
       schemas (defaults applied), then the calls the guards would refuse are held back (below)
    -> the answer: the reply with the calls released, or the stop

The proxy does not run tools, so a refusal cannot be a result it hands the model: the calls a reply
asks for are checked, before the client sees them, by a copy of the run's guards in the ring's order.
A call the copy would stop is not released: when it is the reply's first, the run stops now (the
guards themselves decide, on the real state); when calls before it may run, those are released and
the stop comes with the next request, once their results are in. The log is the ring's, event for
event, so `reconcile` and `replay` fold it like any other run.

Run identity (docs/proxy.md, "Which run a request belongs to"): a run name (the `X-Loopfence-Run`
header, scoped to the client's key) names the run for as long as the name lives; else a request
continues the run whose latest request it extends, compared on a normalised view of each message
(`_view`: role, flattened text, calls from `tool_calls` or from recognised call text), among runs
whose tools it declares no more than; anything else starts a run. A session header scopes that
search to the session's conversations (`Incoming.scoped`), and a session's new conversation starts
with the budgets its others left. A request identical to its run's latest one is a retry while that
is in flight, or just after an answer that never reached its client (`retrying`): it shares that
answer, and is never forwarded twice; after a delivered answer it is a new request.

Text actions: a run with no tools (and any named run) fences the action of a reply with no tool calls
(its code blocks, else its text) as a call of the `text_action` tool, a side effect, whose result is
the next request's user messages; re-rendered results ("Call id: c0\nObservation: ...") answer the
calls they name, else the calls in order. A run whose last calls never get a result ends when its
client says so (`end`: the reset route), or when idle past `expire_after`, its last reply the answer.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import inspect
import json
import re
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import Encoded, canonical_json, loads
from .._limits import Limits, Policy
from .._log._writer import RunLog
from .._messages import Reply, Request
from .._repeats import outcome_fingerprint
from .._steps import on_the_clock
from .._stops import Stop, StopError, StopReason
from ..integrations._config import Fence
from ..integrations._fence import FencedRun, FenceStop, versions
from ..tools._executor import ToolResult
from ..tools._registry import Tool, ToolKind
from ._answer import WIRE_EXTRA, Answer
from ._upstream import DIALECTS, Relay, Upstream
from ._view import (TEXT_ACTION, TEXT_ACTION_SCHEMA, TEXT_POLL, TEXT_TOOLS, action_of, answer_digest, call_ids_in, flat,
                    item_of, program_of, task_marks)
from ._wire import BadRequest, Incoming

__all__ = ["Runs", "Settings", "WireRun", "RUN_ID", "RETRY_S", "FRAMEWORK", "NOTES", "keyed", "opening", "precheck",
           "value_of", "handed", "id_base", "numbered", "no_cursor"]

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A request identical to its run's latest is a retry while that is in flight, or up to this many seconds
# after its answer was made, unless the answer reached the client (then it is a new sample: pass@k)
RETRY_S = 10.0
MAX_GIVEN = 8  # the answers a run remembers giving (a rebuilt history is placed by its last ones)
MAX_SAME_OPENING = 256  # the runs one system prompt finds for a rebuilt history, newest first
MAX_SPECS = 64  # distinct tool sets whose parsed specs the runs share (`Runs.shared_specs`)
FRAMEWORK = "loopfence-proxy"
NOTES = ".proxy"  # the folder, inside the log folder, of the proxy's own notes per run
_NOT_SENT = json.dumps({"ok": False, "error": "not_sent", "message": "the proxy did not release this call to the "
                        "client (a rule refused it)"})


@dataclass(frozen=True)
class Settings:
    """What every run is fenced with. kinds: tool name -> kind (side_effect or poll; see docs/proxy.md)."""

    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    kinds: Mapping[str, ToolKind] = field(default_factory=dict)
    on_stop: str = "answer"  # or "error": HTTP 400, OpenAI's error body, the stop as its code
    logs: Path | None = None
    expire_after: float | None = 86400.0  # seconds a run may be idle before it ends and is forgotten (None: never)
    per_turn: bool = False  # a named run ends at a text answer: the name's next request starts fresh budgets
    session_headers: tuple[str, ...] = ()  # more headers whose value names a session (`_app.SESSION_HEADERS`)
    keep_runs: bool = False  # at shutdown, runs waiting on their clients stay open (a restart continues them)


@dataclass(eq=False)
class WireRun:
    """One run: its fence, whose key opened it, its latest request (digest, answer), the digest of the
    conversation it reached (latest request + answer), and the answer a stop gave."""

    id: str
    fenced: FencedRun
    owner: str | None
    model: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    latest: tuple[str, asyncio.Future[Answer]] | None = None
    conv: str | None = None
    before: str | None = None
    stopped: Answer | None = None
    held: set[str] = field(default_factory=set)  # the last reply's calls not released to the client
    log: str | None = None
    reopened: bool = False  # restored with its last request sent and no reply logged: the retry goes out once
    notes: Path | None = None  # the proxy's own notes on this run (`.proxy/<id>.jsonl`): what restarts need
    touched: float = field(default_factory=time.monotonic)  # its latest request (idle runs expire)
    shared: list[Any] | None = None  # the guards a precheck's copy shares (`uncopied`)
    store: dict[str, Any] = field(default_factory=dict)  # what a shared store keeps beside the log (_redis)
    asked: str | None = None  # the model its latest request asked for (a stop answer names it)
    named: str | None = None  # the run name that routes to it, if any
    seen: str = ""  # the text its latest request brought (a text action's `after`: the output it followed)
    acted: str | None = None  # the action of its last reply (a text action's `after` is kept for the same again)
    answered: float = field(default_factory=time.monotonic)  # when its latest answer was made (or restored)
    delivered: bool = False  # its latest answer reached the client whole: the same request again is a new one
    tools: frozenset[str] = frozenset()  # the names of the tools its requests declare (a request with others is not its)
    session: str | None = None  # the session it is a conversation of (a session header's value)
    opening: str = ""  # the digest of its first request's system messages (`_view.marks`)
    task: frozenset[str] = frozenset()  # the digests its task is known by (`_view.task_marks`)
    given: list[str] = field(default_factory=list)  # the digests of the answers it gave (`_view.answer_digest`)
    notes_out: Any = field(default=None, repr=False)  # its notes file while the run goes on (`note`)

    def note(self, **fields: Any) -> None:
        """One line of notes: who opened the run, each request's digest, each answer given. The file
        stays open while the run goes on (each line written whole as it comes: line-buffered), and is
        closed with its log (`rest`) or once the run has ended."""
        if self.notes is None:
            return
        text = json.dumps(fields) + "\n"  # ASCII: a lone surrogate in an answer is its escape
        if self.notes_out is None:
            self.notes_out = self.notes.open("a", encoding="utf-8", buffering=1)
        self.notes_out.write(text)
        if self.fenced.finished:  # nothing more will come: the file closes (not closed, then opened for this line)
            self.rest()

    def rest(self) -> None:
        """Its notes file closed until the next line (its log rests apart: `RunLog.rest`)."""
        if self.notes_out is not None:
            self.notes_out.close()
            self.notes_out = None

    def describe(self) -> dict[str, Any]:
        f = self.fenced
        result = f.result
        return {"id": self.id, "model": self.model, "log": self.log,
                "ledger": (result.ledger if result is not None else f.state.ledger.snapshot()).to_json(),
                "stop": None if result is None else {**result.stop.to_json(), "verdict": str(result.stop.verdict)}}


def id_base(named: str, owner: str | None) -> str:
    """What a named run's id starts from: the name, under a client key behind that key's tag (its
    digest's first 12 hex digits), so that one key's ids never depend on another's names."""
    return named if owner is None else f"{owner[:12]}.{named}"


def numbered(base: str, n: int) -> str:
    """The id `base` gets as the n-th run of its name: `base`, then `base-2`, ..., cut to stay a run
    id (128 characters at most: a 128-character name's second run is not refused by its own proxy)."""
    if n <= 1:
        return base[:128]
    suffix = f"-{n}"
    return base[:128 - len(suffix)] + suffix


def no_cursor(after: str) -> BadRequest:
    """A listing's `after=` that names no run of this client's (unknown, another key's, or expired)."""
    return BadRequest(f"no run {after[:128]!r} in this client's listing (after=)", "after", 400)


def keyed(owner: str | None, digest: str) -> str:
    """A route's key: the digest under the client key that sent it (one client never lands in
    another's run by sending the same conversation)."""
    return f"{owner or ''}/{digest}"


def opening(messages: list[dict[str, Any]]) -> tuple[str | None, str]:
    """(system, task) for a run's header: the leading system messages' text, then the user messages'
    text, or (a conversation already under way) the rest of the messages as canonical JSON."""
    n = 0
    while n < len(messages) and messages[n].get("role") in ("system", "developer"):
        n += 1
    system = "\n\n".join(flat(m.get("content")) for m in messages[:n]) or None
    rest = messages[n:]
    if all(m.get("role") == "user" for m in rest):
        return system, "\n\n".join(flat(m.get("content")) for m in rest)
    return system, canonical_json(rest)


class Runs:
    """Every run this proxy serves, found by name, by conversation, or by its latest request.
    `max_open_logs`: how many waiting runs keep their log and notes files open; the others rest
    theirs (closed until their next line), so runs a client never ends hold no file descriptors."""

    max_open_logs = 128  # two descriptors each

    def __init__(self, upstream: Upstream, settings: Settings) -> None:
        self.upstream = upstream
        self.settings = settings
        self.runs: dict[str, WireRun] = {}
        self.by_conv: dict[str, WireRun] = {}
        self.by_latest: dict[str, WireRun] = {}
        self.names: dict[tuple[str | None, str], str] = {}  # (client key, run name) -> the run serving it now
        self.sessions: dict[tuple[str | None, str], list[str]] = {}  # (client key, session) -> its runs, oldest first
        self.by_opening: dict[str, list[WireRun]] = {}  # keyed opening digest -> the runs it opened, newest last
        self.warned: set[str] = set()  # the openings whose unplaced continuation was said on stderr
        self.by_answer: dict[str, WireRun] = {}  # keyed id of an answer a client may name (previous_response_id)
        self.specs: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # tool specs by digest, shared by runs
        self.open_logs: OrderedDict[str, WireRun] = OrderedDict()  # runs waiting with their log open, oldest first
        self._swept = time.monotonic()

    # -- what the app reads -----------------------------------------------------------------------
    def visible(self, owner: str | None) -> list[WireRun]:
        return [r for r in self.runs.values() if r.owner == owner]

    async def listing(self, owner: str | None, after: str | None = None,
                      limit: int = 100) -> tuple[list[dict[str, Any]], bool]:
        """A page of the runs opened with this client key (`WireRun.describe`), oldest first: those
        after the run `after`, at most `limit`; and whether more follow."""
        mine = self.visible(owner)
        start = next((i + 1 for i, r in enumerate(mine) if r.id == after), None) if after else 0
        if start is None:
            raise no_cursor(after or "")
        return [r.describe() for r in mine[start:start + limit]], len(mine) > start + limit

    async def one(self, rid: str, owner: str | None) -> dict[str, Any] | None:
        """The run `rid` (its id or the name a client gave it) if this client key opened it."""
        run = self.runs.get(self.names.get((owner, rid), rid))
        return run.describe() if run is not None and run.owner == owner else None

    async def reset(self, rid: str, owner: str | None) -> dict[str, Any] | None:
        """End the run `rid` (its id, or this client's run name) if this client key opened it: a run
        still going ends as its client left it (`end`), and its name is free, so that the name's next
        request starts a run of its own. The run as `one` shows it, or None."""
        run = self.runs.get(self.names.get((owner, rid), rid))
        if run is None or run.owner != owner:
            return None
        async with run.lock:
            self.end(run, "ended at POST /loopfence/runs/{id}/reset")
            run.note(reset=True)  # a restart does not give the name back to it
        if run.named is not None and self.names.get((owner, run.named)) == run.id:
            del self.names[(owner, run.named)]
        return run.describe()

    def hold_open(self, run: WireRun) -> None:
        """The run waits for its client with its log open; past `max_open_logs` such runs, the one
        that waited longest rests its log (`RunLog.rest`)."""
        if run.fenced.finished:
            self.open_logs.pop(run.id, None)
            run.rest()
            return
        self.open_logs[run.id] = run
        self.open_logs.move_to_end(run.id)
        while len(self.open_logs) > self.max_open_logs:
            _, old = self.open_logs.popitem(last=False)
            if not old.lock.locked():  # one at work is counted again when its request ends
                old.fenced.log.rest()
                old.rest()

    def end(self, run: WireRun, why: str) -> None:
        """The run ends as its client left it (nothing more came): the last reply (in the log) is the
        answer, the calls it asked for with no result recorded (`unanswered`, a finding for reconcile;
        `_stops.left_by_client`)."""
        f = run.fenced
        if f.finished:
            run.rest()
            return
        unanswered = [c.call.id for c in f.turn.calls] if f.turn is not None else []
        more = f"; no result recorded for {', '.join(unanswered)}" if unanswered else ""
        f.finish(Stop(StopReason.FINAL_ANSWER, f"the client sent no further request ({why}): the last reply "
                      f"stands as the answer{more}", {"unanswered": unanswered}))
        self.open_logs.pop(run.id, None)
        run.rest()

    async def aclose(self) -> None:
        """The proxy shuts down (SIGTERM): every run waiting on its client ends as reset ends it, so
        every log left is finished; with `keep_runs`, they stay open for a restart to continue (a
        crash leaves them open too). On Redis the runs are the store's: nothing ends there."""
        if not self.settings.keep_runs:
            for run in list(self.runs.values()):
                if not run.lock.locked():
                    self.end(run, "the proxy shut down")

    def expire(self) -> None:
        """Forget the runs idle for `settings.expire_after` seconds (checked at most every tenth of it):
        a request that would have continued one starts a run of its own. Their logs stay."""
        ttl, now = self.settings.expire_after, time.monotonic()
        if ttl is None or now - self._swept < ttl / 10:
            return
        self._swept = now
        gone = {rid for rid, r in self.runs.items() if now - r.touched > ttl and not r.lock.locked()}
        for rid in gone:
            self.end(self.runs.pop(rid), f"idle past --expire-after {ttl:g}s")
        for index in (self.by_conv, self.by_latest, self.by_answer):
            for k in [k for k, r in index.items() if r.id in gone]:
                del index[k]
        for k in [k for k, rid in self.names.items() if rid in gone]:
            del self.names[k]
        for k, runs in list(self.by_opening.items()):
            runs[:] = [r for r in runs if r.id not in gone]
            if not runs:
                del self.by_opening[k]
        for k, rids in list(self.sessions.items()):
            rids[:] = [r for r in rids if r not in gone]
            if not rids:
                del self.sessions[k]

    # -- routing ---------------------------------------------------------------------------------

    async def answer(self, incoming: Incoming, *, named: str | None = None, user_agent: str = "",
                     owner: str | None = None, relay: Relay | None = None,
                     on_run: Callable[[str], None] | None = None, session: str | None = None) -> tuple[Answer, bool]:
        """The answer to one request, and whether it was made for this request (False: a retry's
        shared answer, or a stopped run's stop). `relay`: each text delta as it arrives (a stream);
        `on_run`: the run's id, once it is known (before anything is forwarded). `session`: the
        session it belongs to (a session header; ignored under a run name): it is placed among that
        session's conversations only, and a new one starts with what the session has left."""
        if named is not None and not RUN_ID.fullmatch(named):
            raise BadRequest("the X-Loopfence-Run header must be 1-128 characters of A-Z a-z 0-9 . _ - "
                             "(starting with a letter or digit)", "X-Loopfence-Run")
        session = None if named is not None else session
        if session is not None and incoming.scope != session:
            incoming = incoming.scoped(session)
        self.expire()
        run = self._route(incoming, named, owner)
        if run is not None and run.owner != owner:  # routes are per key: never another key's run, nor a word of it
            run = None
        if run is not None:
            latest = run.latest
            if latest is not None and latest[0] == incoming.whole and self.retrying(run):  # the same answer
                return await asyncio.shield(latest[1]), False
            if run.fenced.finished:
                if run.stopped is not None:
                    return run.stopped, False
                run = None  # it ended with an answer: what follows is a new run
        if run is None:
            unplaced = named is None and bool(incoming.answers) and not self._placed_before(incoming, owner)
            run = self._start(incoming, named, user_agent, owner, session, unplaced=unplaced)
        if on_run is not None:
            on_run(run.id)
        run.touched = time.monotonic()
        run.asked = incoming.model
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        if run.latest is not None:
            self.by_latest.pop(keyed(owner, run.latest[0]), None)
        run.latest = (incoming.whole, fut)
        self.by_latest[keyed(owner, incoming.whole)] = run
        run.note(asked=incoming.whole, tail=incoming.conv, step=run.fenced.state.ledger.model_requests + 1)
        again = False
        try:
            async with run.lock:
                again = run.fenced.finished and run.stopped is None  # it ended (an answer, a reset) meanwhile
                if not again:
                    made = await self._exchange(run, incoming, relay)
            if again:  # what follows an answer is a new run: routed again, never that run's "stop"
                self.by_latest.pop(keyed(owner, incoming.whole), None)
                if run.latest is not None and run.latest[1] is fut:
                    run.latest = None  # not a retry of itself
                made, fresh = await self.answer(incoming, named=named, user_agent=user_agent, owner=owner,
                                                relay=relay, on_run=on_run, session=session)
                fut.set_result(made)
                return made, fresh
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: a retry may never come
            self.hold_open(run)  # its files counted (or closed) as after any request
            raise
        fut.set_result(made)
        run.answered, run.delivered = time.monotonic(), False
        if made.stop is None:
            self.gave(run, made)
        named_by = getattr(DIALECTS.get(incoming.wire or ""), "answer_id", None)
        if named_by is not None:  # a later request may name this answer (previous_response_id)
            self.by_answer[keyed(owner, named_by(made))] = run
        try:
            run.note(answered=incoming.whole, answer=made.to_json())  # (before its files rest: an ended run's close)
        finally:  # (a note that cannot be written leaves the run placed and counted all the same)
            self.hold_open(run)
            self.remember(run, incoming.conv)
        return made, True

    def remember(self, run: WireRun, conv: str) -> None:
        """The conversation the run reached: its latest request's view (`conv`: its digests with and
        without the system messages, space-joined), which the next request extends."""
        for d in (run.before or "").split():
            if self.by_conv.get(keyed(run.owner, d)) is run:
                del self.by_conv[keyed(run.owner, d)]
        if run.conv != conv:
            run.before = run.conv  # what the latest request extended: its retry still finds the run
        run.conv = conv
        for d in conv.split():
            self.by_conv[keyed(run.owner, d)] = run

    def _route(self, incoming: Incoming, named: str | None, owner: str | None) -> WireRun | None:
        if named is not None:
            return self.runs.get(self.names.get((owner, named), ""))
        if incoming.follows is not None and (after := self.by_answer.get(keyed(owner, incoming.follows))) is not None:
            return after  # the answer it names is that run's: the input holds only what came since
        run = self.by_latest.get(keyed(owner, incoming.whole))  # a retry of a run's latest request
        if run is not None and self.retrying(run):
            return run  # (finished or not: its answer is the retry's)
        names = {t["function"]["name"] for t in incoming.tools}
        found = next((r for d in incoming.extends if (r := self.by_conv.get(keyed(owner, d))) is not None
                      and names <= r.tools), None)  # a request declaring a tool its run lacks is another's
        if found is None and incoming.answers:  # a history the agent rebuilt: its task and the run's last answer
            found = next((r for r in reversed(self.by_opening.get(keyed(owner, incoming.opening), ()))
                          if not r.fenced.finished and self.brings_back(r, incoming) and names <= r.tools), None)
        if found is None and run is not None and run.stopped is not None:  # a stopped run's request, again
            return run
        return found

    def gave(self, run: WireRun, made: Answer) -> None:
        """The run gave this answer: a request that brings it back under the run's opening is the
        run's (`brings_back`; the last MAX_GIVEN answers are kept)."""
        run.given.append(answer_digest(item_of(made.message)))  # (not read: no conversation to keep)
        del run.given[:-MAX_GIVEN]

    def _placed_before(self, incoming: Incoming, owner: str | None) -> bool:
        """Whether a request that continues no open run continues one that ended (a follow-up after a
        final answer): only a request that continues nothing at all is said to be unplaced."""
        return any(self.by_conv.get(keyed(owner, d)) is not None for d in incoming.extends) or any(
            self.brings_back(r, incoming) for r in self.by_opening.get(keyed(owner, incoming.opening), ()))

    @staticmethod
    def brings_back(run: WireRun, incoming: Incoming) -> bool:
        """Whether the request is the run's, rebuilt: it brings back the run's task (a user message
        that is its text, or its leading paragraphs) and one of its last two answers (the last, or the
        one before: mini-swe-agent drops a reply it could not parse). Two tasks are never glued."""
        return bool(run.task & incoming.users) and any(a in incoming.answers for a in run.given[-2:])

    def _unplaced(self, incoming: Incoming, rid: str) -> str:
        """The words for a request that looks like a continuation but continues no run; said once per
        opening on stderr, and in the new run's header."""
        text = (f"a request carries earlier answers but continues no run this proxy knows (its agent rebuilt "
                f"its history, or the run ended or expired): it starts run {rid} with fresh budgets. Name the "
                "run so that its requests stay one: the base URL .../run/NAME/v1, or the X-Loopfence-Run header")
        if incoming.opening not in self.warned and len(self.warned) < 4096:
            self.warned.add(incoming.opening)
            print(f"loopfence proxy: warning: {text}", file=sys.stderr, flush=True)
        return text

    @staticmethod
    def retrying(run: WireRun) -> bool:
        """Whether a request identical to the run's latest is its retry: the latest is still in
        flight, or was answered under RETRY_S ago and the answer never reached the client whole."""
        latest = run.latest
        if latest is None:
            return False
        return not latest[1].done() or (not run.delivered and time.monotonic() - run.answered < RETRY_S)

    async def delivered(self, rid: str, whole: str) -> None:
        """The answer to the run's latest request (`whole`) reached its client whole (the app says so
        once the response is sent): the same request again is a new sample, not a retry."""
        run = self.runs.get(rid)
        if run is not None and run.latest is not None and run.latest[0] == whole and run.latest[1].done():
            run.delivered = True

    @staticmethod
    def continues(run: WireRun, incoming: Incoming) -> bool:
        """Whether the request extends the run's latest request (always so for a run found by its
        conversation; under a name, another conversation of the session may come in between)."""
        return run.conv is None or not set(run.conv.split()).isdisjoint(incoming.extends)  # (read up to a match)

    def _new_id(self, named: str | None, owner: str | None) -> str:
        if named is None:
            return uuid.uuid4().hex
        base, n = id_base(named, owner), 1
        rid = numbered(base, n)
        while rid in self.runs or (self.settings.logs is not None and (self.settings.logs / f"{rid}.jsonl").exists()):
            n += 1
            rid = numbered(base, n)
        return rid

    def _start(self, incoming: Incoming, named: str | None, user_agent: str, owner: str | None,
               session: str | None = None, *, unplaced: bool = False) -> WireRun:
        rid = self._new_id(named or session, owner)
        st = self.settings
        log = None if st.logs is None else st.logs / f"{rid}.jsonl"
        limits = None
        if session is not None:  # the session's budgets, less what its conversations at work (or stopped) spent
            others = [self.runs[r] for r in self.sessions.get((owner, session), ()) if r in self.runs]
            limits = st.limits.left_after(*(r.fenced.state.ledger.snapshot() for r in others
                                            if not (r.fenced.finished and r.stopped is None)))
        run = self.make(rid, incoming, user_agent, owner, log, named, limits=limits, session=session,
                        unplaced=self._unplaced(incoming, rid) if unplaced else None)
        run.notes = None if st.logs is None else st.logs / NOTES / f"{rid}.jsonl"
        if run.notes is not None:
            run.notes.parent.mkdir(exist_ok=True)
        run.note(start={"named": named, "owner": owner, "model": run.model, "session": session,
                        "opening": incoming.opening, "task": sorted(run.task)})
        self.add(run, named)
        return run

    def make(self, rid: str, incoming: Incoming, user_agent: str, owner: str | None,
             log: Path | RunLog | None, named: str | None = None, *, limits: Limits | None = None,
             session: str | None = None, unplaced: str | None = None) -> WireRun:
        """A new run `rid` for `incoming`, its header written to `log` (`limits`: the settings' unless
        given; `session`: the session it is a conversation of; `unplaced`: why a request that looks
        like a continuation starts it). Its replies' text actions are
        calls (`text_action`) when it has no tools, or a name without `per_turn`, or tools with a
        `tool_choice` that demands a call (a reply with none is not an answer that client takes:
        smolagents' ToolCallingAgent asks again)."""
        st = self.settings
        names = [t["function"]["name"] for t in incoming.tools]
        choice = incoming.params.get("tool_choice")
        wants_calls = bool(incoming.tools) and (choice == "required" or isinstance(choice, dict))
        texts = (not st.per_turn if named is not None else not incoming.tools or wants_calls) \
            and not TEXT_TOOLS & set(names)
        polls = texts and any(k is ToolKind.POLL for k in st.kinds.values())
        kinds = {n: st.kinds[n] for n in names if n in st.kinds} | ({TEXT_POLL: ToolKind.POLL} if polls else {})
        fence = Fence(limits=limits or st.limits, policy=st.policy, kinds=kinds, log=log)
        tools = [handed(fence, t["function"]["name"], t["function"].get("parameters"),
                        t["function"].get("description") or "") for t in self.shared_specs(incoming.tools)]
        about = ("an action the reply's text asks for (a code block, else the text): the client runs it, its "
                 "output is the next user message")
        if texts:
            tools.append(handed(fence, TEXT_ACTION, TEXT_ACTION_SCHEMA, about))
        if polls:
            tools.append(handed(fence, TEXT_POLL, TEXT_ACTION_SCHEMA, about + "; its program is a poll (--kinds)"))
        system, task = opening(incoming.messages)
        model = self.upstream.model_name(incoming.model, incoming.wire)
        header = {"proxy": {"run": rid, "user_agent": user_agent, "upstream": self.upstream.describe(incoming.wire),
                            "on_stop": st.on_stop, "wire": incoming.wire or "chat",
                            **({"session": session} if session is not None else {}),
                            **({"unplaced": unplaced} if unplaced is not None else {})}}
        fenced = fence.start(task, tools, framework=FRAMEWORK, version=versions("loopfence"), model=model, system=system,
                             header=header, model_max_tokens=self.upstream.own_cap(incoming.wire))
        return WireRun(rid, fenced, owner, model, log=None if log is None or isinstance(log, RunLog) else str(log),
                       named=named, tools=frozenset(names), session=session, opening=incoming.opening,
                       task=task_marks(incoming.messages))

    def shared_specs(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`tools` as a run keeps them: the first parsed copy of the same specs (by digest), so that runs
        of one agent hold its tool specs once between them, not once each (the last MAX_SPECS sets)."""
        if not tools:
            return tools
        key = hashlib.sha256(canonical_json(tools).encode()).hexdigest()
        kept = self.specs.get(key)
        if kept is None:
            kept = self.specs[key] = tools
            while len(self.specs) > MAX_SPECS:
                self.specs.popitem(last=False)
        self.specs.move_to_end(key)
        return kept

    def add(self, run: WireRun, named: str | None) -> None:
        self.runs[run.id] = run
        if named is not None:
            run.named = named
            self.names[(run.owner, named)] = run.id
        if run.session is not None:
            self.sessions.setdefault((run.owner, run.session), []).append(run.id)
        if run.opening:
            same = self.by_opening.setdefault(keyed(run.owner, run.opening), [])
            same.append(run)
            del same[:-MAX_SAME_OPENING]

    # -- one exchange ------------------------------------------------------------------------------
    async def _exchange(self, run: WireRun, incoming: Incoming, relay: Relay | None) -> Answer:
        f = run.fenced
        if f.finished:  # stopped while this request waited for the run
            return self.stop_answer(run, f.result.stop if f.result is not None else None)
        try:
            await self._results(run, incoming)
            run.seen = "\n\n".join(flat(m.get("content")) for m in incoming.since(incoming.last_assistant())
                                   if m.get("role") in ("user", "tool"))

            async def send(request: Request, note: str | None) -> Reply:
                if self.upstream.speaks(incoming.wire):  # as sent, to an upstream of its own wire
                    return await self.upstream.post(incoming, note, request.max_tokens, relay)
                if incoming.wire is not None and not DIALECTS[incoming.wire].relays(incoming.body or {}):
                    relaying = None  # the wire's answer goes whole (its ids, what comes before its text)
                else:
                    relaying = relay
                messages = incoming.messages + ([{"role": "user", "content": note}] if note else [])
                if incoming.parts is not None:  # the messages written before go as they were written
                    messages = Encoded(messages, incoming.parts)
                params = {k: v for k, v in incoming.params.items() if k != "model"}
                wire = Request(messages, incoming.tools, params, request.deadline, request.step,
                               request.max_tokens, f.state.run_id)
                return await self.upstream.complete(wire, incoming.model, relaying)

            if run.reopened:  # its request is logged and counted: the reply is what is owed
                run.reopened = False
                reply = await on_the_clock(f.state, send(Request([], [], {}, f.state.deadline(),
                                                                 f.state.ledger.model_requests,
                                                                 f.state.max_tokens()), None))
                f.reply(self.as_action(run, reply))
            else:
                reply = await f.model_request(send, lambda r: self.as_action(run, r))
            return await self.settle(run, reply)
        except FenceStop as exc:
            return self.stop_answer(run, exc.stop)
        except StopError as exc:  # the upstream, for a reopened request
            return self.stop_answer(run, f.finish(exc.stop).stop)
        except Exception:
            if f.result is not None:  # what the model request raised ended the run (endpoint_error)
                return self.stop_answer(run, f.result.stop)
            raise

    async def settle(self, run: WireRun, reply: Reply) -> Answer:
        """The answer to a checked reply: the final answer (the run ends), the stop, or the reply with
        the calls the guards allow. Raises FenceStop."""
        f = run.fenced
        if f.answer is not None:  # no calls: the run ends here
            result = f.finish()
            if result.stop.reason is StopReason.FINAL_ANSWER:
                return self.reply_answer(run, reply, [])
            return self.stop_answer(run, result.stop)
        if run.shared is None:  # found once per run: a guard's copyability does not change
            run.shared = uncopied(f.guards)
        released, stop = precheck(f, run.shared)
        if stop is not None and not released:
            await self._refuse(f)  # raises the stop
        run.held = {c.call.id for c in (f.turn.calls if f.turn else [])} - {c.call.id for c in released}
        return self.reply_answer(run, reply, [c.call for c in released])

    def as_action(self, run: WireRun, reply: Reply) -> Reply:
        """A reply with no tool calls, in a run whose text actions are calls: the same reply with its
        action as a `text_action` call (what the log records; the client gets the text alone). When
        the action is the one the last reply asked for, the call's `after` is the fingerprint of the
        output it followed: the same action after the same output is a repeat, after a new output (a
        poll) it is not. After another action it is empty: an edit and a test that come back in turn
        are one cycle from their first round, as tool calls are."""
        registry = run.fenced.state.registry
        if reply.tool_calls or not reply.complete or TEXT_ACTION not in registry:
            return reply
        action = action_of(reply.content)
        if action is None and run.named is None:
            return reply  # nothing asked for: the final answer
        raw = reply.raw if isinstance(reply.raw, dict) else {}
        args = {"action": action or "", "after": outcome_fingerprint(run.seen)[:16] if action == run.acted else ""}
        call = {"id": f"text-{run.fenced.state.ledger.model_requests}", "type": "function",
                "function": {"name": TEXT_POLL if TEXT_POLL in registry and self._polls(action) else TEXT_ACTION,
                             "arguments": canonical_json(args)}}
        made: dict[str, Any] = {k: raw[k] for k in ("id", "object", "created", "model") if k in raw}
        made["choices"] = [{"index": 0, "message": {"role": "assistant", "content": reply.content, "tool_calls": [call]},
                            "finish_reason": reply.finish_reason}]
        if reply.usage is not None:
            p, c = reply.usage.prompt_tokens, reply.usage.completion_tokens
            made["usage"] = {"prompt_tokens": p, "completion_tokens": c,
                             **({"total_tokens": p + c} if p is not None and c is not None else {})}
        made["x_loopfence"] = "text_action: the call the proxy read from the reply's text"
        return Reply.from_response(made)

    def _polls(self, action: str | None) -> bool:
        """Whether --kinds declares the program the action runs a poll (exempt from repetition rules)."""
        return bool(action) and self.settings.kinds.get(program_of(action or "")) is ToolKind.POLL

    async def _results(self, run: WireRun, incoming: Incoming) -> None:
        """The results the request carries for the calls of the last reply, in its order: its tool
        messages by call id; else (a client that re-renders results as user messages) each user
        message for the call it names ("Call id: c0"), the rest in order; a text action's result is
        the user messages' text."""
        f = run.fenced
        turn = f.turn
        run.acted = None
        if turn is None:
            return
        run.acted = next((_action_in(c.call) for c in turn.calls if c.call.name in TEXT_TOOLS), None)
        since = incoming.since(incoming.last_assistant())
        given = {m["tool_call_id"]: flat(m.get("content")) for m in since if m.get("role") == "tool"}
        told = [flat(m.get("content")) for m in since if m.get("role") == "user"]
        calls = [c.call for c in turn.calls]
        ours = self.continues(run, incoming)
        if told and not given and ours:
            waiting = [c.id for c in calls if c.name not in TEXT_TOOLS and c.id not in run.held]
            unnamed = []
            for text in told:  # the calls each result names first ("Call id: c0"), then the rest in order
                cid = next((i for i in call_ids_in(text) if i in waiting and i not in given), None)
                if cid is not None:
                    given[cid] = text
                else:
                    unnamed.append(text)
            left = [cid for cid in waiting if cid not in given]
            if len(unnamed) == 1 and len(left) > 1:  # one observation for parallel calls (smolagents)
                given |= dict.fromkeys(left, unnamed[0])
            else:
                given |= dict(zip(left, unnamed))
        for c in calls:
            if c.name in TEXT_TOOLS and c.id not in run.held and since:  # the next user messages, whichever
                await f.call(c.id, value_of("\n\n".join(told) if told else "\n\n".join(given.values())))
            elif c.id in given:
                await f.call(c.id, value_of(given.pop(c.id)))
            elif c.id in run.held:
                await f.call(c.id, value_of(_NOT_SENT))
        run.held = set()  # calls the client never answered: the next request's end_turn says not_executed

    async def _refuse(self, f: FencedRun) -> None:
        """The reply's calls through the real guards until the stop (none of them is run)."""
        for c in list(f.turn.calls if f.turn else []):
            await f.call(c.call.id, value_of(_NOT_SENT))
        raise AssertionError("the guards refused on the copy but not on the run")  # pragma: no cover

    def reply_answer(self, run: WireRun, reply: Reply, calls: Any) -> Answer:
        calls = [c for c in calls if c.name not in TEXT_TOOLS]  # a text action is the text itself
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = [c.to_wire() for c in calls]
        raw = reply.raw if isinstance(reply.raw, dict) else {}
        if isinstance(raw.get(WIRE_EXTRA), dict):  # another wire's own parts of the reply (signed thinking)
            message[WIRE_EXTRA] = raw[WIRE_EXTRA]
        usage = raw.get("usage") if isinstance(raw.get("usage"), dict) else None
        if usage is None and reply.usage is not None:  # a streamed reply: its usage chunk, as read
            p, c = reply.usage.prompt_tokens or 0, reply.usage.completion_tokens or 0
            usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        finish = "tool_calls" if calls else ("stop" if reply.tool_calls else reply.finish_reason or "stop")
        return Answer(run.id, self._ident(run), str(raw.get("model") or run.model), message, finish, usage,
                      created=raw["created"] if isinstance(raw.get("created"), int) else int(time.time()))

    def stop_answer(self, run: WireRun, stop: Stop | None) -> Answer:
        """The run's stop, made once (its model the one the stopped request asked for): every later
        request gets the same."""
        if run.stopped is None:
            stop = stop or Stop(StopReason.INTERNAL_ERROR, "the run ended")
            run.stopped = Answer.stopped(run.id, self._ident(run), run.asked or run.model, stop,
                                         self.settings.on_stop == "error")
        return run.stopped

    def _ident(self, run: WireRun) -> str:
        return f"chatcmpl-lf-{run.id}-{run.fenced.state.ledger.model_requests}"


def _action_in(call: Any) -> str | None:
    """The action a text action call asked for (its `action` argument)."""
    try:
        args = loads(call.raw_arguments or "{}")
    except ValueError:
        return None
    return args.get("action") if isinstance(args, dict) else None


def handed(fence: Fence, name: str, parameters: Any, description: str) -> Tool:
    """A tool of a proxied run: its results come from the client, already in hand (nothing is run here,
    so there is nothing for the tool timeout to bound)."""
    return fence.tool(name, parameters, description, isolation="inline")


def value_of(content: str) -> Callable[[], Any]:
    async def value() -> str:
        return content
    return value


def uncopied(guards: Any) -> list[Any]:
    """The guards deepcopy refuses (the untrusted-content gate: its hook may hold a lock): a copy of
    the guards shares these and owns the rest."""
    refused = []
    for g in guards.guards:
        try:
            copy.deepcopy(g)
        except TypeError:
            refused.append(g)
    return refused


def precheck(f: FencedRun, shared: list[Any] | None = None) -> tuple[list[Any], Stop | None]:
    """The reply's calls through a copy of the run's guards, in the ring's order, as if each one
    allowed ran: (the calls to release, the stop the first refused call would get, or None). Calls
    refused without a stop (a duplicate in one reply) are not released either."""
    turn, s = f.turn, f.state
    if turn is None:
        return [], None
    shared = uncopied(f.guards) if shared is None else shared
    sim = f.guards.trial({id(g): g for g in shared}, after=len(turn.calls) > 1)  # (the last call's after: not asked)
    saved = (s.log, s.ledger.tool_executions, s.warning)
    s.log = None  # the copy writes nothing
    released = []
    try:
        for i, c in enumerate(turn.calls):
            verdict = sim.before_execution(s, c, False)
            if inspect.isawaitable(verdict):  # an approval that waits: the real pass asks
                if inspect.iscoroutine(verdict):
                    verdict.close()
                verdict = None
            if isinstance(verdict, Stop):
                return released, verdict
            if verdict is None:
                released.append(c)
                if i + 1 < len(turn.calls):  # as if it ran, for the calls after it (the last one's is not looked at)
                    s.ledger.tool_executions += 1
                    sim.after_execution(s, c, ToolResult("", True))
    finally:
        s.log, s.ledger.tool_executions, s.warning = saved
    return released, None
