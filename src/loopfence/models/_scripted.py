"""ScriptedModel: replies from a list; when the list runs out, the last reply repeats."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._json import JsonFileError, load_json_items
from .._messages import Reply, ReplyFormatError, Request
from .._stops import StopError, StopReason

__all__ = ["ScriptedModel", "load_script", "ScriptError", "DELAY_ENV"]


class ScriptError(ValueError):
    """A script file that cannot be used; the message names the file and line."""


DELAY_ENV = "LOOPFENCE_SCRIPTED_DELAY_S"  # test knob: seconds each scripted reply takes


class ScriptedModel:
    """Serves chat.completions response objects in order (the last repeats). Records requests.

    `offset` starts the script further on (a resumed run continues where the log ended);
    `delay_s` (default: $LOOPFENCE_SCRIPTED_DELAY_S, else 0) makes each reply take that long.
    """

    def __init__(self, replies: Sequence[dict[str, Any] | Reply], *, repeat_last: bool = True,
                 offset: int = 0, delay_s: float | None = None) -> None:
        if not replies:
            raise ValueError("ScriptedModel needs at least one reply")
        self.replies = list(replies)
        self.repeat_last = repeat_last
        self.offset = offset
        self.delay_s = float(os.environ.get(DELAY_ENV) or 0) if delay_s is None else delay_s
        self.requests: list[Request] = []

    @property
    def served(self) -> int:
        return self.offset + len(self.requests)

    def complete(self, request: Request) -> Reply:
        i = self.offset + len(self.requests)
        self.requests.append(request)
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        if i >= len(self.replies) and not self.repeat_last:
            raise StopError(StopReason.ENDPOINT_ERROR, f"script exhausted after {len(self.replies)} replies")
        item = self.replies[min(i, len(self.replies) - 1)]
        if isinstance(item, Reply):
            return item
        try:
            return Reply.from_response(item)
        except ReplyFormatError as exc:
            raise StopError(StopReason.ENDPOINT_ERROR, f"scripted reply {i + 1}: {exc}") from None

    def describe(self) -> dict[str, Any]:
        """Everything needed to rebuild this model (resume): the replies inline, in response form."""
        return {"kind": "scripted", "replies": len(self.replies), "repeat_last": self.repeat_last,
                "script": [_as_response(r) for r in self.replies]}


def _as_response(item: dict[str, Any] | Reply) -> dict[str, Any]:
    if not isinstance(item, Reply):
        return item
    if item.raw:
        return item.raw
    out: dict[str, Any] = {"choices": [{"index": 0, "message": item.message(),
                                        "finish_reason": item.finish_reason}]}
    if item.usage is not None:
        out["usage"] = {"prompt_tokens": item.usage.prompt_tokens,
                        "completion_tokens": item.usage.completion_tokens}
    return out


def load_script(path: str | Path) -> list[dict[str, Any]]:
    """A JSONL file (one response object per line) or a JSON array. Errors name file and line."""
    try:
        return load_json_items(path, Reply.from_response, "script file")
    except JsonFileError as exc:
        raise ScriptError(str(exc)) from None
