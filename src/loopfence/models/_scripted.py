"""ScriptedModel: replies from a list; when the list runs out, the last reply repeats."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._messages import Reply, ReplyFormatError, Request
from .._stops import StopError, StopReason

__all__ = ["ScriptedModel", "load_script", "ScriptError"]


class ScriptError(ValueError):
    """A script file that cannot be used; the message names the file and line."""


class ScriptedModel:
    """Serves chat.completions response objects in order (the last repeats). Records requests."""

    def __init__(self, replies: Sequence[dict[str, Any] | Reply], *, repeat_last: bool = True) -> None:
        if not replies:
            raise ValueError("ScriptedModel needs at least one reply")
        self.replies = list(replies)
        self.repeat_last = repeat_last
        self.requests: list[Request] = []

    @property
    def served(self) -> int:
        return len(self.requests)

    def complete(self, request: Request) -> Reply:
        i = len(self.requests)
        self.requests.append(request)
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
        return {"kind": "scripted", "replies": len(self.replies)}


def load_script(path: str | Path) -> list[dict[str, Any]]:
    """A JSONL file (one response object per line) or a JSON array. Errors name file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"{p}: script file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"{p}: cannot read script: {exc}") from None
    if not text.strip():
        raise ScriptError(f"{p}: script file is empty")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{p}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        numbered = list(enumerate(items, 1))
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                numbered.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                _check(p, numbered)
                raise ScriptError(f"{p}:{lineno}: not valid JSON: {exc.msg}") from None
    _check(p, numbered)
    return [item for _, item in numbered]


def _check(p: Path, numbered: list[tuple[int, Any]]) -> None:
    for lineno, item in numbered:
        try:
            Reply.from_response(item)
        except ReplyFormatError as exc:
            raise ScriptError(f"{p}:{lineno}: {exc}") from None
