"""The MCP rules that need no server: kinds from annotations, server specs, CLI flags, the full schema
check behind schema-declared tools (and so behind replay's rebuilt tools)."""

from __future__ import annotations

import argparse

import pytest

from loopfence.mcp import McpServer, classify, tools_from_flags
from loopfence.mcp._flags import add_flags, tools_from_args
from loopfence.tools import Tool
from loopfence.tools._fullschema import needs_full
from loopfence.tools._jsonschema import validate_schema
from loopfence.tools._registry import ArgumentError

pytest.importorskip("jsonschema")

RO, DESTRUCTIVE = {"readOnlyHint": True}, {"readOnlyHint": False, "destructiveHint": True}


@pytest.mark.parametrize("hints, trusted, expected", [
    # untrusted: the spec's worst case, whatever the server claims
    ({}, False, ("side_effect", True, True)),
    ({"readOnlyHint": True, "openWorldHint": False, "destructiveHint": False}, False, ("side_effect", True, True)),
    # trusted
    ({}, True, ("side_effect", True, True)),  # no hints: the defaults (destructive, open world)
    ({"readOnlyHint": True}, True, ("read_only", False, True)),
    ({"readOnlyHint": True, "openWorldHint": False}, True, ("read_only", False, False)),
    ({"readOnlyHint": False, "destructiveHint": True}, True, ("side_effect", True, True)),
    ({"readOnlyHint": False, "destructiveHint": False}, True, ("side_effect", False, True)),
    ({"destructiveHint": False, "openWorldHint": False}, True, ("side_effect", False, False)),
])
def test_kinds_from_annotations(hints: dict[str, bool], trusted: bool, expected: tuple[str, bool, bool]) -> None:
    c = classify(hints, trusted)
    assert (str(c.kind), c.privileged, c.untrusted) == expected
    assert c.annotations == hints
    assert ("annotations trusted" if trusted else "not trusted") in c.why


def test_an_override_wins_and_says_so() -> None:
    from loopfence.mcp._kinds import parse_override

    c = classify(RO, True, parse_override("t", {"kind": "side_effect", "privileged": True}))
    assert (str(c.kind), c.privileged) == ("side_effect", True)
    assert c.why.endswith("overridden by kinds=: kind=side_effect, privileged=True")
    with pytest.raises(ValueError, match="kind must be one of"):
        parse_override("t", "readonly")
    with pytest.raises(ValueError, match="unknown field"):
        parse_override("t", {"trusted": True})


def test_server_specs_parse_and_never_describe_secrets() -> None:
    s = McpServer.parse("fs=npx -y @modelcontextprotocol/server-filesystem '/my files'")
    assert (s.name, s.command, s.transport) == ("fs", ("npx", "-y", "@modelcontextprotocol/server-filesystem",
                                                        "/my files"), "stdio")
    h = McpServer.parse("docs=https://user:pw@example.org:8443/mcp?key=abc", headers={"Authorization": "Bearer x"})
    assert (h.name, h.transport) == ("docs", "streamable_http")
    assert h.describe() == {"transport": "streamable_http", "url": "https://example.org:8443/mcp",
                            "headers": ["Authorization"]}
    assert "pw" not in h.label() and "abc" not in h.label()
    assert McpServer.parse("https://example.org/mcp?a=b").name is None  # no NAME= prefix there
    with pytest.raises(ValueError, match="exactly one"):
        McpServer()
    with pytest.raises(ValueError, match="url must be"):
        McpServer(url="ftp://example.org")


def test_flags_make_an_unopened_group() -> None:
    p = argparse.ArgumentParser()
    add_flags(p)
    args = p.parse_args(["--mcp", "notes=python srv.py --quiet", "--mcp-url", "https://example.org/mcp",
                         "--mcp-header", "Authorization: Bearer t0k", "--mcp-trust", "notes",
                         "--mcp-kind", "search=read_only"])
    group = tools_from_args(args, reserved=["read_file"])
    assert group is not None
    stdio, http = group.specs
    assert stdio.command == ("python", "srv.py", "--quiet") and stdio.name == "notes"
    assert http.headers == {"Authorization": "Bearer t0k"}
    assert group.trust_names == {"notes"} and not group.trust_all
    assert str(group.overrides["search"].kind) == "read_only"
    assert group.reserved == {"read_file"}
    assert tools_from_flags() is None
    assert tools_from_flags(mcp=["python srv.py"], trust=["all"]).trust_all  # type: ignore[union-attr]


@pytest.mark.parametrize("flags, message", [
    ({"mcp": ["https://example.org/mcp"]}, "use --mcp-url"),
    ({"mcp_url": ["python srv.py"]}, "expected http"),
    ({"mcp": ["srv"], "headers": ["no colon"]}, "NAME: VALUE"),
    ({"mcp": ["srv"], "kinds": ["search"]}, "TOOL=KIND"),
    ({"mcp": ["srv"], "kinds": ["search=fast"]}, "kind must be one of"),
    ({"trust": ["notes"]}, "need an --mcp"),
])
def test_bad_flags_are_one_line_errors(flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tools_from_flags(**flags)


# -- the full schema check behind every schema-declared tool -----------------------------------------
SCHEMA = {"type": "object", "properties": {
    "path": {"type": "string", "pattern": r"^[a-z]+\.md$"},
    "mode": {"anyOf": [{"const": "fast"}, {"const": "full"}], "default": "fast"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}}, "required": ["path"]}


def test_keywords_beyond_the_subset_are_checked_in_full() -> None:
    t = Tool.from_schema("read", lambda **a: a, SCHEMA)
    assert t.validate({"path": "a.md"}) == {"path": "a.md", "mode": "fast"}  # default bound into the key
    for bad, where in [({"path": "../x"}, "path"), ({"path": "a.md", "mode": "slow"}, "mode"),
                       ({"path": "a.md", "tags": []}, "tags")]:
        with pytest.raises(ArgumentError, match=rf"arguments\.{where}"):
            t.validate(bad)
    with pytest.raises(ArgumentError, match="missing required argument 'path'"):  # the subset's own words
        t.validate({})


def test_the_draft_the_schema_declares_is_the_one_applied() -> None:
    """`dependencies` is draft-07's keyword (2019-09 split it up): declared draft-07 it binds, under
    the 2020-12 default it is an unknown keyword and checks nothing."""
    body = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependencies": {"a": ["b"]}}
    draft7 = Tool.from_schema("d7", lambda **a: a, {"$schema": "http://json-schema.org/draft-07/schema#", **body})
    default = Tool.from_schema("d2020", lambda **a: a, body)
    with pytest.raises(ArgumentError, match="'b' is a dependency of 'a'"):
        draft7.validate({"a": 1})
    assert default.validate({"a": 1}) == {"a": 1}


def test_subset_schemas_stay_on_the_subset() -> None:
    simple = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "title": "N"}}}
    assert not needs_full(simple)
    assert needs_full(SCHEMA) and needs_full({"items": [{"type": "string"}]}) and needs_full({"$ref": "#/x"})
    assert validate_schema({"n": 1}, simple) is None


def test_a_broken_schema_fits_nothing() -> None:
    problem = validate_schema({"a": 1}, {"type": "object", "properties": {"a": {"minItems": "one"}}})
    assert problem is not None and "not valid JSON Schema" in problem
