"""Tools are plain functions: name, docstring -> description, signature -> JSON schema.

`Tool.validate(args)` binds arguments to the signature (defaults applied, extra and mistyped keys
refused); the bound arguments are what the canonical key is made of.
"""

from __future__ import annotations

import copy
import inspect
import os
import warnings
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .._keywords import keywords_checked
from ._jsonschema import apply_defaults, validate_schema

__all__ = ["Tool", "ToolKind", "Registry", "tool", "ArgumentError", "signature_model", "check_name", "TOOL_NAME"]


class ToolKind(StrEnum):
    """What running a tool does, which decides how the fence treats repeated calls to it."""

    READ_ONLY = "read_only"  # duplicates within a run are answered from the cache
    SIDE_EFFECT = "side_effect"  # never cached; bounded by max_repeats
    POLL = "poll"  # never cached; exempt from repetition rules

    @classmethod
    def _missing_(cls, value: object) -> ToolKind:
        """`ToolKind("readonly")`: a ValueError that lists the kinds."""
        raise ValueError(f"tool kind must be one of {', '.join(repr(k.value) for k in cls)}, got {value!r}")


class ArgumentError(ValueError):
    """Arguments that do not fit the tool's schema (missing, mistyped or extra keys)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


@dataclass(frozen=True)
class Tool:
    """One tool. Build from a function with `tool(fn, ...)` or from a JSON schema with `Tool.from_schema`.

    isolation: "async" (the default for an `async def` function) awaits it on the run's event loop
    and cancels it at the timeout. "thread" (the default otherwise) runs it on a worker thread (an
    `async def` one in its own event loop there); at the timeout the run goes on without it, so the
    timeout stops the waiting, NOT the work (Python threads cannot be killed). "process" runs it in
    a child process whose process group is killed at the timeout or when the run is cancelled, so
    the work stops too (arguments and result must be picklable). "inline" runs it on the event loop
    with NO timeout: for pure, fast functions only; the run's clock is checked again after it returns.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    kind: ToolKind = ToolKind.SIDE_EFFECT
    result_model: type[BaseModel] | None = None
    untrusted: bool = False
    isolation: str = ""  # "" -> "async" for an async def function, else "thread"
    privileged: bool = False
    args_model: type[BaseModel] | None = field(default=None, repr=False)
    self_timed: bool = False  # stops its own work by `time_left()`; the executor waits a grace past it
    info: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # for the log header
    provenance: Any = field(default=None, repr=False, compare=False)  # the workspace's, for the gate
    is_async: bool = field(init=False, default=False, repr=False, compare=False)  # fn is an async def

    def __post_init__(self) -> None:
        is_async = _is_async(self.fn)
        object.__setattr__(self, "is_async", is_async)
        if not self.isolation:
            object.__setattr__(self, "isolation", "async" if is_async else "thread")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, got {self.isolation!r}")
        if self.isolation == "async" and not is_async:
            raise ValueError(f"tool {self.name}: isolation 'async' needs an async def function")

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools[]` entry."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def validate(self, args: Any) -> dict[str, Any]:
        """Bound arguments with defaults applied, or ArgumentError naming what is wrong."""
        if not isinstance(args, dict):
            raise ArgumentError(f"arguments must be a JSON object, got {type(args).__name__}")
        if self.args_model is not None:
            try:
                bound = self.args_model.model_validate(args)
            except ValidationError as exc:
                raise ArgumentError(_describe(exc)) from None
            # field name -> value, defaults applied (extra keys are forbidden). Not dict(bound): its
            # hasattr(bound, "keys") goes through pydantic's __getattr__, ~40 µs a call.
            return dict(bound.__dict__)
        problem = validate_schema(args, self.parameters)
        if problem:
            raise ArgumentError(problem)
        return apply_defaults(args, self.parameters)

    @classmethod
    def from_schema(cls, name: str, fn: Callable[..., Any], parameters: dict[str, Any] | None = None,
                    *, description: str = "", **options: Any) -> Tool:
        params = parameters if parameters is not None else {"type": "object"}
        return cls(name, description, params, fn, **options)


ISOLATIONS = ("async", "thread", "process", "inline")


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "arguments"
        kind = err.get("type", "")
        if kind == "missing":
            parts.append(f"missing required argument {loc!r}")
        elif kind == "extra_forbidden":
            parts.append(f"unexpected argument {loc!r}")
        else:
            parts.append(f"argument {loc!r}: {err.get('msg', kind)}")
    return "; ".join(parts)


@keywords_checked
def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, kind: str = "side_effect",
         description: str | None = None, result_model: type[BaseModel] | None = None,
         untrusted: bool = False, isolation: str | None = None, privileged: bool = False,
         self_timed: bool = False) -> Any:
    """Make a Tool from a plain or `async def` function (usable bare or as `@tool(kind="read_only")`).
    isolation None: "async" for an async def function, else "thread" (see Tool)."""

    if isolation is not None and isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, got {isolation!r}")

    tool_kind = ToolKind(kind)  # a ValueError listing the kinds, at once (also as `@tool(kind=...)`)

    def build(f: Callable[..., Any]) -> Tool:
        named = check_name(name if name is not None else getattr(f, "__name__", repr(f)), name is not None)
        model, params = _arguments_of(f, named)
        doc = description if description is not None else inspect.getdoc(f) or ""
        _warn_unguided(named, f, doc)
        return Tool(named, doc, copy.deepcopy(params), f, tool_kind, result_model,
                    untrusted, isolation or "", privileged, model, self_timed)

    return build(fn) if fn is not None else build


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI's API takes as a function name


def check_name(name: Any, given: bool) -> str:
    """`name` if it is a valid tool name (1-64 letters, digits, `_` or `-`), else ValueError."""
    if isinstance(name, str) and TOOL_NAME.fullmatch(name):
        return name
    fix = "" if given else " (from the function's __name__): give one with tool(fn, name=\"...\")"
    raise ValueError(f"tool name {name!r} is not a valid function name{fix}; a tool name is 1-64 "
                     "letters, digits, '_' or '-'")


_ARGUMENT_MODELS: dict[tuple[Any, str], tuple[type[BaseModel], dict[str, Any]]] = {}
_MAX_CACHED = 1024


_WARNED: set[tuple[str, Any]] = set()  # tools warned about (once each: tools are made afresh for every run)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # loopfence/: frames a warning skips


def _outside() -> int:
    """The stacklevel of the first frame outside loopfence (a warning points at the user's line; a
    dataclass's generated `__init__`, an Agent's, is "<string>")."""
    frame, level = inspect.currentframe(), 0
    while frame is not None and (frame.f_code.co_filename == "<string>"
                                 or os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep)):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def _warn_unguided(name: str, f: Callable[..., Any], doc: str) -> None:
    """Warn once when the model would be told nothing of a tool's arguments: a parameter with no type
    hint (schema `{}`: any value); a missing description (no docstring, no `description=`) is named too."""
    try:
        untyped = [p for p, v in inspect.signature(f).parameters.items() if v.annotation is inspect.Parameter.empty]
    except (TypeError, ValueError):
        untyped = []
    missing = [*([f"type hints on {', '.join(untyped)}"] if untyped else []),
               *(["a docstring (or description=)"] if not doc.strip() else [])]
    key = (name, getattr(f, "__code__", None) or id(f))
    if not untyped or key in _WARNED:
        return
    _WARNED.add(key)
    told = ["those arguments take any value", *(["nothing of what it does"] if not doc.strip() else [])]
    warnings.warn(f"loopfence: tool {name!r} is missing {' and '.join(missing)}: the model is told "
                  f"{' and '.join(told)}; add them to the function", UserWarning, stacklevel=_outside())


def _arguments_of(f: Callable[..., Any], label: str = "") -> tuple[type[BaseModel], dict[str, Any]]:
    """The arguments' model and JSON schema, built once per code and signature: tools made afresh
    for every run or episode (closures over a workspace) share them (a pydantic model costs ms).
    `label`: the tool's name, for errors (a lambda's __name__ is `<lambda>`)."""
    sig = inspect.signature(f)
    key = (getattr(f, "__code__", f), repr(sig))
    cached = _ARGUMENT_MODELS.get(key)
    if cached is not None:
        return cached
    fields: dict[str, Any] = {}
    for pname, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {label or f.__name__}: *args/**kwargs are not allowed in tools")
        ann = p.annotation if p.annotation is not inspect.Parameter.empty else Any
        fields[pname] = (ann, ... if p.default is inspect.Parameter.empty else p.default)
    model = create_model(f"{f.__name__}_args", __base__=_Strict, **fields)
    params = model.model_json_schema()
    params.pop("title", None)
    for prop in params.get("properties", {}).values():
        prop.pop("title", None)
    params["additionalProperties"] = False
    if len(_ARGUMENT_MODELS) >= _MAX_CACHED:
        _ARGUMENT_MODELS.clear()
    _ARGUMENT_MODELS[key] = (model, params)
    return model, params


_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool,
                               "null": type(None)}
_REBUILT_KEYS = frozenset({"type", "items", "anyOf", "enum", "const", "default", "description", "title",
                           "additionalProperties"})


def signature_model(name: str, params: Any) -> type[BaseModel] | None:
    """The strict model `_arguments_of` made from a function's signature, rebuilt from the JSON schema
    it gave (a replayed run's recorded tool validates as the live one did, in the same words); None
    where the schema holds what this does not rebuild (nested models, constraints, formats)."""
    if not isinstance(params, dict) or params.get("type") != "object" or "$defs" in params:
        return None
    required = set(params.get("required") or [])
    fields: dict[str, Any] = {}
    for key, prop in (params.get("properties") or {}).items():
        ann = _annotation(prop)
        if ann is None or (key not in required and not (isinstance(prop, dict) and "default" in prop)):
            return None
        fields[key] = (ann, ... if key in required else prop["default"])
    try:
        return create_model(f"{name}_args", __base__=_Strict, **fields)
    except Exception:  # noqa: BLE001 - a name or a default pydantic refuses: the schema's own check
        return None


def _annotation(prop: Any) -> Any:
    """The annotation whose JSON schema `prop` is, or None."""
    if not isinstance(prop, dict) or not set(prop) <= _REBUILT_KEYS:
        return None
    if not prop.keys() - {"description", "title", "default"}:
        return Any
    if "anyOf" in prop:
        members = [_annotation(m) for m in prop["anyOf"]]
        return None if any(m is None for m in members) or not members else Union[tuple(members)]  # noqa: UP007
    if "enum" in prop or "const" in prop:
        values = prop["enum"] if "enum" in prop else [prop["const"]]
        return Literal[tuple(values)] if isinstance(values, list) and values else None
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items")
        inner = Any if items is None else _annotation(items)
        return None if inner is None else list[inner]  # type: ignore[valid-type]
    if kind == "object":
        extra = prop.get("additionalProperties", True)
        inner = Any if extra is True or extra == {} else _annotation(extra)
        return None if inner is None else dict[str, inner]  # type: ignore[valid-type]
    return _JSON_TYPES.get(kind) if isinstance(kind, str) and not prop.keys() - {"type", "description", "title", "default"} else None


TAKES = "tools= takes a list of functions or tool(...)s, e.g. tools=[weather]"


def _what(value: Any) -> str:
    if value is None or isinstance(value, (str, bytes)):
        return f"{value!r}"[:60]
    if isinstance(value, type):
        return f"the class {value.__name__}"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _listed(tools: Any) -> Iterable[Any]:
    """`tools=` as given: a list (any iterable) of tools; one tool or function alone is taken as a list
    of one. A string, a mapping or anything else not a list of tools is a TypeError saying what it takes."""
    if isinstance(tools, Tool) or (callable(tools) and not isinstance(tools, type)):
        return [tools]
    if isinstance(tools, (str, bytes, Mapping)):
        got = f"the string {_what(tools)}" if isinstance(tools, (str, bytes)) else \
            "a dict (its values as a list: tools=list(d.values()))"
        raise TypeError(f"{TAKES}; got {got}")
    try:
        return list(tools)
    except TypeError:
        raise TypeError(f"{TAKES}; got {_what(tools)}") from None


class Registry:
    """Tools by exact name: no aliases, no fuzzy matching."""

    def __init__(self, tools: Iterable[Tool] | Tool | Callable[..., Any] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: list[dict[str, Any]] | None = None  # built once per set of tools
        for i, t in enumerate(_listed(tools)):
            self.add(t, i)

    def add(self, t: Tool, index: int | None = None) -> None:
        if not isinstance(t, Tool):
            if not callable(t) or isinstance(t, type):
                where = f"tools[{index}]" if index is not None else "a tool"
                raise TypeError(f"{where} is {_what(t)}, not a tool: {TAKES}")
            t = tool(t)
        if t.name in self._tools:
            raise ValueError(f"tool {t.name!r} is registered twice")
        self._tools[t.name] = t
        self._schemas = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI `tools[]` entries (a new list each call; the entries are built once)."""
        if self._schemas is None:
            self._schemas = [t.schema() for t in self._tools.values()]
        return list(self._schemas)
