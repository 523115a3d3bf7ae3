"""The repetition rules, written once: the guards apply them live, reconcile folds a log through them.

- **A repeat is the same call with nothing changed in between.** `RepeatCounts` counts the model
  replies asking for each canonical call; a call's count restarts whenever another call changes the
  world (an executed side-effecting call with a different key: the same notion that clears the
  read-only cache). After an edit, the same read or the same test is a new question. Scope "run"
  (`Policy(repeat_scope="run")`) counts over the whole run instead.
- **Identical results in a row, whatever the call** (`Streak`): a loop that learns nothing new.
  Except steady work: a side-effecting call that succeeded with an empty output (`empty_output`: six
  file writes in a row, a script appended line by line) changed something and says nothing, so its
  result counts in the streak only against earlier results of the *same* call (`streak_token`). A
  run of identical errors, or of identical non-empty results, counts whatever the calls.
- **Cycles are caught by what they return** (`CycleTrail`): over the executed calls as (canonical
  key, result fingerprint), a block of 2 or 3 that comes back `times` times in a row with identical
  results ("the same edit, then the same failing test, forever").

Results are compared by `outcome_fingerprint`: the result's fingerprint without what differs between
two identical outcomes: the shell's `duration_s`, and the timings a program prints (a test runner's
`Ran 1 test in 0.012s`, `1 failed in 0.05s (0:00:00)`, go's `(0.00s)`, `Time: 1.2 s`), clock times
(`12:04:31`, `2026-12-01T12:04:31.5`) and the process ids a harness prints (`Process Group PGID: 25158`),
each read as one placeholder.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import Literal

from ._json import canonical_json, fingerprint, loads_object

__all__ = ["RepeatScope", "RepeatCounts", "Streak", "CycleTrail", "CYCLE_PERIODS", "outcome_fingerprint",
           "empty_output", "streak_token", "call_label", "call_text", "describe_cycle"]

RepeatScope = Literal["change", "run"]
CYCLE_PERIODS = (2, 3)  # a period of 1 is the same call again: repeated_call and the streak see it
_VOLATILE = "duration_s"
_TIMING = re.compile(  # a duration with its unit, a clock time (with a date before it, if any); it starts
    # with a digit (not after a letter, digit or dot), so the scan skips ahead to the next digit; what it
    # takes is never given back (possessive: what could follow a digit given back is a digit, which none of
    # the next parts starts with), so a number that is neither is left at once (a result of a few KB full of
    # line numbers took 48 µs, 28 so)
    r"[0-9](?<![\w.][0-9])(?:[0-9]*+(?:\.[0-9]+)?+\s?+(?:ms|µs|us|ns|s|sec|secs|seconds)\b"
    r"|[0-9]*+(?:-[0-9][0-9]-[0-9][0-9][T ][0-9][0-9]?)?+:[0-9][0-9]:[0-9][0-9](?:[.,][0-9]+)?(?![0-9]))")
# the process ids a harness prints after a command (Gemini CLI: "Process Group PGID: 25158", "Background
# PIDs: 101, 102"), different each time the same command runs
_PIDS = re.compile(r"\b(PGID|PIDs?)(\s*[:=]\s*)[0-9]+(?:\s*,\s*[0-9]+)*")
_LABEL_ARGS = ("path", "command", "cmd", "file", "filename", "url", "query", "name")
_EXIT = ("exit_code", "returncode", "return_code", "exit_status")  # a result's exit status: 0 is success
_META = ("duration_s", "sandbox", "timed_out", "truncated", "cwd", "command", "cmd")  # say how it ran, not what
# a JSON result is empty only if every other field is empty (an unknown field that says anything, an
# error of another name included, makes it a result that says something)
_RETURNCODE = re.compile(r"<returncode>\s*(-?[0-9]+)\s*</returncode>", re.IGNORECASE)  # mini-swe-agent's
_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")
_LABEL_CHARS = 40


class RepeatCounts:
    """Model replies asking for each canonical call, since the world last changed (scope "change")
    or since the run began (scope "run")."""

    __slots__ = ("scope", "counts")

    def __init__(self, scope: str = "change") -> None:
        if scope not in ("change", "run"):
            raise ValueError(f"repeat scope must be 'change' or 'run', got {scope!r}")
        self.scope = scope
        self.counts: dict[str, int] = {}

    def asked(self, keys: Iterable[str]) -> None:
        """One model reply's keys (a call asked twice in one reply counts once: pass a set)."""
        counts = self.counts
        for k in keys:
            counts[k] = counts.get(k, 0) + 1

    def changed(self, key: str) -> None:
        """A side-effecting call with this key was executed: every other call's count restarts."""
        if self.scope == "change" and self.counts:
            n = self.counts.get(key)
            self.counts = {} if n is None else {key: n}

    def __getitem__(self, key: str) -> int:
        return self.counts.get(key, 0)

    def copy(self) -> RepeatCounts:
        new = RepeatCounts(self.scope)
        new.counts = dict(self.counts)
        return new


class Streak:
    """Executed results in a row with one fingerprint, whatever the call."""

    __slots__ = ("last", "length")

    def __init__(self) -> None:
        self.last: str | None = None
        self.length = 0

    def add(self, fp: str) -> int:
        self.length = self.length + 1 if fp == self.last else 1
        self.last = fp
        return self.length


class CycleTrail:
    """The last executed (key, fingerprint) pairs; `add` answers the block of 2 or 3 that has just
    come back `times` times in a row (oldest first), or None."""

    __slots__ = ("times", "recent")

    def __init__(self, times: int) -> None:
        self.times = times
        self.recent: deque[tuple[str, str]] = deque(maxlen=max(CYCLE_PERIODS) * times)

    def copy(self) -> CycleTrail:
        new = CycleTrail(self.times)
        new.recent.extend(self.recent)
        return new

    def add(self, key: str, fp: str) -> tuple[tuple[str, str], ...] | None:
        r = self.recent
        r.append((key, fp))
        for p in CYCLE_PERIODS:
            n = p * self.times
            if len(r) < n:
                return None
            if r[-1] != r[-1 - p]:
                continue
            tail = list(r)[-n:]
            block = tail[:p]
            if len(set(block)) > 1 and tail == block * self.times:  # a uniform block is period 1
                return tuple(block)
        return None


_LAST: list[tuple[str, str]] = [("", fingerprint(""))]  # the streak and the cycle guard ask in turn


def outcome_fingerprint(content: str) -> str:
    """The fingerprint repetition rules compare: a result's, leaving out a top-level `duration_s`
    (the shell reports its timing, so two identical outcomes would never look identical)."""
    last = _LAST[0]
    if last[0] is content:
        return last[1]
    fp = _outcome(content)
    _LAST[0] = (content, fp)  # one atomic store: a concurrent run at worst computes it again
    return fp


def _outcome(content: str) -> str:
    if content.startswith("{") and f'"{_VOLATILE}"' in content:
        try:
            value = loads_object(content)
        except ValueError:
            value = None
        if isinstance(value, dict) and _VOLATILE in value:
            del value[_VOLATILE]
            content = canonical_json(value)
    content = _TIMING.sub("<time>", content)
    if "PID" in content or "PGID" in content:  # (the scan for them costs ten times this look)
        content = _PIDS.sub(r"\1\2<pid>", content)
    return fingerprint(content)


def empty_output(content: str) -> bool:
    """Whether a result says nothing but success: empty text; a JSON object whose fields are all empty
    but a zero (or no) exit status, a true `ok` / `success` and how it ran (`duration_s`, `sandbox`:
    `{"ok": true, "exit_code": 0, "stdout": "", "duration_s": 0.1}`); or
    text whose markup is all it has, with no non-zero return code (mini-swe-agent's
    `<returncode>0</returncode><output></output>`)."""
    text = content.strip()
    if not text:
        return True
    if text[0] == "{":
        try:
            value = loads_object(text)
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        return all(value.get(k) in (None, 0) for k in _EXIT) and value.get("ok", True) is True and \
            value.get("success", True) is True and not any(
                v for k, v in value.items() if k not in _EXIT and k not in _META and k not in ("ok", "success"))
    if any(code != "0" for code in _RETURNCODE.findall(text)):
        return False
    return not _TAG.sub("", _RETURNCODE.sub("", text)).strip()


def streak_token(key: str, fp: str, side_effect: bool, ok: bool, content: str) -> str:
    """What one executed result adds to the identical-results streak: its fingerprint; for a
    side-effecting call that succeeded with an empty output, its fingerprint and its call (module doc)."""
    return f"{fp} {key}" if side_effect and ok and empty_output(content) else fp


def call_label(key: str) -> str:
    """A short name for a canonical call: `write_file a.py`, `run_tests pytest -q`, `ping`."""
    name, _, raw = key.partition(":")
    try:
        args = loads_object(raw)
    except ValueError:
        return name
    if not isinstance(args, dict) or not args:
        return name
    pick = next((args[k] for k in _LABEL_ARGS if isinstance(args.get(k), str)), None)
    if pick is None and len(args) == 1:
        pick = next(iter(args.values()))
    if pick is None:
        return name
    text = " ".join((pick if isinstance(pick, str) else canonical_json(pick)).split())
    return f"{name} {text if len(text) <= _LABEL_CHARS else text[:_LABEL_CHARS - 1] + '…'}"


def call_text(key: str, limit: int = 300) -> str:
    """A canonical call as the model could write it: `read_file {"path":"a.py"}` (clipped)."""
    name, sep, raw = key.partition(":")
    text = f"{name} {raw}" if sep and raw not in ("", "{}") else name
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe_cycle(block: Iterable[tuple[str, str]], times: int) -> str:
    return f"{' → '.join(call_label(k) for k, _ in block)}: {times} times with identical results"
