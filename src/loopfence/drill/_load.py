"""Loading scenario files: every field validated, errors name the file and the field (ScenarioError)."""

from __future__ import annotations

import json
import re
import tempfile
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from .._json import MAX_INPUT_BYTES, JsonFileError, JsonLimitError, loads, read_bounded
from .._limits import Limits, Policy
from ..tools import workspace_tools
from ._fields import Fields
from ._parts import parse_canned, parse_expect, parse_replies
from ..mcp import McpServer
from ..tools._registry import ToolKind
from ._scenario import Scenario, ScenarioError, ScenarioMcp
from ._stubs import STUB_NAMES

__all__ = ["load_scenario", "load_scenarios", "load_each", "find_scenario_files", "builtin_tool_names",
           "known_tool_names", "SCENARIO_KEYS"]

SCENARIO_KEYS = ("name", "description", "task", "system", "workspace", "symlinks", "tools",
                 "canned_tools", "limits", "policy", "params", "stream", "replies", "expect", "mcp")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@cache
def builtin_tool_names() -> tuple[str, ...]:
    """The names `workspace_tools` offers (built once over an empty folder)."""
    with tempfile.TemporaryDirectory(prefix="loopfence-names-") as tmp:
        return tuple(t.name for t in workspace_tools(tmp))


def known_tool_names() -> tuple[str, ...]:
    """The tool names a scenario may list: the built-in workspace tools and the drill's stub tools."""
    return (*builtin_tool_names(), *STUB_NAMES)


def find_scenario_files(paths: list[str | Path]) -> list[Path]:
    """Every *.json under the given files/folders, sorted per folder. Missing paths are errors."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(x for x in p.rglob("*.json") if x.is_file())
            if not found:
                raise ScenarioError(p, "", "no scenario files (*.json) in this folder")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise ScenarioError(p, "", "no such file or folder")
    return out


def load_scenarios(paths: list[str | Path]) -> list[Scenario]:
    """All scenarios under `paths`; the first bad file raises ScenarioError. Names must be unique."""
    scenarios: list[Scenario] = []
    for item in load_each(paths):
        if isinstance(item, ScenarioError):
            raise item
        scenarios.append(item)
    return scenarios


def load_each(paths: list[str | Path], *, any_tool: bool = False) -> list[Scenario | ScenarioError]:
    """Every file under `paths`, in order: its scenario, or the ScenarioError that names the file and
    the field (a name already used by an earlier file is one too), so one bad file does not stop the
    others. A missing path or an empty folder still raises (there is no file to report). `any_tool`:
    expected calls may name tools the files do not list (`loopfence drill --mcp` brings more)."""
    out: list[Scenario | ScenarioError] = []
    seen: dict[str, str] = {}
    for p in find_scenario_files(paths):
        try:
            s = load_scenario(p, any_tool=any_tool)
            if s.name in seen:
                raise ScenarioError(p, "name", f"{s.name!r} is already used by {seen[s.name]}")
        except ScenarioError as exc:
            out.append(exc)
            continue
        seen[s.name] = str(p)
        out.append(s)
    return out


def load_scenario(path: str | Path, *, any_tool: bool = False) -> Scenario:
    """Read and check one scenario file; ScenarioError names the file and the field. `any_tool`:
    accept tool names beyond the built-ins and the stubs."""
    p = Path(path)
    try:
        text = read_bounded(p, MAX_INPUT_BYTES, "scenario file").decode("utf-8")
    except JsonFileError as exc:
        raise ScenarioError(p, "", str(exc).removeprefix(f"{p}: ")) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(p, "", f"cannot read: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        raise ScenarioError(p, "", "empty file: a scenario is one JSON object")
    try:
        data = loads(text)
    except JsonLimitError as exc:
        raise ScenarioError(p, "", f"JSON over a limit: {exc.msg}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(p, "", f"line {exc.lineno} column {exc.colno}: not valid JSON: {exc.msg}") from None
    return parse_scenario(data, str(p), any_tool=any_tool)


def parse_scenario(data: Any, file: str, *, any_tool: bool = False) -> Scenario:
    f = Fields.of(file, "", data)
    f.only(SCENARIO_KEYS)
    name = f.string("name", required=True) or ""
    if not _NAME.match(name):
        f.fail("name", f"{name!r}: use letters, digits, '.', '_' and '-' (it names the log file)")
    tools = f.strings("tools")
    known = known_tool_names()
    for i, t in enumerate(tools):
        if t not in known:
            raise ScenarioError(file, f"tools[{i}]", f"unknown tool {t!r} (known: {', '.join(known)})")
        if tools.index(t) != i:
            raise ScenarioError(file, f"tools[{i}]", f"{t!r} is listed twice")
    canned_f = f.obj("canned_tools")
    canned = []
    for cname, spec in (canned_f.data.items() if canned_f else ()):
        if not _NAME.match(cname):
            canned_f.fail(cname, "a tool name uses letters, digits, '.', '_' and '-'")  # type: ignore[union-attr]
        if cname in tools:
            canned_f.fail(cname, f"{cname!r} is also enabled in tools")  # type: ignore[union-attr]
        canned.append(parse_canned(Fields.of(file, f"canned_tools.{cname}", spec), cname))
    expect_f = f.obj("expect")
    workspace = _paths(f, "workspace")
    mcp = _mcp(f)
    enabled = None if mcp is not None or any_tool else set(tools) | {c.name for c in canned}
    return Scenario(
        name=name, task=f.string("task", required=True) or "", replies=parse_replies(f), file=file,
        description=f.string("description", "") or "", system=f.string("system"),
        workspace=workspace, symlinks=_links(f, workspace), tools=tuple(tools),
        canned_tools=tuple(canned), limits=_limits(f), policy=_policy(f), params=_params(f),
        stream=f.boolean("stream", False),
        expect=parse_expect(expect_f, enabled) if expect_f else None, mcp=mcp,
    )


MCP_KEYS = ("servers", "trust", "kinds")


def _mcp(f: Fields) -> ScenarioMcp | None:
    sub = f.obj("mcp")
    if sub is None:
        return None
    sub.only(MCP_KEYS)
    servers = sub.strings("servers")
    if not servers:
        sub.fail("servers", "name at least one MCP server ('[NAME=]COMMAND ARGS' or '[NAME=]http(s)://URL')")
    for i, text in enumerate(servers):
        try:
            McpServer.parse(text)
        except ValueError as exc:
            sub.fail(f"servers[{i}]", str(exc))
    raw_trust = sub.data.get("trust", False)
    trust: bool | tuple[str, ...] = raw_trust if isinstance(raw_trust, bool) else tuple(sub.strings("trust"))
    kinds = sub.string_map("kinds")
    for name, kind in kinds.items():
        if kind not in {str(k) for k in ToolKind}:
            sub.fail(f"kinds.{name}", f"unknown kind {kind!r} (known: {', '.join(str(k) for k in ToolKind)})")
    return ScenarioMcp(tuple(servers), trust, kinds)


def _relative(f: Fields, key: str, rel: str) -> None:
    parts = PurePosixPath(rel).parts
    if not rel or rel.startswith(("/", "\\")) or ".." in parts or not parts or "\\" in rel:
        f.fail(key, "must be a relative path inside the workspace (no '..', no leading '/')")


def _paths(f: Fields, key: str) -> dict[str, str]:
    files = f.string_map(key)
    sub = f.obj(key)
    for rel in files:
        _relative(sub, rel, rel)  # type: ignore[arg-type]
    return files


def _links(f: Fields, files: dict[str, str]) -> dict[str, str]:
    links = _paths(f, "symlinks")
    sub = f.obj("symlinks")
    for rel, target in links.items():
        if not target:
            sub.fail(rel, "link target must not be empty")  # type: ignore[union-attr]
    _no_conflicts(f, files, links)
    return links


def _no_conflicts(f: Fields, files: dict[str, str], links: dict[str, str]) -> None:
    """Every workspace file and link gets its own path: none is inside another (a file cannot also
    be a folder) and no two name the same path (after 'a//b' and 'a/./b' become 'a/b')."""
    seen: dict[PurePosixPath, str] = {}
    entries = [("workspace", rel) for rel in files] + [("symlinks", rel) for rel in links]
    for key, rel in entries:
        norm = PurePosixPath(rel)
        if norm in seen:
            f.fail(f"{key}.{rel}", f"names the same path as {seen[norm]}")
        seen[norm] = f"{key}.{rel}"
    for key, rel in entries:
        for parent in PurePosixPath(rel).parents:
            if parent in seen and str(parent) != ".":
                f.fail(f"{key}.{rel}", f"cannot be inside {seen[parent]}: that is a file, not a folder")


def _limits(f: Fields) -> Limits:
    sub = f.obj("limits")
    if sub is None:
        return Limits()
    for k, v in sub.data.items():
        try:
            Limits.from_json({k: v})
        except ValueError as exc:
            sub.fail(k, str(exc))
    return Limits.from_json(sub.data)


def _policy(f: Fields) -> Policy:
    sub = f.obj("policy")
    try:
        return Policy.from_json(sub.data) if sub else Policy()
    except ValueError as exc:
        raise ScenarioError(f.file, "policy", str(exc)) from None


def _params(f: Fields) -> dict[str, Any]:
    sub = f.obj("params")
    return dict(sub.data) if sub else {}
