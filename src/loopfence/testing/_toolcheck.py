"""Adapter conformance for tools: `check_tool(tool, args)`, a short suite for a custom tool's tests.

    from loopfence.testing import check_tool

    def test_my_tool_conforms():
        check_tool(my_tool, {"path": "a.txt"}, bad_args={"path": 3}, failing_args={"path": "missing"})

`tool` is a loopfence Tool (or a plain function, made into one with `loopfence.tool`). Plain
asserts: the first check that fails raises AssertionError naming it ("check_tool[schema]: ...").
The checks, in this order:

  schema     `schema()` is an OpenAI `tools[]` entry: a function name of 1-64 letters, digits, `_`
             or `-`; a str description; parameters a JSON-schema object whose `required` names
             are among its `properties`; JSON all through; `args` fit it
  call       executed by loopfence's Executor with `args`, it returns an ok result whose content is
             what the function returned (for an `async def` tool: what it returned once awaited,
             never the text of a coroutine object)
  bad args   `bad_args` (default: derived from the schema, a required argument left out or an
             unexpected one added) and a non-object are refused with ArgumentError, the
             structured error the model is shown, never another exception
  failing    with `failing_args`, executing returns a failed result with a named error (a JSON
             object `{"ok": false, "error": ...}`), never an exception
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import warnings
from collections.abc import Callable
from typing import Any

from ._conformance import Conformance, _Fail

__all__ = ["check_tool"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSET: Any = object()


def check_tool(tool: Any, args: dict[str, Any] | None = None, *, bad_args: Any = _UNSET,
               failing_args: dict[str, Any] | None = None, timeout_s: float = 10.0) -> Conformance:
    """Check a tool (see the module docstring). Returns what was checked; raises AssertionError
    naming the first check that fails."""
    from ..tools import ArgumentError, Tool
    from ..tools import tool as make_tool

    fail = _Fail("check_tool")
    t = tool if isinstance(tool, Tool) else make_tool(tool)
    report = Conformance(f"check_tool({t.name})")
    schema = _schema(t, fail)
    if args is None:
        if schema.get("required"):
            raise fail("schema", f"the tool requires {schema['required']}: pass args that fit its schema")
        args = {}
    try:
        bound = t.validate(args)
    except ArgumentError as exc:
        raise fail("schema", f"args {args!r} do not fit the tool's own schema: {exc}") from None
    report.passed.append("schema")

    result = _execute(t, bound, timeout_s, fail, "call")
    if not result.ok:
        raise fail("call", f"valid args gave a failed result: {result.content[:300]}")
    if "<coroutine object" in result.content:
        raise fail("call", "the result is the text of a coroutine object: the async tool was not awaited")
    report.passed.append("call (awaited)" if inspect.iscoroutinefunction(t.fn) else "call")

    for bad in _bad_cases(schema, bad_args):
        try:
            t.validate(bad)
        except ArgumentError as exc:
            if not str(exc):
                raise fail("bad args", f"ArgumentError for {bad!r} does not say what is wrong") from None
            continue
        except Exception as exc:  # noqa: BLE001 - the finding
            raise fail("bad args", f"{bad!r} raised {type(exc).__name__}: {exc}, not ArgumentError") from None
        raise fail("bad args", f"{bad!r} was accepted; bad arguments must raise ArgumentError")
    report.passed.append("bad args")

    if failing_args is None:
        report.skipped["failing"] = "no failing_args given"
        return report
    try:
        bound = t.validate(failing_args)
    except ArgumentError as exc:
        raise fail("failing", f"failing_args must fit the schema (the failure is the tool's): {exc}") from None
    result = _execute(t, bound, timeout_s, fail, "failing")
    if result.ok or not result.error:
        raise fail("failing", f"failing_args gave {'an ok' if result.ok else 'an unnamed'} result: "
                   f"{result.content[:300]}")
    try:
        body = json.loads(result.content)
    except ValueError:
        body = None
    if not (isinstance(body, dict) and body.get("ok") is False and body.get("error")):
        raise fail("failing", f"the failed result is not a JSON object with ok false and an error: "
                   f"{result.content[:300]}")
    report.passed.append("failing")
    return report


def _schema(t: Any, fail: _Fail) -> dict[str, Any]:
    entry = t.schema()
    try:
        json.dumps(entry, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise fail("schema", f"schema() is not JSON: {exc}") from None
    fn = entry.get("function") if isinstance(entry, dict) and entry.get("type") == "function" else None
    if not isinstance(fn, dict):
        raise fail("schema", 'schema() must be {"type": "function", "function": {...}}')
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise fail("schema", f"name {name!r}: 1-64 letters, digits, _ or -")
    if not isinstance(fn.get("description", ""), str):
        raise fail("schema", "description must be a str")
    params = fn.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        raise fail("schema", f'parameters must be a JSON schema with "type": "object", got {params!r}')
    props = params.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
        raise fail("schema", "properties must map each argument name to a schema object")
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) and r in props for r in required):
        raise fail("schema", f"required {required!r} must name properties ({sorted(props)})")
    return params


def _bad_cases(schema: dict[str, Any], bad_args: Any) -> list[Any]:
    cases: list[Any] = [["not", "an", "object"]]
    if bad_args is not _UNSET:
        return [*cases, bad_args]
    if schema.get("required"):
        cases.append({})  # a required argument left out
    if schema.get("additionalProperties") is False:
        cases.append({"__loopfence_unexpected__": 1})
    return cases


def _execute(t: Any, args: dict[str, Any], timeout_s: float, fail: _Fail, check: str) -> Any:
    """The ToolResult loopfence's Executor makes of one call (its async form when it has one)."""
    from ..tools import Executor, ToolResult

    executor = Executor()
    run: Callable[[], Any]
    aexecute = getattr(executor, "aexecute", None)
    if aexecute is not None:
        def run() -> Any:
            return asyncio.run(aexecute(t, args, timeout_s))
    else:
        def run() -> Any:
            return executor.execute(t, args, timeout_s)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            result = run()
        except Exception as exc:  # noqa: BLE001 - the finding
            raise fail(check, f"executing raised {type(exc).__name__}: {exc}; a tool's failure is a result") from None
    never = [w for w in seen if "was never awaited" in str(w.message)]
    if never:
        raise fail(check, f"a coroutine was never awaited: {never[0].message}")
    if not isinstance(result, ToolResult):
        raise fail(check, f"the executor returned {type(result).__name__}, not a ToolResult")
    return result
