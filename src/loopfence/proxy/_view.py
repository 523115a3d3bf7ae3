"""What the proxy reads of a conversation whatever the client did to its history, and the actions of
agents that act in text.

Agents re-render their history: smolagents writes the calls it got back as assistant text
("Calling tools:\\n[{'id': 'c0', 'type': 'function', 'function': {...}}]") and their results as user
messages ("Call id: c0\\nObservation:\\n..."), content as a list of parts. `view(messages)` reduces each
message to its role, its text (parts flattened, whitespace collapsed) and its calls (from
`tool_calls`, or read from recognised call text), consecutive messages of one role taken as one; a
request continues a run when its view extends the view of that run's latest request (`digests`),
with its system messages or, failing that, without them.

Agents that act in text (a bash block, a code block, `<code>`) send no tools: `action_of(text)` is
the action a reply asks for, which the proxy fences as a call (docs/proxy.md, "Text actions").
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections import OrderedDict
from typing import Any, NamedTuple

from .._json import canonical_json, loads  # bounded: deep nesting is a ValueError, never a RecursionError

__all__ = ["flat", "calls_in_text", "read", "view", "digests", "marks", "task_marks", "answer_digest", "action_of", "program_of", "call_ids_in", "TEXT_ACTION",
           "TEXT_POLL", "TEXT_TOOLS", "TEXT_ACTION_SCHEMA"]

MARKED = 8  # the assistant messages of a request, from its last, that `marks` reads
TEXT_ACTION = "text_action"  # the tool a run's text actions are calls of (in its log and report)
TEXT_POLL = "text_poll"  # the same, kind poll: an action whose program --kinds declares a poll
TEXT_TOOLS = frozenset({TEXT_ACTION, TEXT_POLL})
TEXT_ACTION_SCHEMA = {"type": "object", "properties": {
    "action": {"type": "string", "description": "what the reply asks the harness to run"},
    "after": {"type": "string", "description": "the fingerprint of the output the reply followed"}},
    "required": ["action"]}
_CALL_TEXT = re.compile(r"(?:^|\n)\s*Calling tools:\s*\n(\[.*\])\s*$", re.S)
_FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
_OPEN_FENCE = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[^\n]*\n(.*)\Z", re.S | re.M)  # cut by a stop sequence
_CODE_TAG = re.compile(r"<code>(.*?)(?:</code>|\Z)", re.S)  # "</code>" is CodeAgent's stop sequence
_CALL_ID = re.compile(r"\bCall id:\s*(\S+)")
_SPACE = re.compile(r"\s+")


def flat(content: Any) -> str:
    """A message's text: a string as it is, a list of parts joined (their text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _args(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            return canonical_json(loads(raw)) if raw.strip() else "{}"
        except ValueError:
            return raw
    return canonical_json(raw if raw is not None else {})


def calls_in_text(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """Call text a re-rendering agent wrote ("Calling tools:\\n[...]", a Python or JSON list of
    OpenAI tool calls): (the text before it, [(id, name, canonical arguments)]); no calls when none
    is recognised."""
    m = _CALL_TEXT.search(text)
    if m is None:
        return text, []
    try:
        listed = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        try:
            listed = loads(m.group(1))
        except ValueError:
            return text, []
    calls = []
    for c in listed if isinstance(listed, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return text, []
        calls.append((str(c.get("id") or ""), fn["name"], _args(fn.get("arguments"))))
    return text[:m.start()], calls


def _role(m: dict[str, Any]) -> str:
    role = m.get("role")
    return "system" if role == "developer" else str(role)


Item = tuple[str, str, tuple[tuple[str, str], ...]]  # a message's view: (role, text, calls (name, arguments))
MEMO_CHARS = 64 << 20  # the message text the memo of read messages keeps, at most (the least recently read go first)


def _item(m: dict[str, Any]) -> Item:
    """One message's view (before consecutive messages of one role are joined)."""
    text = flat(m.get("content"))
    calls = [(c.get("function", {}).get("name") or "", _args(c.get("function", {}).get("arguments")))
             for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    if not calls and m.get("role") == "assistant":
        text, found = calls_in_text(text)
        calls = [(name, args) for _, name, args in found]
    return _role(m), _SPACE.sub(" ", text).strip(), tuple(calls)


class _Memo:
    """The messages already read, by what they hold: each one's view item, its digest and the digest
    of the message itself. A conversation's every request carries its whole history, so without this
    each request would read every message again; with it, a request reads only what is new. Bounded
    by the text it keeps (`MEMO_CHARS`), least recently read first out."""

    def __init__(self, budget: int = MEMO_CHARS) -> None:
        self.budget = budget
        self.chars = 0
        self.kept: OrderedDict[Any, tuple[Item, str, str, str, int]] = OrderedDict()

    def read(self, m: dict[str, Any]) -> tuple[Item, str, str, str]:
        """(the message's view item, the item's digest, its text's digest (a user message's; else
        ""), the message's own digest: all its fields)."""
        key = _key(m)
        found = self.kept.get(key) if key is not None else None
        if found is not None:
            self.kept.move_to_end(key)
            return found[:4]
        item = _item(m)
        made = (item, _digest(item), _digest(item[1]) if item[0] == "user" else "", _digest(m))
        if key is not None:
            size = len(key[2] or "") + sum(len(c[5] or "") for c in key[3] or ()) + 64
            self.kept[key] = (*made, size)
            self.chars += size
            while self.chars > self.budget and self.kept:
                self.chars -= self.kept.popitem(last=False)[1][4]
        return made


_PLAIN = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
_PLAIN_CALL = frozenset({"id", "type", "function"})
_PLAIN_FN = frozenset({"name", "arguments"})


def _key(m: dict[str, Any]) -> tuple[Any, ...] | None:
    """What a plain message holds, as a key equal only for messages whose JSON is the same (the
    fields present and their string values, its calls' likewise); None for any other message (it is
    read every time)."""
    if not _PLAIN.issuperset(m):
        return None
    calls = m.get("tool_calls")
    listed: tuple[Any, ...] | None = None
    if calls is not None:
        if not isinstance(calls, list):
            return None
        parts = []
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not _PLAIN_CALL.issuperset(c) or not _PLAIN_FN.issuperset(fn):
                return None
            part = (c.get("id"), c.get("type"), fn.get("name"), fn.get("arguments"))
            if not all(v is None or type(v) is str for v in part):
                return None
            parts.append((tuple(sorted(c)), tuple(sorted(fn)), *part))
        listed = tuple(parts)
    plain = (m.get("role"), m.get("content"), m.get("tool_call_id"), m.get("name"))
    if not all(v is None or type(v) is str for v in plain):
        return None
    return tuple(sorted(m)), plain[0], plain[1], listed, plain[2], plain[3]


_MEMO = _Memo()


class Read(NamedTuple):
    """A request's messages read (`read`)."""

    items: list[Item]  # its view (`view`)
    digests: list[str]  # each item's digest (`answer_digest`)
    texts: list[str]  # each user item's text's digest ("" for the other roles)
    sent: str  # the digest of its messages as sent, every field of each


def read(messages: list[dict[str, Any]]) -> Read:
    """The request's messages read: the new ones, those read before taken from the memo."""
    out = Read([], [], [], "")
    sent = hashlib.sha256()
    joined = False
    for m in messages:
        item, digest, text, own = _MEMO.read(m)
        sent.update(own.encode())
        if out.items and out.items[-1][0] == item[0]:
            r, t, c = out.items[-1]
            out.items[-1] = (r, f"{t} {item[1]}".strip(), c + item[2])
            out.digests[-1] = out.texts[-1] = ""  # a joined item: its digests are made below
            joined = True
        else:
            out.items.append(item)
            out.digests.append(digest)
            out.texts.append(text)
    for i, item in enumerate(out.items if joined else ()):
        if not out.digests[i]:
            out.digests[i], out.texts[i] = _digest(item), _digest(item[1]) if item[0] == "user" else ""
    return out._replace(sent=sent.hexdigest()[:32])


def view(messages: list[dict[str, Any]]) -> list[Item]:
    """Each message as (role, text, calls (name, arguments)), whitespace collapsed; consecutive
    messages of one role are one."""
    return read(messages).items


def digests(messages: list[dict[str, Any]], seen: Read | None = None) -> tuple[str, tuple[str, ...]]:
    """(the digests of the whole request's view, with and without its system messages, space-joined;
    the digests of its views cut just before each of its assistant messages, longest first, and of one
    length with the system messages first). A request extends the run whose latest request's digest
    is one of the cuts; the cuts without system messages serve an agent that asks for its last answer
    under another system prompt (smolagents at its max_steps). `seen`: `read(messages)`, if known.
    A view's digest chains its items' digests: one small hash per item."""
    seen = read(messages) if seen is None else seen
    whole, cuts = [], []
    pairs = list(zip(seen.items, seen.digests, strict=True))
    for bare, kept in enumerate((pairs, [p for p in pairs if p[0][0] != "system"])):
        d = ""
        for n, (item, digest) in enumerate(kept):
            if item[0] == "assistant" and d:
                cuts.append((-n, bare, d))
            d = hashlib.sha256(f"{d}\n{digest}".encode()).hexdigest()[:32]
        whole.append(d)
    return " ".join(whole), tuple(d for _, _, d in sorted(cuts))


def marks(seen: Read) -> tuple[str, frozenset[str], tuple[str, ...]]:
    """What an agent that rebuilds its history still keeps, from a request's messages read: the
    digest of its leading system messages, the digests of its user messages' texts, and the digests
    of its last MARKED assistant messages, newest first (the answers it was given; aider puts its own
    "Ok." after them)."""
    items = seen.items
    n = 0
    while n < len(items) and items[n][0] == "system":
        n += 1
    answers = []
    for i in range(len(items) - 1, -1, -1):
        if items[i][0] == "assistant":
            answers.append(seen.digests[i])
            if len(answers) == MARKED:
                break
    users = frozenset(d for item, d in zip(items, seen.texts, strict=True) if item[0] == "user")
    return _digest(items[:n]), users, tuple(answers)


def task_marks(messages: list[dict[str, Any]]) -> frozenset[str]:
    """The digests a run's task is known by: the text of the first request's last user message, and
    of its leading paragraphs (an agent may send the task again without what it appended: aider's
    reminder), as `marks` digests a user message's text."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    parts = flat(last.get("content")).split("\n\n") if last is not None else []
    texts = {_SPACE.sub(" ", "\n\n".join(parts[:n])).strip() for n in range(1, min(len(parts), 8) + 1)}
    return frozenset(_digest(t) for t in texts if t)


def answer_digest(item: tuple[str, str, tuple[tuple[str, str], ...]]) -> str:
    """The digest of one assistant message's view (an answer the proxy gave, as a request brings it back)."""
    return _digest(item)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def action_of(text: str | None) -> str | None:
    """The action a reply's text asks for: its fenced code blocks, else its `<code>` blocks (the last
    one may be open: the upstream stopped at a stop sequence), else a fence left open, else its
    recognised call text, else the whole text (whitespace collapsed); None for an empty reply."""
    text = text or ""
    blocks = [b.strip() for _, b in _FENCED.findall(text)] or [b.strip() for b in _CODE_TAG.findall(text)] \
        or [b.strip() for b in _OPEN_FENCE.findall(text)[:1]]
    if blocks:
        return "\n\n".join(blocks)
    _, calls = calls_in_text(text)
    if calls:
        return canonical_json([[name, loads(args) if _is_json(args) else args] for _, name, args in calls])
    whole = _SPACE.sub(" ", text).strip()
    return whole or None


def program_of(action: str) -> str:
    """The program an action runs: its first word, without a directory (`/usr/bin/curl -s` -> curl)."""
    first = action.split(None, 1)[0] if action.strip() else ""
    return first.rsplit("/", 1)[-1]


def _is_json(s: str) -> bool:
    try:
        loads(s)
    except ValueError:
        return False
    return True


def call_ids_in(text: str) -> list[str]:
    """The call ids a re-rendered result names ("Call id: c0")."""
    return _CALL_ID.findall(text)
