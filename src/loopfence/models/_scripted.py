"""ScriptedModel: replies from a list; when the list runs out, the last reply repeats.

A model made from a script file (`ScriptedModel.from_file`) is described in the log header by the
file's path and sha256, not by its replies (a script can be large); resume reads the file again
and refuses it if it changed. A model made from a list carries its replies inline.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import reprlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._keywords import keywords_checked
from .._json import (MAX_DEPTH, MAX_INPUT_BYTES, JsonFileError, depth, dumps, json_items, load_json_items,
                     loads, read_bounded)
from .._messages import Reply, ReplyFormatError, Request
from .._stops import StopError, StopReason

__all__ = ["ScriptedModel", "ScriptSource", "load_script", "ScriptError", "DELAY_ENV"]


class ScriptError(ValueError):
    """A script file that cannot be used; the message names the file and line."""


DELAY_ENV = "LOOPFENCE_SCRIPTED_DELAY_S"  # test knob: seconds each scripted reply takes


@dataclass(frozen=True, slots=True)
class ScriptSource:
    """The script file a model was read from: its absolute path and the sha256 of its bytes."""

    path: str
    sha256: str


@keywords_checked
class ScriptedModel:
    """Serves chat.completions response objects in order (the last repeats). Records requests.

    `replies`: response objects (dicts, served as an endpoint would send them: a malformed one ends
    the run `endpoint_error` when it is served) or `Reply` values; anything else is a TypeError
    naming its position (`loopfence.testing.text_reply("hi")` makes a text reply).

    `offset` starts the script further on (a resumed run continues where the log ended);
    `delay_s` (default: $LOOPFENCE_SCRIPTED_DELAY_S, else 0) makes each reply take that long.
    """

    def __init__(self, replies: Sequence[dict[str, Any] | Reply], *, repeat_last: bool = True,
                 offset: int = 0, delay_s: float | None = None, source: ScriptSource | None = None) -> None:
        if isinstance(replies, (str, bytes, dict, Reply)):
            raise TypeError(f"ScriptedModel takes a list of replies, got one {type(replies).__name__}: "
                            "ScriptedModel([...])")
        if not replies:
            raise ValueError("ScriptedModel needs at least one reply")
        self.replies = [r if isinstance(r, Reply) else _as_logged(i, r) for i, r in enumerate(replies, 1)]
        self.source = source
        self.repeat_last = repeat_last
        self.offset = offset
        self.delay_s = float(os.environ.get(DELAY_ENV) or 0) if delay_s is None else delay_s
        self.requests: list[Request] = []

    @property
    def served(self) -> int:
        return self.offset + len(self.requests)

    def complete(self, request: Request) -> Reply:
        i = self._take(request)
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return self._reply(i)

    async def acomplete(self, request: Request) -> Reply:
        """`complete` for the async ring: the delay is awaited (a cancel ends it at once). A subclass
        that overrides only `complete` gets it, run in a worker thread as any sync model's is."""
        if type(self).complete is not ScriptedModel.complete:
            return await asyncio.to_thread(self.complete, request)
        i = self._take(request)
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        return self._reply(i)

    def _take(self, request: Request) -> int:
        i = self.offset + len(self.requests)
        self.requests.append(request)
        return i

    def _reply(self, i: int) -> Reply:
        if i >= len(self.replies) and not self.repeat_last:
            raise StopError(StopReason.ENDPOINT_ERROR, f"script exhausted after {len(self.replies)} replies")
        item = self.replies[min(i, len(self.replies) - 1)]
        if isinstance(item, Reply):
            return item
        try:
            return Reply.from_response(item)
        except ReplyFormatError as exc:
            raise StopError(StopReason.ENDPOINT_ERROR, f"scripted reply {i + 1}: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path, *, sha256: str | None = None, **options: Any) -> ScriptedModel:
        """The replies of a script file (see load_script). `sha256`: the bytes must hash to it
        (resume: the file must be the one the run used). Raises ScriptError naming the file."""
        try:
            data = read_bounded(path, MAX_INPUT_BYTES, "script file")
            digest = hashlib.sha256(data).hexdigest()
            if sha256 is not None and digest != sha256:
                raise ScriptError(f"{path}: the script file changed since the run (sha256 {digest}, "
                                  f"the run used {sha256})")
            replies = json_items(path, data, Reply.from_response, "script file")
            return cls(replies, source=ScriptSource(str(Path(path).resolve()), digest), **options)
        except JsonFileError as exc:
            raise ScriptError(str(exc)) from None
        except ScriptError:
            raise
        except ValueError as exc:
            raise ScriptError(f"{path}: {exc}") from None

    def describe(self) -> dict[str, Any]:
        """Everything needed to rebuild this model (resume): the script file's path and hash, or
        the replies inline, in response form."""
        head = {"kind": "scripted", "replies": len(self.replies), "repeat_last": self.repeat_last}
        if self.source is not None:
            return {**head, "script_path": self.source.path, "script_sha256": self.source.sha256}
        return {**head, "script": [_as_response(r) for r in self.replies]}


def _as_logged(i: int, reply: Any) -> Any:
    """The reply as the log header records it and reads it back (so a resumed or replayed run
    sees what this one saw); ValueError when the log could not hold it, TypeError when it is not a
    response object (a dict: one the endpoint could have sent, malformed ones included)."""
    if not isinstance(reply, dict):
        hint = "; for a text reply: loopfence.testing.text_reply(text)" if isinstance(reply, str) else ""
        raise TypeError(f"scripted reply {i} is not a chat.completions response object (a dict) or a Reply: "
                        f"got {type(reply).__name__} {reprlib.repr(reply)}{hint}")
    if (levels := depth(reply)) > MAX_DEPTH:
        raise ValueError(f"scripted reply {i} is nested {levels:,} levels deep (the limit is {MAX_DEPTH})")
    try:
        return loads(dumps(reply))
    except ValueError as exc:
        raise ValueError(f"scripted reply {i}: {exc}") from None


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
