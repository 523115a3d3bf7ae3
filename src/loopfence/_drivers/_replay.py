"""Replay: run the ring again from a log, with the recorded replies and (by default) recorded results.

Strict by default: every event the ring writes must equal the recorded one (requests by their
fingerprint: canonical conversation + tools), the stop must be the same reason at the same step with
the same ledger, and every recorded event must be consumed. `limits` replays under other limits
("would this budget have stopped it earlier?"): a different stop is then the answer, not an error.
`execute_tools` re-runs the built-in workspace tools for real in a fresh copy of the recorded
workspace, so a result that differs from the recorded one (an unrecorded side effect) shows up.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._guards import Guard
from .._stops import RunResult
from ..tools._executor import Executor
from ..tools._registry import Tool
from ..runlog._events import LogError, StopEvent
from ._playback import Diverged, Divergence, Playback, RecordingEnded
from ..runlog._reader import RunLogFile, read_log
from ..runlog._rebuild import gated_names, limits_of, registry_of, workspace_tools_of

__all__ = ["replay", "ReplayReport"]


@dataclass(frozen=True, slots=True)
class ReplayReport:
    path: str
    recorded: StopEvent
    replayed: RunResult | None  # None when the replay was cut short
    divergence: Divergence | None = None  # strict: the first mismatch; what-if: where it left the log
    past_end: str | None = None  # the run needed something the recording does not have
    overrides: dict[str, Any] = field(default_factory=dict)
    executed: tuple[str, ...] = ()  # tools run for real (--execute-tools)

    @property
    def what_if(self) -> bool:
        return bool(self.overrides)

    @property
    def same_stop(self) -> bool:
        r = self.replayed
        return r is not None and self.divergence is None and self.past_end is None and \
            str(r.stop.reason) == self.recorded.reason and \
            r.ledger.model_requests == self.recorded.ledger.get("model_requests")

    @property
    def ok(self) -> bool:
        """Strict: identical. What-if: an answer was found (a stop, or where the recording ends)."""
        return self.what_if or self.same_stop

    def lines(self) -> list[str]:
        rec = self.recorded
        recorded = f"{rec.reason} at step {rec.ledger.get('model_requests')}"
        limits = ", ".join(f"{k}={v}" for k, v in self.overrides.items())
        r = self.replayed
        if self.past_end is not None:
            head = f"under {limits}: " if self.what_if else ""
            return [f"{head}the run goes on past the recording: {self.past_end}",
                    f"the recording stopped with {recorded}; it cannot tell what would happen next"]
        if not self.what_if:
            if self.divergence is not None:
                return ["replay diverges from the log", self.divergence.describe()]
            assert r is not None
            return [f"replayed identically: {r.stop.reason} at step {r.ledger.model_requests}, "
                    f"same ledger, every recorded event consumed"
                    + (f" (ran for real: {', '.join(self.executed)})" if self.executed else "")]
        assert r is not None
        now = f"{r.stop.reason} at step {r.ledger.model_requests} ({r.ledger.tool_executions} executions)"
        if self.divergence is None:
            return [f"under {limits}: the same stop, {now}"]
        return [f"under {limits}: stops with {now}: {r.stop.detail}", f"recorded: {recorded}"]


def replay(path: str | Path | RunLogFile, *, limits: Mapping[str, Any] | None = None,
           execute_tools: bool = False, tools: Iterable[Tool] = (),
           guards: list[Guard] | None = None) -> ReplayReport:
    """Replay a finished run log. Raises LogError for a log that cannot be replayed."""
    log = path if isinstance(path, RunLogFile) else read_log(path)
    h = log.header
    recorded = log.stop
    if recorded is None:
        last = log.events[-1].line if log.events else h.line
        raise LogError(log.path, last, "the log has no stop event as its last line: the run did not "
                       "finish (`loopfence resume` continues it)")
    overrides = dict(limits or {})
    live_tools = list(tools)
    workdir = None
    if execute_tools and not live_tools:
        workdir, live_tools = _workspace_tools(log)
    try:
        registry = registry_of(h, [t for t in live_tools if _same_schema(h, t)], gated_names(log.events))
        real = any(any(t is x for x in live_tools) for t in registry)
        playback = Playback.of(log, registry, limits_of(h, log.path, overrides), guards=guards,
                               what_if=bool(overrides), live=Executor() if real else None)
        plog, executor = playback.log, playback.executor
        try:
            result = playback.drive()
        except Diverged as exc:
            return ReplayReport(log.path, recorded, None, exc.divergence, overrides=overrides,
                                executed=tuple(executor.ran))
        except RecordingEnded as exc:
            return ReplayReport(log.path, recorded, None, plog.detached, exc.what, overrides, tuple(executor.ran))
        if not overrides and not plog.rec.exhausted:
            left = plog.rec.peek()
            d = Divergence(result.ledger.model_requests, left.line if left else 0,
                           "the replay stopped before the end of the recording", left.raw if left else None,
                           None)
            return ReplayReport(log.path, recorded, result, d, overrides=overrides, executed=tuple(executor.ran))
        return ReplayReport(log.path, recorded, result, plog.detached, overrides=overrides,
                            executed=tuple(executor.ran))
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _same_schema(h: Any, t: Tool) -> bool:
    return any(s.name == t.name and s.schema() == t.schema() and s.kind == t.kind for s in h.tools)


def _workspace_tools(log: RunLogFile) -> tuple[str, list[Tool]]:
    """The built-in workspace tools over a fresh copy of the workspace named in the header."""
    ws = log.header.workspace
    if not ws or not Path(ws).is_dir():
        raise LogError(log.path, log.header.line, f"--execute-tools needs the recorded workspace, and "
                       f"{ws or 'no workspace'} is not a folder here")
    workdir = tempfile.mkdtemp(prefix="loopfence-replay-")
    try:
        copy = Path(workdir) / "workspace"
        shutil.copytree(ws, copy, symlinks=True, copy_function=_copy_entry)
        return workdir, workspace_tools_of(log.header, log.path, str(copy))
    except BaseException as exc:  # no copy left behind, whatever failed
        shutil.rmtree(workdir, ignore_errors=True)
        if not isinstance(exc, OSError):  # shutil.Error (the entries it could not copy) is one
            raise
        errors = exc.args[0] if isinstance(exc, shutil.Error) and exc.args else None
        why = errors[0][-1] if isinstance(errors, list) and errors else exc
        raise LogError(log.path, log.header.line, f"--execute-tools cannot copy the workspace {ws}: "
                       f"{why}") from None


def _copy_entry(src: str, dst: str) -> None:
    """A regular file is copied; a FIFO is made again (the tools refuse it as they did); any other
    special file (socket, device) cannot be copied."""
    mode = os.lstat(src).st_mode
    if stat.S_ISFIFO(mode):
        os.mkfifo(dst, stat.S_IMODE(mode))
    elif stat.S_ISREG(mode):
        shutil.copy2(src, dst)
    else:
        raise OSError(f"{src} is a special file (socket or device) and cannot be copied")
