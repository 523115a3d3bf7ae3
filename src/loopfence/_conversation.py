"""A run's opening: a task (one string) or a conversation to continue (OpenAI chat messages).

    result = agent.run("What is in app/config.py?")
    result = agent.run([*result.messages, {"role": "user", "content": "And in app/main.py?"}])

A conversation is checked before the run starts (TypeError or ValueError naming `messages[i]`), and
copied as the log reads it back, so that replay and reconcile rebuild the same opening.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ._json import dumps

__all__ = ["Task", "check_task", "opening"]

Task = str | Sequence[Mapping[str, Any]]  # what run(), arun() and stream() take
ROLES = ("system", "user", "assistant", "tool")


def check_task(task: Any) -> None:
    """TypeError or ValueError, before anything runs, for a task that is neither a string nor a
    conversation that can be continued (`opening`'s checks)."""
    opening(task, None)


def opening(task: Task, system: str | None) -> tuple[list[dict[str, Any]], str, bool]:
    """(the messages the run starts from, the task's text, whether `task` was a conversation).
    A string: `system` (if any) and one user message. A conversation: its messages as given, with
    `system` first unless the conversation opens with a system message of its own; the task's text
    is its last message's, which must be the user's (the turn to answer)."""
    if isinstance(task, str):
        return ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": task}], task, False
    if isinstance(task, (Mapping, bytes)) or not isinstance(task, Sequence):
        raise TypeError(f"task must be a string or a conversation (a list of messages such as "
                        f"{{'role': 'user', 'content': '...'}}), got {type(task).__name__}")
    if not task:
        raise ValueError("task: the conversation is empty (it needs at least the user's message)")
    messages = [_message(i, m) for i, m in enumerate(task)]
    last = messages[-1]
    if last["role"] != "user":
        raise ValueError(f"messages[{len(messages) - 1}]: a conversation ends with the user's message (the "
                         f"turn to answer), got role {last['role']!r}: add "
                         "{'role': 'user', 'content': ...}")
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages, _text(last.get("content")), True


def _message(i: int, m: Any) -> dict[str, Any]:
    if not isinstance(m, Mapping):
        raise TypeError(f"messages[{i}] must be a dict (an OpenAI chat message), got {type(m).__name__}")
    role = m.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
    content = m.get("content")
    if role in ("system", "user") and not isinstance(content, (str, list)):
        raise ValueError(f"messages[{i}].content must be a string or a list of parts for a {role} "
                         f"message, got {type(content).__name__}")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise ValueError(f"messages[{i}].tool_call_id must be a string for a tool message, "
                         f"got {m.get('tool_call_id')!r}")
    try:
        json.dumps(m, allow_nan=False)  # what the log can hold: JSON, no NaN
    except (TypeError, ValueError) as exc:
        raise TypeError(f"messages[{i}] must be JSON (strings, numbers, lists, dicts): {exc}") from None
    copied: dict[str, Any] = json.loads(dumps(dict(m)))  # as the log reads it back
    return copied


def _text(content: Any) -> str:
    """A message's text: its content, or a list of parts' text parts joined."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
