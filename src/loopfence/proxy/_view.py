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
from typing import Any

from .._json import canonical_json, loads  # bounded: deep nesting is a ValueError, never a RecursionError

__all__ = ["flat", "calls_in_text", "view", "digests", "marks", "task_marks", "answer_digest", "action_of", "program_of", "call_ids_in", "TEXT_ACTION",
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


def view(messages: list[dict[str, Any]]) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """Each message as (role, text, calls (name, arguments)), whitespace collapsed; consecutive
    messages of one role are one."""
    out: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
    for m in messages:
        text = flat(m.get("content"))
        calls = [(c.get("function", {}).get("name") or "", _args(c.get("function", {}).get("arguments")))
                 for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        if not calls and m.get("role") == "assistant":
            text, found = calls_in_text(text)
            calls = [(name, args) for _, name, args in found]
        role, text = _role(m), _SPACE.sub(" ", text).strip()
        if out and out[-1][0] == role:
            r, t, c = out[-1]
            out[-1] = (r, f"{t} {text}".strip(), c + tuple(calls))
        else:
            out.append((role, text, tuple(calls)))
    return out


def digests(messages: list[dict[str, Any]], seen: list[Any] | None = None) -> tuple[str, tuple[str, ...]]:
    """(the digests of the whole request's view, with and without its system messages, space-joined;
    the digests of its views cut just before each of its assistant messages, longest first, and of one
    length with the system messages first). A request extends the run whose latest request's digest
    is one of the cuts; the cuts without system messages serve an agent that asks for its last answer
    under another system prompt (smolagents at its max_steps). `seen`: `view(messages)`, if known."""
    seen = view(messages) if seen is None else seen
    whole, cuts = [], []
    for bare, items in enumerate((seen, [item for item in seen if item[0] != "system"])):
        d = ""
        for n, item in enumerate(items):
            if item[0] == "assistant" and d:
                cuts.append((-n, bare, d))
            d = hashlib.sha256(f"{d}\n{canonical_json(item)}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
        whole.append(d)
    return " ".join(whole), tuple(d for _, _, d in sorted(cuts))


def marks(seen: list[tuple[str, str, tuple[tuple[str, str], ...]]]) -> tuple[str, frozenset[str], tuple[str, ...]]:
    """What an agent that rebuilds its history still keeps, from a request's view: the digest of its
    leading system messages, the digests of its user messages' texts, and the digests of its last
    MARKED assistant messages, newest first (the answers it was given; aider puts its own "Ok." after
    them)."""
    n = 0
    while n < len(seen) and seen[n][0] == "system":
        n += 1
    answers = [answer_digest(item) for item in reversed(seen) if item[0] == "assistant"][:MARKED]
    return _digest(seen[:n]), frozenset(_digest(text) for role, text, _ in seen if role == "user"), tuple(answers)


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
