"""What the pytest plugin's fixtures hand out (kept out of the plugin so pytest starts light)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from .._messages import Reply
from ..models._scripted import ScriptedModel
from .._log._reader import RunLogFile, read_log
from .._log._schema import LogEvent, StopLine
from .._drivers._replay import ReplayReport, replay
from ._builders import calls_reply, text_reply

__all__ = ["make_scripted_model", "reply_forms", "RunLogFixture", "assert_replays"]


def _form(item: Any) -> dict[str, Any] | Reply:
    if isinstance(item, Reply):
        return item
    if isinstance(item, str) or item is None:
        return text_reply(item)
    if isinstance(item, (list, tuple)):
        return calls_reply(*item)
    if isinstance(item, dict) and "function" in item:  # one wire tool call
        return calls_reply(item)
    if isinstance(item, dict):
        return item
    raise TypeError(f"a scripted reply must be a response object, a tool call, a list of calls, "
                    f"a string or a Reply; got {type(item).__name__}")


def make_scripted_model(*replies: Any, repeat_last: bool = True, delay_s: float = 0.0) -> ScriptedModel:
    """A ScriptedModel from replies or builders: `make_scripted_model(tool_call("list_dir"), "done")`."""
    if len(replies) == 1 and isinstance(replies[0], list) and replies[0] and \
            not (isinstance(replies[0][0], dict) and "function" in replies[0][0]):
        replies = tuple(replies[0])  # one list of replies
    return ScriptedModel([_form(r) for r in replies], repeat_last=repeat_last, delay_s=delay_s)


def reply_forms(replies: Sequence[Any]) -> list[dict[str, Any]]:
    """Fake-server forms: the same shorthands as scripted_model (Reply objects excepted)."""
    out = []
    for r in replies:
        form = _form(r)
        if isinstance(form, Reply):
            raise TypeError("the fake endpoint serves response objects, not Reply values")
        out.append(form)
    return out


class RunLogFixture:
    """A log path for one run, and its events read back strictly."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> RunLogFile:
        return read_log(self.path)

    @property
    def events(self) -> list[LogEvent]:
        log = self.read()
        return [log.header, *log.events]

    def of(self, kind: str) -> list[LogEvent]:
        return [e for e in self.events if e.event == kind]

    @property
    def stop(self) -> StopLine:
        stop = self.read().stop
        if stop is None:
            pytest.fail(f"{self.path}: the run log has no stop as its last line", pytrace=False)
        return stop


def assert_replays(path: str | Path, **options: Any) -> ReplayReport:
    """Replay a log; fail the test unless it stops with the same reason at the same step, every
    recorded event played. Under `limits=` too: a what-if replay that stops elsewhere (which
    `loopfence replay --limit` reports as an answer) fails here, as the fixture promises."""
    report = replay(path, **options)
    if not report.same_stop:
        pytest.fail(f"{path}: replay did not stop where the log did\n" + "\n".join(report.lines()),
                    pytrace=False)
    return report
