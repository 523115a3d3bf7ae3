"""Compaction: what stays in the OUTGOING conversation once it is there.

Every request resends everything (seed 003, break 3), so old tool results are the bulk of a long
run's prompt. `Compaction(keep_turns=K)` replaces the tool results of turns older than the last K
with a short stub naming the tool, its arguments, the size and the fingerprint of what was elided,
so the model knows what it no longer sees. Only the outgoing view changes: `RunState.messages`,
the run log and the request fingerprint keep the originals (replay and resume are unaffected).

`OutgoingView` keeps that view incrementally: each message is serialized once when it arrives and
each result is stubbed at most once, so a step costs the same at turn 5 and at turn 5,000.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._keywords import keywords_checked
from ._json import canonical_json, fingerprint
from ._tokens import text_units
from .tools._executor import ResultCache, ToolResult

__all__ = ["Compaction", "OutgoingView", "ElidedAwareCache", "STUB_PREFIX"]

STUB_PREFIX = "[elided by loopfence"


@keywords_checked
@dataclass(frozen=True, slots=True)
class Compaction:
    """keep_turns: tool results of the last K turns go out whole; older ones as stubs.
    None keeps everything (compaction off). min_chars: results shorter than this are never stubbed
    (a stub would save next to nothing). A turn is one assistant reply that asked for tools."""

    keep_turns: int | None = 1
    min_chars: int = 300
    max_arg_chars: int = 160

    def __post_init__(self) -> None:
        if self.keep_turns is not None and (isinstance(self.keep_turns, bool) or self.keep_turns < 1):
            raise ValueError(f"Compaction keep_turns must be >= 1 or None (off), got {self.keep_turns!r}")
        if self.min_chars < 0:
            raise ValueError(f"Compaction min_chars must be >= 0, got {self.min_chars!r}")

    @classmethod
    def off(cls) -> Compaction:
        return cls(keep_turns=None)

    @property
    def enabled(self) -> bool:
        return self.keep_turns is not None

    def to_json(self) -> dict[str, Any]:
        return {"keep_turns": self.keep_turns, "min_chars": self.min_chars}

    def stub(self, name: str, raw_arguments: str, step: int, size: int, fp: str, again: bool) -> str:
        """again: the tool is read-only, so asking for the same call shows the result again."""
        args = raw_arguments if len(raw_arguments) <= self.max_arg_chars else \
            raw_arguments[: self.max_arg_chars - 1] + "…"
        return (f"{STUB_PREFIX} to save context: the result of {name} {args} (step {step}, {size:,} "
                f"characters, fingerprint {fp})." + (" Call it again to see it.]" if again else "]"))


@dataclass(frozen=True, slots=True)
class _CallInfo:
    name: str
    arguments: str
    step: int


@dataclass
class OutgoingView:
    """The conversation as sent: the originals, with old tool results replaced by stubs."""

    policy: Compaction = field(default_factory=Compaction)
    rereadable: frozenset[str] = frozenset()  # read-only tools: their stubs say "call it again"
    messages: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0  # `text_units` of the canonical JSON of `messages`
    version: int = 0  # bumps on every change: a cache key for token counts
    elided: int = 0  # results stubbed so far
    added: int = 0  # units ever appended (only grows)
    saved: int = 0  # units removed by stubs (only grows)
    elided_fps: set[str] = field(default_factory=set)  # fingerprints of contents the model no longer sees
    sent_elided: frozenset[str] = frozenset()  # elided_fps as of the last request sent
    _sizes: list[int] = field(default_factory=list)
    _turns: list[list[tuple[int, _CallInfo]]] = field(default_factory=list)  # tool messages per turn
    _calls: dict[str, _CallInfo] = field(default_factory=dict)  # the current turn's calls, by id
    _steps: int = 0  # assistant messages seen
    _done: int = 0  # turns already compacted

    def add(self, message: dict[str, Any], size: int) -> None:
        """Append one original message with its size (text_units of its canonical JSON: measured once)."""
        index = len(self.messages)
        self.messages.append(message)
        self._sizes.append(size)
        self.size += size
        self.added += size
        self.version += 1
        role = message.get("role")
        if role == "assistant":
            self._steps += 1
            calls = message.get("tool_calls") or []
            if calls:  # ids are only unique within a reply (some servers reuse them): map per turn
                self._turns.append([])
                self._calls = {}
                for c in calls:
                    fn = c.get("function") or {}
                    self._calls.setdefault(str(c.get("id")), _CallInfo(
                        str(fn.get("name")), str(fn.get("arguments") or ""), self._steps))
                if self.policy.keep_turns is not None:
                    self._compact_through(len(self._turns) - self.policy.keep_turns)
        elif role == "tool" and self._turns:
            if self.elided_fps and isinstance(message.get("content"), str):
                self.elided_fps.discard(fingerprint(message["content"]))  # in sight again
            info = self._calls.get(str(message.get("tool_call_id"))) or _CallInfo("a tool", "", self._steps)
            self._turns[-1].append((index, info))

    def mark_sent(self) -> None:
        """A request went out: what it elided is what the model could not see when it replied."""
        if self.sent_elided != self.elided_fps:
            self.sent_elided = frozenset(self.elided_fps)

    def _compact_through(self, turns: int) -> None:
        while self._done < turns:
            for index, info in self._turns[self._done]:
                self._stub(index, info)
            self._turns[self._done] = []  # done: nothing more to remember about it
            self._done += 1

    def _stub(self, index: int, info: _CallInfo) -> None:
        msg = self.messages[index]
        content = msg.get("content")
        if not isinstance(content, str) or len(content) < self.policy.min_chars:
            return
        fp = fingerprint(content)
        text = self.policy.stub(info.name, info.arguments, info.step, len(content), fp,
                                info.name in self.rereadable)
        stub = {**msg, "content": text}
        size = text_units(canonical_json(stub))
        if size >= self._sizes[index]:
            return
        self.saved += self._sizes[index] - size
        self.size += size - self._sizes[index]
        self._sizes[index] = size
        self.messages[index] = stub
        self.elided_fps.add(fp)
        self.elided += 1
        self.version += 1


class ElidedAwareCache(ResultCache):
    """The read-only cache, less what the view elided: asking again for a result the model could not
    see in the request it answered runs the (read-only) tool again. That is new information for the
    model, not a no-progress reuse; max_repeats still bounds how often one call may be asked for.
    A result the model saw whole in that request is reused, even if it has been elided since."""

    def __init__(self, view: OutgoingView) -> None:
        super().__init__()
        self.view = view

    def get(self, key: str) -> ToolResult | None:
        found = super().get(key)
        if found is not None and self.view.sent_elided and found.fingerprint in self.view.sent_elided:
            return None
        return found
