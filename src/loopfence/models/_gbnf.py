"""A reply grammar built from the registry's JSON schemas, written out as llama.cpp GBNF.

Why a grammar: SmolLM2-135M left to itself writes calls with invented shapes. Decoded under
`reply_grammar(tools)`, every reply is one JSON object: an object whose first key is "name" is a
call, `{"name": TOOL, "arguments": {...}}`, with TOOL one of the registered names and arguments
shaped by that tool's schema; any other object is an answer, `{"answer": TEXT}` being the form the
prompt asks for. The model cannot emit a malformed call, and it can always answer.

Why any other object answers, not only `{"answer": ...}`: measured on the sample task, after the
page came back the model gave `{"answer` a probability of 3e-4 (it copies its last turn,
`{"name": ...`), and a third of its mass to `{"title`: a note in JSON, which is what it writes
from the page it was given (its title, author, first sentence). Forcing `{"answer"` there only
made it call the same tool again, which the fence then stops.

Why a small tree rather than GBNF text: the same tree writes the GBNF (`to_gbnf`) and draws
strings from the language it admits (`sample`), so tests can check, without a model, that
whatever the grammar lets through the decoder reads. The JSON is written in one layout (the
separators of `json.dumps`, no free whitespace): the model cannot stall in endless blanks, and
earlier calls rendered back into the prompt look exactly like what it is allowed to write.

The schema subset: type (string, integer, number, boolean, null, object with properties, array
with items, lists of types), enum, const, anyOf/oneOf, required. Optional properties may be left
out, but those present keep the schema's order. Anything else (`$ref`, `allOf`, patterns, bounds,
`additionalProperties` schemas) is an open JSON value there, as an answer is (see KEY_MAX and
TEXT_MAX for their bounds): the contract still validates every call against the real schema.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["Node", "Lit", "Chars", "Ref", "Seq", "Alt", "Repeat", "Grammar", "reply_grammar",
           "schema_node", "ANSWER_KEY", "NAME_KEY", "ARGUMENTS_KEY"]

NAME_KEY, ARGUMENTS_KEY, ANSWER_KEY = "name", "arguments", "answer"


@dataclass(frozen=True, slots=True)
class Lit:
    """A literal string."""
    text: str


@dataclass(frozen=True, slots=True)
class Chars:
    """One character of a GBNF class; `examples` are members `sample` draws from."""
    gbnf: str
    examples: str


@dataclass(frozen=True, slots=True)
class Ref:
    """A named rule."""
    name: str


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    item: Node
    min: int = 0
    max: int | None = None  # None: unbounded


Node = Lit | Chars | Ref | Seq | Alt | Repeat

# JSON strings without \u escapes: a lone surrogate (\ud800) is valid JSON but no valid text, and
# would break whatever writes it out later. Other characters come as themselves.
_CHAR = Alt((Chars(r'[^"\\\x00-\x1F]', "abc xyz.-/#é"), Seq((Lit("\\"), Chars(r'["\\/bfnrt]', '"\\/bfnrt')))))
_DIGIT = Chars("[0-9]", "0123456789")
# Keys of objects the grammar leaves open are words: a key that may hold any text is where the
# tiny model writes its whole note ('{"]: tl is a small ...'), and a bounded one cannot run on.
KEY_MAX = 40
_KEY_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_KEY_REST = _KEY_FIRST + "0123456789.-"
# Open values (an answer's, or a schema part the grammar cannot express) are bounded too: the tiny
# model's long notes are loops ("A ledger is a simple file ... A ledger is a simple file ..."),
# and a bound closes the string or the object where max_tokens would cut the reply off unread.
TEXT_MAX, MEMBERS_MAX = 400, 8


def _char_class(chars: str) -> str:
    """`[...]` for a set of ASCII characters: runs as ranges, anything but a letter or digit as `\\xHH`."""
    def one(code: int) -> str:
        return chr(code) if chr(code).isalnum() else f"\\x{code:02X}"

    codes = sorted({ord(c) for c in chars})
    out, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        out.append(one(codes[i]) if i == j else f"{one(codes[i])}-{one(codes[j])}")
        i = j + 1
    return "[" + "".join(out) + "]"


def _word(chars: str, without: str = "") -> Chars:
    kept = "".join(c for c in chars if c not in without)
    return Chars(_char_class(kept), kept)


_BASE_RULES: dict[str, Node] = {
    "string": Seq((Lit('"'), Repeat(Ref("char")), Lit('"'))),
    "char": _CHAR,
    "integer": Seq((Repeat(Lit("-"), 0, 1), Alt((Lit("0"), Seq((Chars("[1-9]", "123456789"),
                                                                  Repeat(_DIGIT, 0, 15))))))),
    "number": Seq((Ref("integer"), Repeat(Seq((Lit("."), Repeat(_DIGIT, 1, 15))), 0, 1))),
    "boolean": Alt((Lit("true"), Lit("false"))),
    # the first option of each recursive rule is a leaf: `sample` takes it when deep enough
    "value": Alt((Lit("null"), Ref("boolean"), Ref("number"), Ref("text"), Ref("array"), Ref("object"))),
    "text": Seq((Lit('"'), Repeat(Ref("char"), 0, TEXT_MAX), Lit('"'))),
    "array": Seq((Lit("["), Repeat(Seq((Ref("value"), Repeat(Seq((Lit(", "), Ref("value"))), 0, MEMBERS_MAX - 1))),
                                   0, 1), Lit("]"))),
    "object": Seq((Lit("{"), Repeat(Seq((Ref("member"), Repeat(Seq((Lit(", "), Ref("member"))), 0, MEMBERS_MAX - 1))),
                                    0, 1), Lit("}"))),
    "member": Seq((Ref("key"), Lit(": "), Ref("value"))),
    "key": Seq((Lit('"'), _word(_KEY_FIRST), Repeat(_word(_KEY_REST), 0, KEY_MAX - 1), Lit('"'))),
}


def _not_key(word: str) -> Node:
    """A key other than `word`: a proper prefix of it, a key that leaves it at some character, or
    one that goes on past it (keys are words, at most KEY_MAX characters)."""
    options: list[Node] = [Lit(json.dumps(word[:i])) for i in range(1, len(word))]
    for i, ch in enumerate(word):
        first = _word(_KEY_FIRST if i == 0 else _KEY_REST, without=ch)
        rest = Repeat(_word(_KEY_REST), 0, KEY_MAX - i - 1)
        options.append(Seq((Lit('"' + word[:i]), first, rest, Lit('"'))))
    options.append(Seq((Lit('"' + word), Repeat(_word(_KEY_REST), 1, KEY_MAX - len(word)), Lit('"'))))
    return Alt(tuple(options))


@dataclass(frozen=True, slots=True)
class Grammar:
    """Rules by name; `root` is where a reply starts."""
    rules: dict[str, Node]

    def to_gbnf(self) -> str:
        """The GBNF text llama.cpp reads (`llama_cpp.LlamaGrammar.from_string`)."""
        return "\n".join(f"{name} ::= {_gbnf(node, top=True)}" for name, node in self.rules.items()) + "\n"

    def sample(self, rng: random.Random, max_depth: int = 6) -> str:
        """One string of the language, drawn at random (for tests: the decoder must read all of them)."""
        out: list[str] = []
        self._sample(Ref("root"), rng, max_depth, out)
        return "".join(out)

    def _sample(self, node: Node, rng: random.Random, depth: int, out: list[str]) -> None:
        if isinstance(node, Lit):
            out.append(node.text)
        elif isinstance(node, Chars):
            out.append(rng.choice(node.examples))
        elif isinstance(node, Ref):
            self._sample(self.rules[node.name], rng, depth - 1, out)
        elif isinstance(node, Seq):
            for item in node.items:
                self._sample(item, rng, depth, out)
        elif isinstance(node, Alt):
            self._sample(node.options[0] if depth <= 0 else rng.choice(node.options), rng, depth, out)
        else:
            most = node.min + 3 if node.max is None else min(node.max, node.min + 3)
            for _ in range(node.min if depth <= 0 else rng.randint(node.min, most)):
                self._sample(node.item, rng, depth, out)


def _gbnf(node: Node, top: bool = False) -> str:
    if isinstance(node, Lit):
        return json.dumps(node.text, ensure_ascii=False)  # GBNF literals take JSON's escapes
    if isinstance(node, Chars):
        return node.gbnf
    if isinstance(node, Ref):
        return node.name
    if isinstance(node, Seq):  # an empty Seq only ever appears inside another one
        return " ".join(_gbnf(i) for i in node.items if i != Seq(()))
    if isinstance(node, Alt):
        body = " | ".join(_gbnf(o, top=True) for o in node.options)
        return body if top else f"({body})"
    inner = f"({_gbnf(node.item, top=True)})"
    if (node.min, node.max) == (0, 1):
        return inner + "?"
    if node.max is None:
        return inner + ("*" if node.min == 0 else "+" if node.min == 1 else f"{{{node.min},}}")
    return inner + f"{{{node.min},{node.max}}}"


def _literal(value: Any) -> Lit:
    return Lit(json.dumps(value, ensure_ascii=False))


def schema_node(schema: Any, depth: int = 0) -> Node:
    """The grammar for one JSON schema (the subset in the module docstring; the rest is `value`)."""
    if not isinstance(schema, dict) or depth > 16:
        return Ref("value")
    if "const" in schema:
        return _literal(schema["const"])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return Alt(tuple(_literal(v) for v in schema["enum"]))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return Alt(tuple(schema_node(s, depth + 1) for s in schema[key]))
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        return Alt(tuple(schema_node({**schema, "type": k}, depth + 1) for k in kind))
    if kind in ("string", "integer", "number", "boolean"):
        return Ref(str(kind))
    if kind == "null":
        return Lit("null")
    if kind == "array":
        item = schema_node(schema["items"], depth + 1) if isinstance(schema.get("items"), dict) else Ref("value")
        return Seq((Lit("["), Repeat(Seq((item, Repeat(Seq((Lit(", "), item))))), 0, 1), Lit("]")))
    if kind == "object" or "properties" in schema:
        return _object_node(schema, depth)
    return Ref("value")


def _object_node(schema: dict[str, Any], depth: int) -> Node:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return Lit("{}") if schema.get("additionalProperties") is False else Ref("object")
    required = set(schema.get("required") or ())
    members = [(name, name in required, schema_node(sub, depth + 1)) for name, sub in props.items()]
    return Seq((Lit("{"), _members(members, first=True), Lit("}")))


def _members(members: list[tuple[str, bool, Node]], first: bool) -> Node:
    """Members in schema order; optional ones may be missing, and only present ones get a comma."""
    if not members:
        return Seq(())
    (name, required, value), rest = members[0], members[1:]
    key = Lit(("" if first else ", ") + json.dumps(name, ensure_ascii=False) + ": ")
    present = Seq((key, value, _members(rest, first=False)))
    if required:
        return present
    if not first:
        return Seq((Repeat(Seq((key, value)), 0, 1), _members(rest, first=False)))
    absent = _members(rest, first=True)
    return Repeat(present, 0, 1) if absent == Seq(()) else Alt((present, absent))


def reply_grammar(tools: list[dict[str, Any]], *, answer: bool = True) -> Grammar:
    """`root`: one call of one of `tools` (chat.completions tool schemas) or, when `answer`, an answer.

    `{"name": "read_file", "arguments": {"path": "a.txt"}}`, or `{"answer": "free text"}` or any
    other non-empty object whose first key is not "name".
    """
    rules: dict[str, Node] = {}
    options: list[Node] = []
    calls: list[Node] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        rules[f"args-{i}"] = schema_node(fn.get("parameters") or {"type": "object"})
        calls.append(Seq((_literal(fn["name"]), Lit(f', "{ARGUMENTS_KEY}": '), Ref(f"args-{i}"))))
    if calls:
        rules["call"] = Seq((Lit(f'{{"{NAME_KEY}": '), Alt(tuple(calls)), Lit("}")))
        options.append(Ref("call"))
    if answer or not calls:
        rules["answer"] = Seq((Lit("{"), Ref("answer-key"), Lit(": "), Ref("value"),
                               Repeat(Seq((Lit(", "), Ref("member"))), 0, MEMBERS_MAX - 1), Lit("}")))
        rules["answer-key"] = _not_key(NAME_KEY)
        options.append(Ref("answer"))
    rules = {"root": Alt(tuple(options)), **rules}
    _add_used(rules)
    return Grammar(rules)


def _add_used(rules: dict[str, Node]) -> None:
    """Add the base rules the grammar refers to (GBNF rejects a reference to an undefined rule)."""
    todo = list(rules.values())
    while todo:
        node = todo.pop()
        if isinstance(node, Ref) and node.name not in rules:
            rules[node.name] = _BASE_RULES[node.name]
            todo.append(rules[node.name])
        elif isinstance(node, Seq):
            todo.extend(node.items)
        elif isinstance(node, Alt):
            todo.extend(node.options)
        elif isinstance(node, Repeat):
            todo.append(node.item)
