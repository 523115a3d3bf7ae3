"""Large values in a run log are stored once: in the `reply` event that brought them.

A call's arguments arrive in a reply (its raw response holds them, and replay rebuilds the reply
from it). Over LARGE_CHARS characters, the events that would repeat them do not:

- a `call` event leaves out `raw_arguments` when they are, character for character, the arguments
  of the call with its `tool_call_id` in the latest `reply` event before it (`call_text` reads them
  back from there);
- a `key` (`call`, `gate` and `nudge` events) is `name:sha256:<64 hex digits>`, the digest of the
  whole canonical key (one digest for every spelling of the same call, as the key was), and a `call`
  event then leaves out `arguments` (the bound arguments the key spelled out).

Below LARGE_CHARS the events are as they always were; older logs hold every value in full and
read as before (`comparable` in `_drivers/_playback.py` compares either shape alike, via `compared`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

__all__ = ["LARGE_CHARS", "KEYED", "shrink", "short_key", "compared", "reply_arguments", "call_text"]

LARGE_CHARS = 64 << 10  # a value longer than this (characters) is stored once
KEYED = frozenset({"call", "gate", "nudge"})  # the events that carry a call's key
_DIGEST = ":sha256:"


def short_key(key: str) -> str:
    """`key` as a log stores it: itself, or over LARGE_CHARS, its name and the digest of the whole."""
    if len(key) <= LARGE_CHARS:
        return key
    name = key.partition(":")[0]
    return f"{name}{_DIGEST}{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()}"


def reply_arguments(raw: Any, call_id: Any) -> str | None:
    """The arguments text of the call `call_id` in a reply's raw response (its first choice's message,
    as the adapters record it), or None where it holds no such call."""
    try:
        calls = raw["choices"][0]["message"]["tool_calls"]
    except (KeyError, IndexError, TypeError):
        return None
    for tc in calls if isinstance(calls, list) else ():
        if isinstance(tc, dict) and tc.get("id") == call_id:
            fn = tc.get("function")
            args = fn.get("arguments") if isinstance(fn, dict) else None
            return args if isinstance(args, str) else None
    return None


def shrink(event: str, fields: dict[str, Any], reply_raw: Any) -> dict[str, Any]:
    """A keyed event's fields as written (the writer's side): large values left out or digested.
    `reply_raw`: the raw response of the latest reply written. The fields are returned as they are
    when nothing in them is large (the common case costs two len() calls)."""
    key, raw_args = fields.get("key"), fields.get("raw_arguments")
    long_key = isinstance(key, str) and len(key) > LARGE_CHARS
    drop_raw = event == "call" and isinstance(raw_args, str) and len(raw_args) > LARGE_CHARS and \
        reply_arguments(reply_raw, fields.get("tool_call_id")) == raw_args
    if not (long_key or drop_raw):
        return fields
    out = dict(fields)
    if long_key:
        out["key"] = short_key(key)  # type: ignore[arg-type]
        out.pop("arguments", None)
    if drop_raw:
        del out["raw_arguments"]
    return out


def compared(out: dict[str, Any]) -> None:
    """A keyed event (JSON already, its key canonical) as replay compares it, in place: a large key
    digested and the arguments it spells out dropped, large raw arguments dropped (the reply that
    holds them is compared), so a log written whole and one written with values stored once match."""
    key = out.get("key")
    if isinstance(key, str) and len(key) > LARGE_CHARS:
        out["key"] = short_key(key)
        out.pop("arguments", None)
    raw_args = out.get("raw_arguments")
    if isinstance(raw_args, str) and len(raw_args) > LARGE_CHARS:
        del out["raw_arguments"]


def call_text(events: Iterable[dict[str, Any]]) -> dict[int, str]:
    """For each call event (by `seq`) that left its `raw_arguments` out, the text, read back from the
    latest reply before it that holds a call with its id (the readers' side of `shrink`)."""
    out: dict[int, str] = {}
    raw: Any = None
    for e in events:
        kind = e.get("event")
        if kind == "reply":
            raw = e.get("raw")
        elif kind == "call" and e.get("raw_arguments") is None:
            text = reply_arguments(raw, e.get("tool_call_id"))
            if text is not None and isinstance(e.get("seq"), int):
                out[e["seq"]] = text
    return out
