"""Replay: run the ring again from a log, with the recorded replies and (by default) recorded results.

Strict by default: every event the ring writes must equal the recorded one (requests by their
fingerprint: canonical conversation + tools), the stop must be the same reason at the same step with
the same ledger, and every recorded event must be consumed. `limits` replays under other limits
("would this budget have stopped it earlier?"): a different stop is then the answer, not an error.
`execute_tools` re-runs the built-in workspace tools for real in a fresh, private folder that holds
the workspace as the run started, so a result that differs from the recorded one (an unrecorded side
effect) shows up. Where the header recorded the start (tools/_manifest.py), that folder is rebuilt:

1. from the run's snapshot archive (`loopfence run --snapshot`), found next to the log or at its
   recorded path and checked against its recorded sha256; the workspace itself is not needed;
2. else from a copy of the workspace (`workspace`, default the header's), checked against the
   manifest: what the manifest alone can put back is put back in the copy (entries it does not list,
   such as a file the run created, are removed; folders, symlinks, FIFOs and empty files are made
   again); a file whose content differs or is missing cannot be, and the replay is refused
   (`WorkspaceDiffers`, naming the first such path) unless `workspace_as_is`.

`workspace_as_is` replays in a plain copy of the workspace, as today for logs with no manifest.
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

from .._keywords import keywords_checked
from .._guards import Guard
from .._log import LogError
from .._log._reader import RunLogFile, read_log
from .._log._schema import HeaderLine, StopLine
from .._stops import RunResult
from ..tools._executor import Executor
from ..tools._manifest import (Manifest, ManifestError, compare, recorded_start, relink, restore_known,
                               restore_snapshot)
from ..tools._registry import Tool
from ._playback import Diverged, Divergence, Playback, RecordingEnded
from ._refold import missing_guards
from ._rebuild import gated_names, limits_of, registry_of, workspace_tools_of

__all__ = ["replay", "ReplayReport", "WorkspaceDiffers"]


class WorkspaceDiffers(LogError):
    """--execute-tools: the workspace is not the one the run started with, and the recorded manifest
    cannot put it back (a file's content differs or is missing)."""

    def __init__(self, path: str, line: int, message: str, first: str) -> None:
        super().__init__(path, line, message)
        self.first = first  # the first path that differs


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay found: the recorded stop, the replayed run's result, and the first divergence
    (or where a what-if replay left the log); `ok`, `same_stop` and `lines()` say it."""

    path: str
    recorded: StopLine
    replayed: RunResult | None  # None when the replay was cut short
    divergence: Divergence | None = None  # strict: the first mismatch; what-if: where it left the log
    past_end: str | None = None  # the run needed something the recording does not have
    overrides: dict[str, Any] = field(default_factory=dict)
    executed: tuple[str, ...] = ()  # tools run for real (--execute-tools)
    notes: tuple[str, ...] = ()  # how the workspace for --execute-tools was made

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
        return [*self.notes, *self._outcome()]

    def _outcome(self) -> list[str]:
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


@keywords_checked
def replay(path: str | Path | RunLogFile, *, limits: Mapping[str, Any] | None = None,
           execute_tools: bool = False, tools: Iterable[Tool] = (),
           guards: list[Guard] | None = None, workspace: str | Path | None = None,
           workspace_as_is: bool = False) -> ReplayReport:
    """Replay a finished run log. Raises LogError for a log that cannot be replayed (WorkspaceDiffers
    when --execute-tools finds the workspace is not the recorded start; see the module doc).
    `workspace`: the folder to copy for execute_tools (default: the header's). `tools`: tools that run
    for real, their results compared with the recorded ones (custom tools, MCP tools), each where the
    header records a tool of its name, schema and kind; with execute_tools, next to the built-ins."""
    log = path if isinstance(path, RunLogFile) else read_log(path)
    h = log.header
    recorded = log.stop
    if recorded is None:
        last = log.events[-1].line if log.events else h.line
        raise LogError(log.path, last, "the log has no stop event as its last line: the run did not "
                       "finish (`loopfence resume` continues it)")
    missing = {} if limits else missing_guards(log, guards)  # a what-if replay leaves the log where it differs
    if missing:
        name, line = next(iter(missing.items()))
        raise LogError(log.path, line, f"the run had the custom guard {name!r}, which a replay needs to run the ring "
                       f"as it ran: give a fresh one (replay(path, guards=[{name}()]), or --guard MODULE:{name})")
    overrides = dict(limits or {})
    live_tools = list(tools)
    workdir = None
    notes: tuple[str, ...] = ()
    if execute_tools:  # the built-ins too; a tool given in `tools` wins over the built-in of its name
        workdir, builtins, notes = _workspace_tools(log, workspace, workspace_as_is)
        given = {t.name for t in live_tools}
        live_tools = [*live_tools, *(t for t in builtins if t.name not in given)]
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
                                executed=tuple(executor.ran), notes=notes)
        except RecordingEnded as exc:
            return ReplayReport(log.path, recorded, None, plog.detached, exc.what, overrides, tuple(executor.ran),
                                notes)
        if not overrides and not plog.rec.exhausted:
            left = plog.rec.peek()
            d = Divergence(result.ledger.model_requests, left.line if left else 0,
                           "the replay stopped before the end of the recording", left.record if left else None,
                           None)
            return ReplayReport(log.path, recorded, result, d, overrides=overrides, executed=tuple(executor.ran),
                                notes=notes)
        return ReplayReport(log.path, recorded, result, plog.detached, overrides=overrides,
                            executed=tuple(executor.ran), notes=notes)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _same_schema(h: HeaderLine, t: Tool) -> bool:
    return any(s.name == t.name and s.schema() == t.schema() and s.kind == t.kind for s in h.specs)


def _workspace_tools(log: RunLogFile, workspace: str | Path | None,
                     as_is: bool) -> tuple[str, list[Tool], tuple[str, ...]]:
    """The built-in workspace tools over a private folder holding the workspace as the run started
    (see the module doc); the folder to remove afterwards, and how it was made."""
    h = log.header
    try:
        start = recorded_start(h.record)
    except ManifestError as exc:
        raise LogError(log.path, h.line, f"the header's workspace manifest cannot be used: {exc}") from None
    workdir = tempfile.mkdtemp(prefix="loopfence-replay-")
    copy = Path(workdir) / "workspace"
    try:
        notes = _rebuild(log, start, workspace, as_is, copy)
        if start is not None and not as_is:
            relink(start, copy, Path(workdir) / "hardlinks")  # outside the copy, as they were
        return workdir, workspace_tools_of(h, log.path, str(copy)), notes
    except BaseException:  # no copy left behind, whatever failed
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _rebuild(log: RunLogFile, start: Manifest | None, workspace: str | Path | None, as_is: bool,
             copy: Path) -> tuple[str, ...]:
    h = log.header
    notes: list[str] = []
    if start is not None and start.snapshot is not None and not as_is:
        archive = _snapshot_file(log.path, start.snapshot)
        if archive is not None:
            try:
                unrestored = restore_snapshot(start, archive, copy)
            except ManifestError as exc:
                raise LogError(log.path, h.line, f"--execute-tools: {exc}; replay without it from the "
                               "manifest (move it away) or with --workspace-as-is") from None
            except OSError as exc:
                raise LogError(log.path, h.line, f"--execute-tools cannot rebuild the workspace from the "
                               f"snapshot {archive}: {exc.strerror or exc}") from None
            notes.append(f"workspace rebuilt from the run's snapshot {archive} ({len(start.entries):,} entries"
                         + (f"; {len(unrestored):,} file(s) over its byte budget are not in it, e.g. {unrestored[0]}"
                            if unrestored else "") + ")")
            return tuple(notes)
        notes.append(f"the run's snapshot {start.snapshot.get('file') or start.snapshot.get('path')} is not "
                     "here: checking the workspace against the recorded manifest instead")
    ws = str(workspace) if workspace is not None else h.workspace
    if not ws or not Path(ws).is_dir():
        raise LogError(log.path, h.line, f"--execute-tools needs the recorded workspace, and "
                       f"{ws or 'no workspace'} is not a folder here")
    _copy(log, ws, copy)
    if start is None:
        return tuple(notes)
    if as_is:
        return (*notes, f"replaying in a copy of {ws} as it is (--workspace-as-is): not checked against the "
                        "workspace the run started with")
    differences = compare(start, copy)
    blocking = [d for d in differences if not d.restorable]
    if blocking:
        first = blocking[0]
        more = f" (and {len(blocking) - 1:,} more)" if len(blocking) > 1 else ""
        raise WorkspaceDiffers(log.path, h.line, (
            f"--execute-tools: {ws} is not the workspace the run started with: {first.describe()}{more}. "
            "The recorded manifest cannot put that back: restore it, replay from a snapshot (`loopfence run "
            "--snapshot`), or pass --workspace-as-is to replay in the workspace as it is"), first.path)
    try:
        restore_known(start, copy, differences)
    except (OSError, ManifestError) as exc:
        raise LogError(log.path, h.line, f"--execute-tools cannot put the workspace back as recorded: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None
    if differences:
        created = [d.path for d in differences if d.change == "created"]
        put = len(differences) - len(created)
        parts = [f"removed {len(created):,} entr{'y' if len(created) == 1 else 'ies'} it does not list "
                 f"({', '.join(created[:3])}{', …' if len(created) > 3 else ''})"] if created else []
        parts += [f"put back {put:,} entr{'y' if put == 1 else 'ies'} as recorded"] if put else []
        notes.append(f"workspace {ws} checked against the recorded manifest; in the replay's copy: "
                     + "; ".join(parts))
    if start.truncated:
        notes.append(f"the recorded manifest is capped ({start.note}): entries past it were not checked")
    return tuple(notes)


def _snapshot_file(log_path: str, snap: dict[str, Any]) -> Path | None:
    """The run's archive: next to the log (where --snapshot puts it), else at its recorded path."""
    name, where = snap.get("file"), snap.get("path")
    candidates = [Path(log_path).parent / name] if isinstance(name, str) and name and "/" not in name \
        and name not in (".", "..") else []
    if isinstance(where, str) and where:
        candidates.append(Path(where))
    return next((p for p in candidates if p.is_file()), None)


def _copy(log: RunLogFile, ws: str, copy: Path) -> None:
    try:
        shutil.copytree(ws, copy, symlinks=True, copy_function=_copy_entry)
    except OSError as exc:  # shutil.Error (the entries it could not copy) is one
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
