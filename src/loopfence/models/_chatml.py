"""The embedded model's prompt and reply: ChatML in, one JSON object out.

Why not llama-cpp-python's `chatml-function-calling` handler: it rendered a tool message as a bare
`<|im_start|>tool` with no content (the model never saw a result), HTML-escaped earlier arguments
into the prompt, and under `tool_choice="auto"` allowed only a call or an empty message (the model
could never answer). Here the prompt follows SmolLM2's own chat template exactly,
`<|im_start|>{role}\n{content}<|im_end|>\n` for every message, a tool result included, with the
tool list and the reply format added to the system message. The model's earlier calls and answers
are rendered as the JSON it is made to write (see `_gbnf.reply_grammar`), so it reads its own
history in its own format.

A prompt is kept as parts, each either a control token or text: text is tokenized with special
tokens off, so a page that contains `<|im_end|>` cannot end its message early or open a new role
(what llama.cpp's own special-token splitting would do to the joined string).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._messages import content_text
from ._gbnf import ANSWER_KEY, ARGUMENTS_KEY, NAME_KEY

__all__ = ["IM_START", "IM_END", "DEFAULT_SYSTEM", "Prompt", "Tokenize", "Decoded", "render", "render_call",
           "render_answer", "tool_list", "decode", "to_response", "tools_for_choice"]

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# what SmolLM2's template puts first when the conversation has no system message
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

Tokenize = Callable[[str, bool], list[int]]  # (text, special tokens on) -> token ids


@dataclass(frozen=True, slots=True)
class Prompt:
    """The rendered prompt as (text, is a control token) parts, ending with the assistant's turn."""

    parts: tuple[tuple[str, bool], ...]

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.parts)

    def tokens(self, tokenize: Tokenize) -> list[int]:
        out: list[int] = []
        for text, special in self.parts:
            out.extend(tokenize(text, special))
        return out


def render_call(name: str, arguments: Any) -> str:
    """A call as the model writes it under the reply grammar. Arguments that are not a JSON object
    (a malformed call sent back for feedback) are shown as the text that was sent."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass
    if isinstance(arguments, dict):
        return json.dumps({NAME_KEY: name, ARGUMENTS_KEY: arguments}, ensure_ascii=False)
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{{"{NAME_KEY}": {json.dumps(name, ensure_ascii=False)}, "{ARGUMENTS_KEY}": {raw}}}'


def render_answer(text: str) -> str:
    """An answer as the model writes it: an object it wrote as an answer (see `decode`) as it was,
    any other text as `{"answer": TEXT}`, so that `decode` gives back the same text."""
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and obj and next(iter(obj)) != NAME_KEY and not _is_plain_answer(obj):
        return text
    return json.dumps({ANSWER_KEY: text}, ensure_ascii=False)


def _signature(fn: dict[str, Any]) -> str:
    """`read_file(path, page=1): Read one page of a text file.`: one short line per tool.

    Short on purpose: the tool list comes before the task, and the tiny model follows the task
    less the more text stands between (the first sentence of a description is its summary)."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or ())
    args = []
    for name, sub in props.items():
        default = sub.get("default") if isinstance(sub, dict) else None
        args.append(str(name) if name in required or default is None
                    else f"{name}={json.dumps(default, ensure_ascii=False)}")
    description = " ".join(str(fn.get("description") or "").split())
    first = description.split(". ")[0].rstrip(".")
    return f"{fn.get('name')}({', '.join(args)})" + (f": {first}." if first else "")


def tool_list(tools: list[dict[str, Any]]) -> str:
    """The tool list and the reply format, appended to the system message.

    The example call names a real tool and its first argument: with placeholders only
    (`{"name": "<tool>", ...}`) the model copied the placeholders, and with a made-up path it
    copied the path."""
    fns = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    lines = "\n".join(f"- {_signature(fn)}" for fn in fns)
    first = fns[0] if fns else {"name": "tool"}
    props = (first.get("parameters") or {}).get("properties") or {}
    example = json.dumps({NAME_KEY: first.get("name"), ARGUMENTS_KEY: {k: "..." for k in list(props)[:1]}})
    return (f"You have these tools:\n{lines}\n\n"
            f"To call a tool, reply with JSON like {example}; its result comes back in a tool message. "
            f'To answer, reply {{"{ANSWER_KEY}": "<your answer>"}}.')


def _message_text(msg: dict[str, Any], json_replies: bool) -> str:
    """A message's text as the template shows it. The assistant's calls are always the JSON it
    writes; its plain answers are too while it is made to write JSON (tools are offered)."""
    content = msg.get("content")
    text = content_text(content) if isinstance(content, list) else "" if content is None else str(content)
    if msg.get("role") != "assistant":
        return text
    calls = [c.get("function") for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
    rendered = [render_call(str(f.get("name") or ""), f.get("arguments")) for f in calls if isinstance(f, dict)]
    if rendered:
        return "\n".join(([text] if text else []) + rendered)
    return render_answer(text) if json_replies else text


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Prompt:
    """The prompt for `messages` with `tools` offered (none: plain chat, replies in plain text)."""
    msgs = list(messages)
    if not msgs or msgs[0].get("role") != "system":
        msgs.insert(0, {"role": "system", "content": DEFAULT_SYSTEM})
    parts: list[tuple[str, bool]] = []
    for i, msg in enumerate(msgs):
        text = _message_text(msg, json_replies=bool(tools))
        if i == 0 and tools:
            text = f"{text}\n\n{tool_list(tools)}" if text else tool_list(tools)
        parts += [(IM_START, True), (f"{msg.get('role')}\n{text}", False), (IM_END, True), ("\n", False)]
    parts += [(IM_START, True), ("assistant\n", False)]
    return Prompt(tuple(parts))


def tools_for_choice(tools: list[dict[str, Any]], choice: Any) -> tuple[list[dict[str, Any]], bool]:
    """(tools offered, whether an answer is allowed) for an OpenAI `tool_choice`."""
    if choice == "none" or not tools:
        return [], True
    if choice == "required":
        return tools, False
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = [t for t in tools if (t.get("function") or {}).get("name") == choice["function"].get("name")]
        return (named, False) if named else (tools, True)
    return tools, True  # "auto" and anything unknown


@dataclass(frozen=True, slots=True)
class Decoded:
    """What a reply says: answer text, or one call (name, arguments); `readable` False for text that
    is neither (cut off, or generated without the grammar)."""

    content: str | None
    call: tuple[str, dict[str, Any]] | None = None
    readable: bool = True


def decode(text: str) -> Decoded:
    """Read a reply written under the reply grammar: an object whose first key is "name" is a call,
    `{"answer": TEXT}` answers TEXT, and any other object answers with itself, as written."""
    try:
        obj = json.loads(text)
    except ValueError:
        return Decoded(_partial_answer(text), None, False)
    if not isinstance(obj, dict) or not obj:
        return Decoded(text, None, False)
    if next(iter(obj)) == NAME_KEY:
        if set(obj) == {NAME_KEY, ARGUMENTS_KEY} and isinstance(obj[NAME_KEY], str) \
                and isinstance(obj[ARGUMENTS_KEY], dict):
            return Decoded(None, (obj[NAME_KEY], obj[ARGUMENTS_KEY]))
        return Decoded(text, None, False)
    if _is_plain_answer(obj):
        return Decoded(obj[ANSWER_KEY])
    return Decoded(text)


def _is_plain_answer(obj: dict[str, Any]) -> bool:
    return set(obj) == {ANSWER_KEY} and isinstance(obj[ANSWER_KEY], str)


def _partial_answer(text: str) -> str:
    """A cut-off `{"answer": "...` as the text it had reached; anything else as it came."""
    head = f'{{"{ANSWER_KEY}": "'
    if text.startswith(head):
        body = text[len(head):]
        for cut in range(len(body), max(len(body) - 8, -1), -1):  # drop a half-written escape
            try:
                return str(json.loads('"' + body[:cut] + '"'))
            except ValueError:
                continue
    return text


def to_response(decoded: Decoded, *, call_id: str, model: str, finish_reason: str | None,
                usage: dict[str, int], created: int) -> dict[str, Any]:
    """The chat.completions object the ring reads (`Reply.from_response`)."""
    message: dict[str, Any] = {"role": "assistant", "content": decoded.content}
    finish = finish_reason or "stop"
    if decoded.call is not None:
        name, arguments = decoded.call
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": {
            "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]
        finish = "tool_calls" if finish == "stop" else finish
    return {"id": f"chatcmpl-{call_id}", "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
