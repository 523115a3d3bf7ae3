"""The untrusted-content gate: once a page is in the conversation, it cannot give orders.

Content is untrusted when a tool result says so (`ToolResult.untrusted`: HTML pages that were in the
workspace at the start, tools declared untrusted, workspace files marked by glob, drill tools flagged
untrusted), or when a result of any tool holds text from an untrusted source (tools/_provenance:
fingerprints of those sources, so `cat page.html` taints as `read_file page.html` does; a source too
large to fingerprint, or a file or folder the start scan could not read, taints every `run_command` /
`apply_patch` result instead). From the
first such result on, the run is *tainted*: privileged tools (those flagged `privileged=True`, plus
`run_command`, `write_file` and `apply_patch` by name) are refused with a structured
`permission_denied` result unless the approval hook allows that one call. The taint never lifts:
the model's own later replies may carry the page's instructions, so eliding the page is not enough.

Every decision is a `gate` event in the run log (name, decision, reason, step): `tainted` when
untrusted content arrives, and `allowed` / `approved` / `refused` for each privileged call.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from ._keywords import keywords_checked
from ._aio import Expired, in_thread, within
from ._guards import Guard
from ._json import canonical_json
from ._log._schema import GateDecision, GateLine
from ._printable import printable
from .tools._executor import ToolResult, refusal
from .tools._provenance import Fingerprints, Provenance
from .tools._registry import ToolKind

if TYPE_CHECKING:
    from ._contract import CheckedCall
    from ._state import RunState
    from .tools._registry import Tool

__all__ = ["UntrustedGate", "Taint", "ApprovalHook", "DEFAULT_PRIVILEGED", "APPROVE_MODES",
           "approve_all", "deny_all", "ask_on_terminal", "approver", "describe_source", "taint_why", "HOLDS_TEXT"]

DEFAULT_PRIVILEGED = frozenset({"run_command", "write_file", "apply_patch"})
APPROVE_MODES = ("ask", "deny", "all")

ApprovalHook = Callable[["CheckedCall", str], bool]
"""(the call, why it is gated) -> True to run this one call despite the taint."""

_SOURCE_KEYS = ("path", "url", "uri", "file", "query", "name")
_QUOTING = frozenset({"run_command", "apply_patch"})  # built-ins whose result may quote any workspace file


@dataclass(frozen=True, slots=True)
class Taint:
    """Where untrusted content first entered the conversation."""

    step: int
    source: str  # e.g. "read_file pages/x.html"
    why: str | None = None  # which source's text it held and the flag that would trust it

    def reason(self) -> str:
        return f"untrusted content in context since step {self.step} ({self.source}" + \
            (f": {self.why})" if self.why else ")")


HOLDS_TEXT = "it holds text from "  # why a result not itself untrusted taints: text it repeats
_FROM = "untrusted content from "  # a `tainted` event's reason: _FROM + source [+ " (" + why + ")"]


def taint_why(event: Mapping[str, Any], source: str) -> str | None:
    """WHY in the reason of the first `tainted` event, for `source` (what the live gate knew, e.g. a
    workspace file's provenance, which recorded tools cannot rebuild); None when it gives none."""
    reason, head = event.get("reason"), f"{_FROM}{source} ("
    if event.get("first") is False or not isinstance(reason, str) or not reason.startswith(head) \
            or not reason.endswith(")"):
        return None
    return reason[len(head):-1]


def describe_source(name: str, args: dict[str, Any]) -> str:
    """`read_file pages/x.html`: the tool and its most telling argument."""
    for key in _SOURCE_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value:
            return f"{name} {_clip(value)}"
    return f"{name} {_clip(canonical_json(args))}" if args else name


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


@keywords_checked
class UntrustedGate(Guard):
    """Refuse privileged calls once untrusted content is in context, unless `approve` allows one.

    privileged: None -> tools flagged `privileged=True` plus DEFAULT_PRIVILEGED by name; a
    collection of names replaces that rule entirely (an empty one gates nothing).
    approve: the approval hook; None denies every gated call.
    """

    def __init__(self, approve: ApprovalHook | None = None,
                 privileged: Collection[str] | None = None) -> None:
        self.approve = approve
        self.names = None if privileged is None else frozenset(privileged)
        self.taint: Taint | None = None
        self.sources: list[Taint] = []  # every untrusted result, in order
        self._own = Fingerprints()  # untrusted outputs' text, when no workspace provenance is in use
        self._prov: Provenance | None | bool = False  # False: not looked up yet

    def is_privileged(self, t: Tool) -> bool:
        if self.names is not None:
            return t.name in self.names
        return t.privileged or t.name in DEFAULT_PRIVILEGED

    def describe(self) -> dict[str, Any]:
        """For the log header: what is gated and who approves."""
        hook = self.approve
        return {"privileged": "default" if self.names is None else sorted(self.names),
                "approve": getattr(hook, "mode", getattr(hook, "__name__", repr(hook))) if hook else "deny"}

    # -- phases ----------------------------------------------------------------------------------
    def provenance(self, s: RunState) -> Provenance | None:
        """The workspace provenance the run's tools share (workspace_tools), if any."""
        if self._prov is False:
            self._prov = next((t.provenance for t in s.registry if t.provenance is not None), None)
        return self._prov if isinstance(self._prov, Provenance) else None

    def after_execution(self, s: RunState, c: CheckedCall, r: ToolResult) -> None:
        prov = self.provenance(s)
        prints = prov.prints if prov is not None else self._own
        if r.untrusted:  # its text taints wherever it goes next
            source = describe_source(c.tool.name, c.args)
            prints.add(source, r.content)
            path = c.args.get("path") if c.tool.provenance is not None and c.tool.name == "read_file" else None
            why = prov.explain(path) if prov is not None and isinstance(path, str) else None
            self.mark(Taint(s.ledger.model_requests, source, why), s, c.call.id, r.decision)
        elif (origin := prints.match(r.content)) is not None:
            source, why = describe_source(c.tool.name, c.args), f"{HOLDS_TEXT}{origin}"
            if prov is not None and origin in prov.files:
                why += ": " + prov.explain(origin)
            self.mark(Taint(s.ledger.model_requests, source, why), s, c.call.id, r.decision)
        elif prov is not None and c.tool.provenance is prov and c.tool.name in _QUOTING and \
                (blind := prov.blind()) is not None:
            origin, unseen = blind  # fail closed: it may hold that text, unseen
            why = f"{HOLDS_TEXT}{origin} as far as can be told: {unseen}"
            self.mark(Taint(s.ledger.model_requests, describe_source(c.tool.name, c.args), why), s,
                      c.call.id, r.decision)
        if self.taint is not None and prov is not None:
            prov.tainted()
            if r.decision == "executed" and c.tool.kind == ToolKind.SIDE_EFFECT:
                prov.mark_changed()  # what it wrote now is untrusted, for later runs too
        return None

    def before_execution(self, s: RunState, c: CheckedCall, reuse: bool) -> Any:
        if (prov := self.provenance(s)) is not None:
            prov.ensure_scanned()  # before anything runs: the workspace as the run found it
            if self.taint is None:  # what a call that taints writes counts as written after the taint
                prov.before_call(writes=c.tool.kind is ToolKind.SIDE_EFFECT and c.tool.name != "write_file",
                                 builtin=c.tool.provenance is prov)
        if not self.is_privileged(c.tool):
            return None
        step = s.ledger.model_requests
        if self.taint is None:
            _event(s, step, c, "allowed", "no untrusted content in context")
            return None
        reason = self.taint.reason()
        if self.approve is None:
            _event(s, step, c, "refused", reason)
            return refusal("permission_denied", reason=reason)
        return self._ask(s, step, c, self.approve, reason)  # the ring awaits it

    async def _ask(self, s: RunState, step: int, c: CheckedCall, hook: ApprovalHook, reason: str) -> ToolResult | None:
        """The hook may block on a person: it runs on a worker thread (an `async def` hook is awaited),
        bounded by the run's clock, so Ctrl-C or a cancel meanwhile still ends the run, named."""
        try:
            asked = hook(c, reason) if inspect.iscoroutinefunction(hook) else in_thread(hook, c, reason)
            ok = bool(await within(s.deadline(), asked))
        except Expired:
            ok, reason = False, f"{reason}; no answer from the approval hook within max_wall_seconds"
        except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
            ok, reason = False, f"{reason}; approval hook failed: {type(exc).__name__}: {exc}"
        if ok:
            _event(s, step, c, "approved", reason)
            return None
        _event(s, step, c, "refused", reason)
        return refusal("permission_denied", reason=reason)

    # -- taint -----------------------------------------------------------------------------------
    def mark(self, taint: Taint, s: RunState | None = None, call_id: str | None = None,
             decision: str = "executed") -> None:
        first = self.taint is None
        if first:
            self.taint = taint
        self.sources.append(taint)
        if s is not None and s.log is not None:
            s.log.write(GateLine(step=taint.step, tool_call_id=call_id, name=taint.source.split(" ")[0],
                                 decision=GateDecision.TAINTED, reason=f"{_FROM}{taint.source}"
                                 + (f" ({taint.why})" if taint.why else "")
                                 + ("" if first else f" (tainted since step {self.taint.step})"),
                                 source=taint.source, result=decision, first=first))

    def restore(self, events: Iterable[dict[str, Any]]) -> None:
        """Rebuild the taint from a run log's events (resume): every untrusted result counts."""
        args: dict[str, dict[str, Any]] = {}
        for e in events:
            if e.get("event") == "call" and isinstance(e.get("arguments"), dict):
                args[str(e.get("tool_call_id"))] = e["arguments"]
            elif e.get("event") == "result" and e.get("untrusted"):
                name = str(e.get("name"))
                self.mark(Taint(int(e.get("step") or 0),
                                describe_source(name, args.get(str(e.get("tool_call_id")), {}))))


def _event(s: RunState, step: int, c: CheckedCall, decision: str, reason: str) -> None:
    if s.log is not None:
        s.log.write(GateLine(step=step, tool_call_id=c.call.id, name=c.tool.name, key=c.key,
                             decision=decision, reason=reason))


# -- approval hooks ------------------------------------------------------------------------------
def approve_all(call: CheckedCall, reason: str) -> bool:
    """`--approve all`: every gated call runs (recorded in the log header)."""
    return True


def deny_all(call: CheckedCall, reason: str) -> bool:
    """`--approve deny`: every gated call is refused (the default without a terminal)."""
    return False


approve_all.mode = "all"  # type: ignore[attr-defined]
deny_all.mode = "deny"  # type: ignore[attr-defined]


def ask_on_terminal(stdin: TextIO | None = None, stderr: TextIO | None = None) -> ApprovalHook:
    """`--approve ask`: show the call and why it is gated; run it only on an explicit yes."""
    inp = stdin or sys.stdin
    out = stderr or sys.stderr

    def ask(call: CheckedCall, reason: str) -> bool:
        shown = printable(_clip(canonical_json(call.args), 400))  # model text never drives the terminal
        out.write(f"\nloopfence gate: {printable(call.tool.name)} {shown}\n  {printable(reason)}\n  run it? [y/N] ")
        out.flush()
        answer = inp.readline()
        return answer.strip().lower() in ("y", "yes")

    ask.mode = "ask"  # type: ignore[attr-defined]
    return ask


def approver(mode: str | None, *, interactive: bool | None = None) -> ApprovalHook:
    """The CLI's hook for `--approve MODE`; None -> ask on a terminal, deny without one."""
    if mode is None:
        tty = sys.stdin.isatty() and sys.stderr.isatty() if interactive is None else interactive
        mode = "ask" if tty else "deny"
    if mode == "all":
        return approve_all
    if mode == "deny":
        return deny_all
    if mode == "ask":
        return ask_on_terminal()
    raise ValueError(f"--approve must be one of {', '.join(APPROVE_MODES)}, got {mode!r}")
