"""A batch's results: one row per finished episode (`results.jsonl`) and the summary over them.

The rows file is append-only, one complete line per `write` (a kill loses nothing that finished);
reading it back cuts off an incomplete last line (a kill mid-write) and refuses anything else that
is not a row, naming the line.
"""

from __future__ import annotations

import functools
import math
import os
import types
import typing
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._json import dumps, loads
from .._log._schema import StopLine
from .._stops import RunResult, StopReason, Verdict

__all__ = ["EpisodeResult", "ResultsFile", "ResultsError", "Summary", "summarize", "percentile",
           "SUMMARY_FORMAT"]

SUMMARY_FORMAT = "loopfence.batch"


class ResultsError(ValueError):
    """results.jsonl holds something that is not a row (the message names the line)."""


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """One row of results.jsonl. `stop` None: the episode could not run (`error` says why)."""

    id: str
    stop: str | None
    verdict: str | None
    detail: str = ""
    requests: int = 0
    tool_calls: int = 0  # calls the model asked for
    executions: int = 0  # calls that really ran
    reuses: int = 0
    refusals: int = 0
    rejections: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    final_answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1
    resumed: bool = False  # continued from its log after the batch was killed
    log: str | None = None  # relative to the batch folder
    cpu_s: float | None = None  # the ring's CPU (RunResult.cpu_s); None when not measured
    error: str | None = None
    cost_usd: float | None = None  # dollars, where the run was priced (a cost budget or a price table)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def finished(self) -> bool:
        return self.error is None

    @classmethod
    def of_run(cls, ident: str, result: RunResult, metadata: dict[str, Any], attempts: int, log: str,
               resumed: bool = False) -> EpisodeResult:
        led = result.ledger
        return cls(ident, str(result.stop.reason), str(result.verdict), result.stop.detail,
                   led.model_requests, led.tool_calls, led.tool_executions, led.reused, led.refused,
                   led.rejected, led.prompt_tokens, led.completion_tokens, round(led.elapsed_s, 6),
                   result.final_answer, metadata, attempts, resumed, log, result.cpu_s,
                   cost_usd=led.cost_usd)

    @classmethod
    def of_stop(cls, ident: str, stop: StopLine, metadata: dict[str, Any], attempts: int, log: str,
                resumed: bool = False) -> EpisodeResult:
        """The row of a run whose log ended (its stop line) before its row was written."""
        led = stop.ledger
        return cls(ident, str(stop.reason), str(stop.verdict), stop.detail, int(led.get("model_requests", 0)),
                   int(led.get("tool_calls", 0)), int(led.get("tool_executions", 0)), int(led.get("reused", 0)),
                   int(led.get("refused", 0)), int(led.get("rejected", 0)), int(led.get("prompt_tokens", 0)),
                   int(led.get("completion_tokens", 0)), float(led.get("elapsed_s", 0.0)), stop.final_answer,
                   metadata, attempts, resumed, log, cost_usd=_dollars(led.get("cost_usd")))

    @classmethod
    def failed(cls, ident: str, error: str, metadata: dict[str, Any], attempts: int = 1,
               log: str | None = None) -> EpisodeResult:
        return cls(ident, None, None, error, metadata=metadata, attempts=attempts, log=log, error=error)

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}  # shallow: written at once
        out["tokens"] = self.tokens
        for key in ("error", "cost_usd"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeResult:
        """A row read back; a field of the wrong type, an unknown stop or verdict, or a missing
        field is a ValueError naming it (unknown fields are left out)."""
        for name in ("id", "stop", "verdict"):
            if name not in data:
                raise ValueError(f"field {name!r} is missing")
        for name, kinds in _row_types().items():
            value = data.get(name)
            if name in data and not (isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))):
                words = " or ".join(_WORDS[k] for k in kinds if not (k is int and float in kinds))
                raise ValueError(f"field {name!r} must be {words}, got {type(value).__name__}")
        for name, known in (("stop", _STOPS), ("verdict", _VERDICTS)):
            if data[name] is not None and data[name] not in known:
                raise ValueError(f"field {name!r}: unknown {name} {data[name]!r}")
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


_WORDS = {str: "a string", type(None): "null", dict: "an object", bool: "true or false", int: "an integer",
          float: "a number"}


@functools.cache
def _row_types() -> dict[str, tuple[type, ...]]:
    """Each field's JSON types, from EpisodeResult's own annotations (a float field takes an int)."""
    out: dict[str, tuple[type, ...]] = {}
    for name, hint in typing.get_type_hints(EpisodeResult).items():
        kinds = tuple(typing.get_origin(k) or k for k in typing.get_args(hint)) \
            if isinstance(hint, types.UnionType) else (typing.get_origin(hint) or hint,)
        out[name] = (int, *kinds) if float in kinds else kinds
    return out


_STOPS = frozenset(r.value for r in StopReason)
_VERDICTS = frozenset(v.value for v in Verdict)


def _dollars(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ResultsFile:
    """results.jsonl: `load()` reads the rows back (repairing a torn last line), `append(row)`
    adds one (a single write of a whole line), `rewrite(rows)` replaces the file atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.torn_bytes = 0
        self._fd: int | None = None

    def load(self) -> list[EpisodeResult]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        if data and not data.endswith(b"\n"):  # a kill mid-write: that episode has no row yet
            cut = data.rfind(b"\n") + 1
            self.torn_bytes = len(data) - cut
            os.truncate(self.path, cut)
            data = data[:cut]
        rows = []
        for n, raw in enumerate(data.split(b"\n")[:-1], 1):
            if not raw.strip():
                continue
            try:
                item = loads(raw)
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    raise ValueError("not a results row (an object with an id)")
                rows.append(EpisodeResult.from_json(item))
            except (ValueError, TypeError) as exc:
                raise ResultsError(f"{self.path}:{n}: {exc}") from None
        return rows

    def append(self, row: EpisodeResult) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data = (dumps(row.to_json()) + "\n").encode("utf-8")
        while data:
            data = data[os.write(self._fd, data):]

    def rewrite(self, rows: Iterable[EpisodeResult]) -> None:
        self.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(dumps(r.to_json()) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank (p in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class Summary:
    """The whole job (every row so far) and, under `this_run`, the invocation that wrote it."""

    episodes: int  # in the job
    finished: int  # rows with a stop
    errors: int  # rows of episodes that could not run
    pending: int  # no row yet (interrupted: `--resume` finishes them)
    by_stop: dict[str, int]
    ship: int
    ship_rate: float | None
    requests: int
    tool_calls: int
    executions: int
    executions_saved: int  # requested minus executed: calls the fence answered without running
    reuses: int
    refusals: int
    rejections: int
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    tokens_p50: int | None
    tokens_p95: int | None
    seconds: float
    seconds_p50: float | None
    seconds_p95: float | None
    retries: int  # re-runs done (attempts beyond the first, over every episode)
    retried_episodes: int
    retry_stops: tuple[str, ...]
    max_retries: int
    resumed: int  # episodes continued from their logs
    this_run: dict[str, Any] = field(default_factory=dict)
    cost_usd: float | None = None  # dollars over the priced episodes (None: none was priced)
    cost_usd_p50: float | None = None
    cost_usd_p95: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": SUMMARY_FORMAT, "version": 1, **asdict(self), "retry_stops": list(self.retry_stops)}


def summarize(rows: Sequence[EpisodeResult], total: int, *, retry_stops: Iterable[str] = (),
              max_retries: int = 0, this_run: dict[str, Any] | None = None) -> Summary:
    done = [r for r in rows if r.finished]
    by_stop = Counter(str(r.stop) for r in done)
    ship = sum(r.verdict == str(Verdict.SHIP) for r in done)
    order = {str(s): i for i, s in enumerate(StopReason)}

    def total_of(name: str) -> int:
        return sum(int(getattr(r, name)) for r in done)

    tokens = [r.tokens for r in done]
    seconds = [r.seconds for r in done]
    p50, p95 = percentile(tokens, 50), percentile(tokens, 95)
    s50, s95 = percentile(seconds, 50), percentile(seconds, 95)
    costs = [r.cost_usd for r in done if r.cost_usd is not None]
    return Summary(
        episodes=total, finished=len(done), errors=len(rows) - len(done), pending=max(total - len(rows), 0),
        by_stop=dict(sorted(by_stop.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))), ship=ship,
        ship_rate=round(ship / len(done), 6) if done else None, requests=total_of("requests"),
        tool_calls=total_of("tool_calls"), executions=total_of("executions"),
        executions_saved=total_of("tool_calls") - total_of("executions"), reuses=total_of("reuses"),
        refusals=total_of("refusals"), rejections=total_of("rejections"),
        prompt_tokens=total_of("prompt_tokens"), completion_tokens=total_of("completion_tokens"),
        tokens=sum(tokens), tokens_p50=None if p50 is None else int(p50), tokens_p95=None if p95 is None else int(p95),
        seconds=round(sum(seconds), 6), seconds_p50=s50, seconds_p95=s95,
        retries=sum(r.attempts - 1 for r in rows), retried_episodes=sum(r.attempts > 1 for r in rows),
        retry_stops=tuple(retry_stops), max_retries=max_retries, resumed=sum(r.resumed for r in rows),
        this_run=dict(this_run or {}), cost_usd=round(sum(costs), 9) if costs else None,
        cost_usd_p50=percentile(costs, 50), cost_usd_p95=percentile(costs, 95))
