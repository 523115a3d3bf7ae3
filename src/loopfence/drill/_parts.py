"""Parsers for the nested parts of a scenario: replies, canned tools, expectations."""

from __future__ import annotations

import importlib
from typing import Any

from .._messages import Reply, ReplyFormatError
from .._stops import StopReason, Verdict
from ..tools._registry import ToolKind
from ._fields import Fields, json_type
from ._scenario import CannedTool, Expect, ExpectedCall, ScenarioError, reply_form

__all__ = ["parse_replies", "parse_canned", "parse_expect"]

_KINDS = tuple(str(k) for k in ToolKind)


def parse_replies(f: Fields) -> tuple[dict[str, Any], ...]:
    items = f.array("replies", required=True, nonempty=True) or []
    out = []
    for i, item in enumerate(items):
        r = Fields.of(f.file, f"replies[{i}]", item)
        form = reply_form(item)
        if form == "response" and item.get("choices") == []:
            pass  # served as it is: a response with no choices, which ends the run endpoint_error
        elif form == "response":
            try:
                Reply.from_response(item)
            except ReplyFormatError as exc:
                r.fail(None, f"not a chat.completions response ({exc}); other forms: "
                       "{\"chunks\": [...], \"done\": bool}, {\"sse\": \"...\"}, {\"status\": N, ...}, "
                       "{\"fault\": NAME, ...}")
        elif form == "fault":
            _fault(r)
        elif form == "chunks":
            r.only(("chunks", "done"))
            for j, chunk in enumerate(r.array("chunks", required=True) or []):
                if not isinstance(chunk, (dict, str)):
                    r.fail("chunks", f"[{j}] must be a chunk object or a raw string, got {json_type(chunk)}")
            r.boolean("done", True)
        elif form == "sse":
            r.only(("sse",))
            r.string("sse", required=True)
        else:
            r.only(("status", "body", "headers"))
            status = r.count("status")
            if status is None or not 100 <= status <= 599:
                r.fail("status", f"must be an HTTP status code 100..599, got {item['status']!r}")
            r.string_map("headers")
        out.append(item)
    return tuple(out)


def _fault(r: Fields) -> None:
    """A fault form of the fake server (issue 5); checked by the server's own validator when installed."""
    r.string("fault", required=True)
    try:
        validate = importlib.import_module("loopfence.testing._replyforms").validate_form
    except (ImportError, AttributeError):
        return  # without the server the scenario fails at run time: "needs the HTTP endpoint"
    try:
        validate(r.data)
    except ValueError as exc:
        r.fail(None, str(exc))


def parse_canned(f: Fields, name: str) -> CannedTool:
    f.only(("results", "kind", "parameters", "untrusted", "description", "result_schema"))
    results = f.array("results", required=True, nonempty=True) or []
    kind = f.string("kind", "side_effect")
    if kind not in _KINDS:
        f.fail("kind", f"must be one of {', '.join(_KINDS)}, got {kind!r}")
    params = f.obj("parameters")
    if params is not None and params.data.get("type", "object") != "object":
        params.fail("type", f"tool parameters must be an object schema, got {params.data['type']!r}")
    schema = f.obj("result_schema")
    return CannedTool(name, tuple(results), ToolKind(kind), params.data if params else None,
                      f.boolean("untrusted", False), f.string("description", "") or "",
                      schema.data if schema else None)


_COUNTS = ("model_requests", "tool_calls", "tool_executions", "reused", "refused", "rejected",
           "max_tool_executions", "max_model_requests")
EXPECT_KEYS = ("stop", "verdict", *_COUNTS, "max_elapsed_s", "calls", "files_exist", "log_contains")


def parse_expect(f: Fields, enabled: set[str] | None) -> Expect:
    """`enabled`: the tool names an expected call may name (None: any, e.g. with MCP servers, whose
    tools are known only once they start)."""
    f.only(EXPECT_KEYS)
    stop = f.string("stop")
    if stop is not None and stop not in {str(s) for s in StopReason}:
        f.fail("stop", f"unknown stop reason {stop!r} (known: {', '.join(str(s) for s in StopReason)})")
    verdict = f.string("verdict")
    if verdict is not None and verdict not in ("SHIP", "KILL"):
        f.fail("verdict", f"must be SHIP or KILL, got {verdict!r}")
    calls = None
    if "calls" in f.data:
        calls = tuple(_expected_call(f, i, item, enabled) for i, item in enumerate(f.array("calls") or []))
    counts = {k: f.count(k) for k in _COUNTS}
    return Expect(StopReason(stop) if stop else None, Verdict(verdict) if verdict else None,
                  **counts, max_elapsed_s=f.number("max_elapsed_s"), calls=calls,
                  files_exist=tuple(f.strings("files_exist")), log_contains=tuple(f.strings("log_contains")))


def _expected_call(f: Fields, i: int, item: Any, enabled: set[str] | None) -> ExpectedCall:
    c = Fields.of(f.file, f.path("calls") + f"[{i}]", item)
    c.only(("name", "arguments", "ok"))
    name = c.string("name", required=True) or ""
    if enabled is not None and name not in enabled:
        c.fail("name", f"{name!r} is not a tool this scenario enables ({', '.join(sorted(enabled)) or 'none'})")
    args = c.obj("arguments")
    ok = c.data.get("ok")
    if ok is not None and not isinstance(ok, bool):
        raise ScenarioError(f.file, c.path("ok"), f"must be true or false, got {json_type(ok)}")
    return ExpectedCall(name, dict(args.data) if args else {}, ok)
