"""Episodes: one line of an EPISODES.jsonl file each, validated before anything runs.

A line is a JSON object: `id` and `task`, and optionally `system`, `workspace` (a folder, relative
to the file's folder, copied for each episode), `limits`, `policy`, `params`, `tools` (names) and
`metadata` (carried through to the results). Unknown keys are errors (a typo must not silently drop
a setting). Every problem names the file, the line and the field; `load_episodes` reports all of
them at once (EpisodeError) and nothing runs.
"""

from __future__ import annotations

import difflib

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import MAX_INPUT_BYTES, JsonLimitError, loads
from .._limits import Limits, Policy
from ..tools._builtin import BUILTIN_NAMES

__all__ = ["Episode", "EpisodeError", "Problem", "load_episodes", "parse_episodes", "EPISODE_KEYS",
           "ID_PATTERN", "NOT_PARAMS"]

EPISODE_KEYS = ("id", "task", "system", "workspace", "limits", "policy", "params", "tools", "metadata")
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # it names the episode's log file
NOT_PARAMS = ("model", "messages", "tools", "stream", "stream_options")  # the model adapter's own
SHOWN = 20  # problems listed in one EpisodeError


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int
    field: str
    problem: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.problem}" if self.field else f"{where}: {self.problem}"


UNKNOWN_KEY = "unknown key"


class EpisodeError(ValueError):
    """Episodes that cannot be used; `problems` names each file, line and field."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        shown = "; ".join(str(p) for p in problems[:SHOWN])
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        keys = f"; an episode's keys are {', '.join(EPISODE_KEYS)}" \
            if any(p.problem.startswith(UNKNOWN_KEY) for p in problems) else ""  # said once, not per line
        super().__init__((f"{len(problems)} bad episode line(s): {shown}{more}" if len(problems) > 1
                          else shown) + keys)


@dataclass(frozen=True, slots=True)
class Episode:
    """One episode. `limits`/`policy`/`params` hold the episode's own settings (validated): the
    batch's defaults apply under them, key by key. `tools` None: the defaults (see `tool_names`)."""

    id: str
    task: str
    system: str | None = None
    workspace: str | None = None  # an absolute folder, copied for the episode
    limits: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    tools: tuple[str, ...] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    line: int = 0  # where it came from (0: built in Python)

    def effective_limits(self, base: Limits | None = None) -> Limits:
        """The batch's limits with this episode's own on top."""
        if not self.limits:
            return base or Limits()
        typed = Limits.from_json(dict(self.limits))
        return (base or Limits()).replace(**{k: getattr(typed, k) for k in self.limits})

    def effective_policy(self, base: Policy | None = None) -> Policy:
        return Policy.from_json({**(base or Policy()).to_json(), **self.policy})

    def builtin_names(self) -> tuple[str, ...]:
        """The built-in tools this episode gets: those it names; by default all of them when it has
        a workspace, none without one."""
        if self.tools is None:
            return BUILTIN_NAMES if self.workspace is not None else ()
        return tuple(n for n in self.tools if n in BUILTIN_NAMES)

    def custom_names(self) -> tuple[str, ...] | None:
        """The custom tools it names (None: every custom tool, the default)."""
        if self.tools is None:
            return None
        return tuple(n for n in self.tools if n not in BUILTIN_NAMES)

    @property
    def needs_workspace(self) -> bool:
        return self.workspace is not None or bool(self.builtin_names())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "task": self.task}
        for key in ("system", "workspace"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for key in ("limits", "policy", "params", "metadata"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.tools is not None:
            out["tools"] = list(self.tools)
        return out


def load_episodes(path: str | Path, *, custom_tools: Iterable[str] | None = None,
                  check_workspaces: bool = True) -> list[Episode]:
    """Every episode of a JSONL file, or EpisodeError listing every bad line (file, line, field).
    `custom_tools`: the names `tools` may use besides the built-ins (None: any name);
    `check_workspaces`: each workspace must be a folder now."""
    p = Path(path)
    problems: list[Problem] = []
    items: list[tuple[int, Any]] = []
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise EpisodeError([Problem(str(p), 0, "", f"cannot read: {exc.strerror or exc}")]) from None
    with fh:
        for n, raw in enumerate(fh, 1):
            if len(raw) > MAX_INPUT_BYTES:
                problems.append(Problem(str(p), n, "", f"a line of {len(raw):,} bytes (the limit is "
                                        f"{MAX_INPUT_BYTES:,})"))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problems.append(Problem(str(p), n, "", f"not UTF-8 text ({exc.reason})"))
                continue
            if not text.strip():
                continue  # blank lines are allowed (a trailing newline, spacing)
            try:
                items.append((n, loads(text)))
            except JsonLimitError as exc:
                problems.append(Problem(str(p), n, "", f"JSON over a limit: {exc.msg}"))
            except ValueError as exc:
                problems.append(Problem(str(p), n, "", f"not valid JSON: {getattr(exc, 'msg', exc)}"))
    if not items and not problems:
        problems.append(Problem(str(p), 0, "", "no episodes: the file has no lines"))
    episodes = _parse(items, str(p), p.resolve().parent, custom_tools, problems, check_workspaces)
    if problems:
        raise EpisodeError(sorted(problems, key=lambda x: x.line))
    return episodes


def parse_episodes(items: Iterable[Episode | Mapping[str, Any]], *, source: str = "<episodes>",
                   root: str | Path = ".", custom_tools: Iterable[str] | None = None,
                   check_workspaces: bool = True) -> list[Episode]:
    """Episodes given in Python (dicts in the file's format, or Episode values); numbered from 1."""
    problems: list[Problem] = []
    raw = [(i, e.to_json() if isinstance(e, Episode) else dict(e) if isinstance(e, Mapping) else e)
           for i, e in enumerate(items, 1)]
    out = _parse(raw, source, Path(root).resolve(), custom_tools, problems, check_workspaces)
    if not raw:
        problems.append(Problem(source, 0, "", "no episodes"))
    if problems:
        raise EpisodeError(problems)
    return out


def _parse(items: list[tuple[int, Any]], file: str, root: Path, custom: Iterable[str] | None,
           problems: list[Problem], check_workspaces: bool = True) -> list[Episode]:
    known = None if custom is None else {*BUILTIN_NAMES, *custom}
    seen: dict[str, int] = {}
    out = []
    for n, data in items:
        bad: list[Problem] = []
        ep = _episode(data, file, n, root, known, bad, check_workspaces)
        if ep is not None and ep.id in seen:
            first = seen[ep.id]
            bad.append(Problem(file, n, "id", f"{ep.id!r} is already used on line {first}"))
        problems.extend(bad)
        if ep is not None and not bad:
            seen[ep.id] = n
            out.append(ep)
    return out


def _episode(data: Any, file: str, n: int, root: Path, known: set[str] | None,
             bad: list[Problem], check_workspaces: bool = True) -> Episode | None:
    def fail(key: str, problem: str) -> None:
        bad.append(Problem(file, n, key, problem))

    if not isinstance(data, dict):
        fail("", f"an episode is a JSON object, got {_type(data)}")
        return None
    for key in data:
        if key not in EPISODE_KEYS:
            near = difflib.get_close_matches(str(key), EPISODE_KEYS, n=1)
            fail(str(key), UNKNOWN_KEY + (f" (did you mean {near[0]!r}?)" if near else ""))
    ident = data.get("id")
    if isinstance(ident, int) and not isinstance(ident, bool):
        ident = str(ident)
    if "id" not in data:
        fail("id", "missing required key")
    elif not isinstance(ident, str):
        fail("id", f"must be a string (or an integer), got {_type(ident)}")
    elif not ID_PATTERN.match(ident):
        fail("id", f"{ident!r}: 1-128 letters, digits, '.', '_' and '-', starting with a letter or digit "
             "(it names the episode's log file)")
    task = data.get("task")
    if "task" not in data:
        fail("task", "missing required key")
    elif not isinstance(task, str) or not task.strip():
        fail("task", f"must be a non-empty string, got {_type(task) if not isinstance(task, str) else 'empty text'}")
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        fail("system", f"must be a string or null, got {_type(system)}")
    workspace = _workspace(data.get("workspace"), root, fail, check_workspaces)
    limits = _limits(data.get("limits"), fail)
    policy = _obj(data.get("policy"), "policy", fail)
    if policy:
        try:
            Policy.from_json(policy)
        except ValueError as exc:
            fail("policy", str(exc))
    params = _obj(data.get("params"), "params", fail)
    for key in params:
        if key in NOT_PARAMS:
            fail(f"params.{key}", "set by loopfence itself, not a request parameter")
    tools = _tools(data.get("tools"), "tools" in data, known, fail)
    metadata = _obj(data.get("metadata"), "metadata", fail)
    if bad:
        return None
    return Episode(str(ident), str(task), system, workspace, limits, policy, params, tools, metadata, n)


def _type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "true/false", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _obj(value: Any, key: str, fail: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        fail(key, f"must be an object, got {_type(value)}")
        return {}
    return value


def _workspace(value: Any, root: Path, fail: Any, check: bool = True) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        fail("workspace", f"must be a folder path, got {_type(value)}")
        return None
    where = (root / value).resolve()
    if check and not where.is_dir():
        fail("workspace", f"{value}: not a folder (relative paths start at the episodes file's folder: {root})")
        return None
    return str(where)


def _limits(value: Any, fail: Any) -> dict[str, Any]:
    data = _obj(value, "limits", fail)
    good: dict[str, Any] = {}
    for key, v in data.items():
        try:
            good[key] = getattr(Limits.from_json({key: v}), key)
        except (ValueError, TypeError) as exc:
            fail(f"limits.{key}", str(exc))
    return good


def _tools(value: Any, given: bool, known: set[str] | None, fail: Any) -> tuple[str, ...] | None:
    if not given:
        return None
    if not isinstance(value, list):
        fail("tools", f"must be an array of tool names, got {_type(value)}")
        return None
    names: list[str] = []
    for i, name in enumerate(value):
        if not isinstance(name, str):
            fail(f"tools[{i}]", f"must be a string, got {_type(name)}")
        elif name in names:
            fail(f"tools[{i}]", f"{name!r} is listed twice")
        elif known is not None and name not in known:
            fail(f"tools[{i}]", f"unknown tool {name!r} (known: {', '.join(sorted(known))})")
        else:
            names.append(name)
    return tuple(names)
