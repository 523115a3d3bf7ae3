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
import bisect
import hashlib
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from .._json import canonical_json, loads  # bounded: deep nesting is a ValueError, never a RecursionError

__all__ = ["flat", "calls_in_text", "item_of", "read", "read_kept", "reading", "known_before", "Read", "view", "digests", "marks", "task_marks", "answer_digest", "action_of", "program_of", "call_ids_in", "TEXT_ACTION",
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
MEMO_BYTES = 32 << 20  # the memo of read messages: what it keeps, at most (about), the least recently read out
ENTRY = 640  # what one message read takes besides its strings (tuples, digests), about


def item_of(m: dict[str, Any]) -> Item:
    """One message's view (before consecutive messages of one role are joined)."""
    text = flat(m.get("content"))
    calls = [(c.get("function", {}).get("name") or "", _args(c.get("function", {}).get("arguments")))
             for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    if not calls and m.get("role") == "assistant":
        text, found = calls_in_text(text)
        calls = [(name, args) for _, name, args in found]
    return _role(m), _SPACE.sub(" ", text).strip(), tuple(calls)


class Seen(NamedTuple):
    """One message read: its view item (before a run of one role is joined), the item's digest, its
    text's digest (a user message's; else ""), the message's canonical JSON (every field) and what
    keeping all this takes (bytes, about)."""

    item: Item
    digest: str
    text: str
    canon: str
    size: int


class _Memo:
    """The messages already read, by what they hold (`Seen`). A conversation's every request carries
    its whole history, so without this each request would read every message again; with it, a
    request reads only what is new. Bounded by what it keeps (`MEMO_BYTES`, the sizes of its strings
    and ENTRY a message), least recently read first out."""

    def __init__(self, budget: int = MEMO_BYTES) -> None:
        self.budget = budget
        self.chars = 0
        self.kept: OrderedDict[Any, Seen] = OrderedDict()

    def read(self, m: dict[str, Any], key: Any) -> Seen:
        """`m` read, or as read before (`key`: `_key(m)`; None: read every time)."""
        found = self.kept.get(key) if key is not None else None
        if found is not None:
            self.kept.move_to_end(key)
            return found
        seen = _seen(m)
        if key is not None:
            self.kept[key] = seen._replace(size=seen.size + sum(sys.getsizeof(v) for v in _leaves(key)))
            self.chars += self.kept[key].size
            while self.chars > self.budget and self.kept:
                self.chars -= self.kept.popitem(last=False)[1].size
        return seen


def _seen(m: Any) -> Seen:
    item = item_of(m)
    canon = canonical_json(m)
    size = sys.getsizeof(canon) + sys.getsizeof(item[1]) + sum(sys.getsizeof(a) for _, a in item[2]) + ENTRY
    return Seen(item, _digest(item), _digest(item[1]) if item[0] == "user" else "", canon, size)


def _leaves(value: Any) -> Any:
    if isinstance(value, tuple):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


_PLAIN = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
_PLAIN_CALL = frozenset({"id", "type", "function"})
_PLAIN_FN = frozenset({"name", "arguments"})


def _key(m: dict[str, Any]) -> tuple[Any, ...] | None:
    """What a plain message holds, as a key equal only for messages whose JSON is the same (the
    fields present and their string values, its calls' likewise); None for any other message (it is
    read every time)."""
    if not isinstance(m, dict) or not _PLAIN.issuperset(m):
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
KNOWN_BYTES = 32 << 20  # the conversations `_Known` keeps (their messages parsed, and read), at most, about
PARSED = 4  # a message read takes about this many times its canonical JSON: parsed (3), and its wire bytes
LOOK_BACK = 16  # a request is read on from a known conversation it extends by at most this many messages


class Read(NamedTuple):
    """A request's messages read (`read`)."""

    items: tuple[Item, ...]  # its view (`view`)
    digests: tuple[str, ...]  # each item's digest (`answer_digest`)
    texts: tuple[str, ...]  # each user item's text's digest ("" for the other roles)
    canons: tuple[str, ...]  # each message's canonical JSON
    conv: str  # its view's digests, with and without its system messages (`digests`)
    extends: tuple[str, ...]  # the digests of its views cut before each assistant message (`digests`)
    body: str = ""  # the digest of the body its messages came in (`read`'s `around`)


@dataclass
class _Reading:
    """A conversation read so far: its messages (the list as parsed) and each one's canonical JSON,
    its view's closed items with their digests, the item still open (a run of one role: the messages
    `open` of it), the two digest chains of its view (with and without its system messages) with their
    cuts, and what the wire's check left open (`checked`; None: not checked as Chat Completions)."""

    messages: list[Any] = field(default_factory=list)
    canons: list[str] = field(default_factory=list)
    loose: list[int] = field(default_factory=list)  # the messages no key holds (compared by canonical JSON)
    items: list[Item] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    open: list[Seen] = field(default_factory=list)
    chains: list[str] = field(default_factory=lambda: ["", ""])
    lengths: list[int] = field(default_factory=lambda: [0, 0])
    cuts: list[tuple[int, int, str]] = field(default_factory=list)  # (-length, chain, digest), in order
    # each message's bytes as the upstream gets it, once written (`_json.Encoded`; None until then, and for a
    # message no key holds: the messages it is compared by may differ in how a number is written)
    wires: list[bytes | None] = field(default_factory=list)
    size: int = 0
    checked: Any = None
    hashed: tuple[str, int, Any] | None = None  # a body's text before its messages, how many, hashed through them
    # read from a body's bytes (`_prefix`): those bytes through its last message, the fields before its
    # messages (parsed), and what `_load.weigh` counts in those bytes; b"" when read otherwise
    raw: bytes = b""
    head: dict[str, Any] = field(default_factory=dict)
    counts: tuple[int, int, int] = (0, 0, 0)
    head_size: int = 0  # what `head` takes, about

    @property
    def held(self) -> int:
        """What keeping this reading takes, about (bytes)."""
        return self.size + len(self.raw) + self.head_size

    def go_on(self) -> _Reading:
        """A copy to read more messages into (this one stays as it was; its bytes are not the copy's)."""
        wires = list(self.wires)
        for i in self.loose:
            wires[i] = None
        return _Reading(list(self.messages), list(self.canons), list(self.loose), list(self.items), list(self.digests),
                        list(self.texts), list(self.open), list(self.chains), list(self.lengths), list(self.cuts),
                        wires, self.size, self.checked, self.hashed)

    def body(self, head: str, tail: str) -> str:
        """The digest of `head` + its messages' canonical JSON as an array + `tail`, hashed on from where
        the last body with this head stopped (its hash kept, through its messages)."""
        at = self.hashed
        if at is not None and at[0] == head and at[1] <= len(self.canons):
            h, start = at[2].copy(), at[1]
        else:
            h, start = hashlib.sha256(f"{head}[".encode("utf-8", "surrogatepass")), 0
        for i in range(start, len(self.canons)):
            h.update(f"{',' if i else ''}{self.canons[i]}".encode("utf-8", "surrogatepass"))
        self.hashed = (head, len(self.canons), h.copy())
        h.update(f"]{tail}".encode("utf-8", "surrogatepass"))
        return h.hexdigest()[:32]

    def add(self, m: Any) -> None:
        key = _key(m)
        seen = _MEMO.read(m, key)
        if key is None:
            self.loose.append(len(self.messages))
        self.messages.append(m)
        self.canons.append(seen.canon)
        self.wires.append(None)
        self.size += seen.size + PARSED * len(seen.canon)
        if self.open and self.open[0].item[0] != seen.item[0]:
            self._close()
        self.open.append(seen)

    def _close(self) -> None:
        """The open item closed (a message of another role came): joined once, digested, chained."""
        item, digest, text = _joined(self.open)
        self.open = []
        self.items.append(item)
        self.digests.append(digest)
        self.texts.append(text)
        self._chain(item)

    def _chain(self, item: Item) -> None:
        role, canon = item[0], canonical_json(item)
        for bare in (0, 1):
            if bare and role == "system":
                continue
            if role == "assistant" and self.chains[bare]:  # (kept in their order: longest first)
                bisect.insort(self.cuts, (-self.lengths[bare], bare, self.chains[bare]))
            self.chains[bare] = hashlib.sha256(f"{self.chains[bare]}\n{canon}".encode(
                "utf-8", "surrogatepass")).hexdigest()[:32]
            self.lengths[bare] += 1

    def done(self) -> Read:
        final = self.go_on()
        if final.open:
            final._close()
        return Read(tuple(final.items), tuple(final.digests), tuple(final.texts), tuple(final.canons),
                    " ".join(final.chains), tuple(map(_CUT, final.cuts)))


_CUT = itemgetter(2)  # a cut's digest


def _joined(run: list[Seen]) -> tuple[Item, str, str]:
    """A run of one role's messages as one item, with its digests (one message: as the memo has it)."""
    if len(run) == 1:
        return run[0].item, run[0].digest, run[0].text
    role = run[0].item[0]
    item = (role, " ".join(s.item[1] for s in run if s.item[1]), tuple(c for s in run for c in s.item[2]))
    return item, _digest(item), _digest(item[1]) if role == "user" else ""


WINDOW = 64  # `_Known` places a conversation read from bytes by the WINDOW bytes before a power of two in them
BUCKET = 8  # the conversations one place holds, at most (the latest)


def _place(raw: bytes) -> tuple[int, bytes] | None:
    if len(raw) < WINDOW:
        return None
    at = 1 << (len(raw).bit_length() - 1)  # the largest power of two in its length
    return at, raw[at - WINDOW:at]


class _Known:
    """The conversations as their latest requests sent them (read), so that the next request of one,
    which carries all of it again, is read from where it left off: found by its length and its last
    message, then compared whole (in C, not message by message in Python; a message no key holds by
    its canonical JSON, which tells `true` from `1`), or before it is parsed, by its bytes (`after`).
    Bounded (`KNOWN_BYTES`), the least recently extended first out."""

    def __init__(self, budget: int = KNOWN_BYTES) -> None:
        self.budget = budget
        self.chars = 0
        self.kept: OrderedDict[Any, _Reading] = OrderedDict()
        self.placed: dict[tuple[int, bytes], list[_Reading]] = {}  # those read from bytes (`_place`)

    @staticmethod
    def _ident(messages: list[Any], n: int) -> Any:
        return n, _key(messages[n - 1]) or canonical_json(messages[n - 1])

    def find(self, messages: list[Any]) -> _Reading | None:
        """The longest known conversation `messages` begins with (at most LOOK_BACK messages shorter)."""
        try:
            for n in range(len(messages), max(0, len(messages) - LOOK_BACK), -1):
                got = self.kept.get(self._ident(messages, n))
                if got is not None and messages[:n] == got.messages and \
                        all(canonical_json(messages[i]) == got.canons[i] for i in got.loose):
                    return got
        except (ValueError, RecursionError, TypeError):  # a message no key or JSON can hold: read from the start
            return None
        return None

    def after(self, data: bytes) -> _Reading | None:
        """The longest known conversation read from bytes that `data` begins with, through its last
        message (the same bytes parse to the same values: nothing of it need be parsed again). Looked
        for where it was placed: at each power of two in `data`'s length, the WINDOW bytes before it."""
        at = 1 << max(0, (len(data) - 1).bit_length() - 1)
        while at >= WINDOW:
            best = None
            for r in self.placed.get((at, data[at - WINDOW:at]), ()):
                if len(r.raw) < len(data) and (best is None or len(r.raw) > len(best.raw)) and data.startswith(r.raw):
                    best = r
            if best is not None:
                return best
            at >>= 1
        return None

    def keep(self, reading: _Reading, replaces: _Reading | None) -> None:
        if replaces is not None and replaces.messages:  # the conversation moved on: its shorter self is of no use
            key = self._ident(replaces.messages, len(replaces.messages))
            if self.kept.get(key) is replaces:
                self._out(self.kept.pop(key))
        if not reading.messages:
            return
        key = self._ident(reading.messages, len(reading.messages))
        old = self.kept.pop(key, None)
        if old is not None:
            self._out(old)
        if reading.held > self.budget:
            return
        self.kept[key] = reading
        self.chars += reading.held
        at = _place(reading.raw)
        if at is not None:
            same = self.placed.setdefault(at, [])
            same.append(reading)
            del same[:-BUCKET]
        while self.chars > self.budget and self.kept:
            self._out(self.kept.popitem(last=False)[1])

    def _out(self, reading: _Reading) -> None:
        """`reading` gone from `kept`: its size given back, and its place."""
        self.chars -= reading.held
        at = _place(reading.raw)
        same = self.placed.get(at) if at is not None else None
        if same is not None:
            same[:] = [r for r in same if r is not reading]
            if not same:
                del self.placed[at]  # type: ignore[arg-type]  (placed: a place)


_KNOWN = _Known()


def reading(messages: list[Any], known: Any = False) -> tuple[_Reading | None, _Reading]:
    """The known conversation `messages` extends (None: none), and a reading to go on with: a copy of
    it, or a fresh one. `read(messages, ...)` finishes it. `known`: that conversation, if found already
    (`known_before`)."""
    known = _KNOWN.find(messages) if known is False else known
    return known, known.go_on() if known is not None else _Reading()


def known_before(data: bytes) -> Any:
    """The known conversation a request body's bytes begin with, through its last message, read from
    bytes before (`_prefix`): its `raw` bytes, `head` fields and their `counts`; None: none."""
    return _KNOWN.after(data)


def read(messages: list[Any], started: tuple[_Reading | None, _Reading] | None = None,
         around: tuple[str, str] | None = None) -> Read:
    """The request's messages read: from the known conversation it extends, its new messages only
    (`reading`); else each message, those read before taken from the memo. Kept for the next. With
    `started` from the wire's parse, its check goes with it; without, what was added is unchecked.
    `around`: the body's canonical JSON before and after its messages array, for its digest (`body`)."""
    return read_kept(messages, started, around)[0]


def read_kept(messages: list[Any], started: tuple[_Reading | None, _Reading] | None = None,
              around: tuple[str, str] | None = None) -> tuple[Read, list[bytes | None]]:
    """`read`, and its messages' wire bytes as the conversation keeps them (`_json.Encoded`'s parts:
    those written for an earlier request, the others None, filled as they are written)."""
    known, going = reading(messages) if started is None else started
    if started is None and len(messages) > len(going.messages):
        going.checked = None
    for m in messages[len(going.messages):]:
        going.add(m)
    _KNOWN.keep(going, known)
    done = going.done()
    return done if around is None else done._replace(body=going.body(*around)), going.wires


def view(messages: list[dict[str, Any]]) -> list[Item]:
    """Each message as (role, text, calls (name, arguments)), whitespace collapsed; consecutive
    messages of one role are one."""
    return list(read(messages).items)


def digests(messages: list[dict[str, Any]], seen: Read | None = None) -> tuple[str, tuple[str, ...]]:
    """(the digests of the whole request's view, with and without its system messages, space-joined;
    the digests of its views cut just before each of its assistant messages, longest first, and of one
    length with the system messages first). A request extends the run whose latest request's digest
    is one of the cuts; the cuts without system messages serve an agent that asks for its last answer
    under another system prompt (smolagents at its max_steps). `seen`: `read(messages)`, if known.
    A view's digest chains its items' digests: one small hash per item, each made once."""
    seen = read(messages) if seen is None else seen
    return seen.conv, seen.extends


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
    users = frozenset(seen.texts) - _NO_TEXT  # (a user item's digest; "" for the other roles)
    return _digest(items[:n]), users, tuple(answers)


_NO_TEXT = frozenset({""})


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
