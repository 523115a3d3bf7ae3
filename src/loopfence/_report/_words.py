"""What a report page says in words: each stop reason as a sentence a person reads without knowing
the vocabulary, a run's story in one line ("it read X, ran Y, then answered"), and the tooltips for
the jargon the page uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._json import loads
from .._stops import StopReason
from ._html import esc

# the tools a proxy run's text actions are logged as (proxy/_view.py names them; the report reads logs only)
TEXT_TOOLS = frozenset({"text_action", "text_poll"})

__all__ = ["REASON_WORDS", "reason_words", "call_words", "story", "JARGON", "jargon", "TEXT_TOOLS"]

REASON_WORDS: dict[StopReason, str] = {
    StopReason.FINAL_ANSWER: "The model answered.",
    StopReason.EMPTY_ANSWER: "Stopped because the model replied with neither a call nor any text.",
    StopReason.MAX_STEPS: "Stopped because the run used all the model requests it was allowed (max_steps).",
    StopReason.MAX_TOOL_CALLS: "Stopped because the run used all the tool executions it was allowed (max_tool_calls).",
    StopReason.MAX_PROMPT_TOKENS: "Stopped because the prompts would have gone past the run's prompt-token budget.",
    StopReason.MAX_COMPLETION_TOKENS: "Stopped because the replies used the run's completion-token budget.",
    StopReason.MAX_WALL_SECONDS: "Stopped because the run ran out of time (max_wall_seconds).",
    StopReason.MAX_COST_USD: "Stopped because the next request could have gone past the run's dollar budget.",
    StopReason.REPEATED_CALL: "Stopped because the model asked for the same call again and again.",
    StopReason.REPEATED_RESULT: "Stopped because the tools kept giving the same result: the run was going round in circles.",
    StopReason.NO_PROGRESS: "Stopped because the model kept asking for the same work with nothing new to show for it.",
    StopReason.INCOMPLETE_STREAM: "Stopped because the model's reply was cut off before it was whole; nothing in it was run.",
    StopReason.INVALID_JSON: "Stopped because the model sent a call whose arguments are not valid JSON.",
    StopReason.SCHEMA_MISMATCH: "Stopped because the model sent a call whose arguments do not fit the tool.",
    StopReason.UNKNOWN_TOOL: "Stopped because the model called a tool that does not exist.",
    StopReason.CONTEXT_OVERFLOW: "Stopped because the conversation no longer fits the model's context window.",
    StopReason.ENDPOINT_ERROR: "Stopped because the model's server failed (an error, a timeout, a refused connection).",
    StopReason.CANCELLED: "Stopped because the run was cancelled from outside (Ctrl-C, a client that left).",
    StopReason.FRAMEWORK_LIMIT: "Stopped by the agent framework's own limit.",
    StopReason.ANSWER_REJECTED: "Stopped because the final answer failed its check, even after a retry.",
    StopReason.GUARD: "Stopped by a custom guard's own rule.",
    StopReason.INTERNAL_ERROR: "Stopped by an error inside loopfence (a bug): the traceback is in the stop's data.",
}

JARGON = {
    "tainted": "content that came from outside (a web page, an untrusted file) reached the model; after it, "
               "privileged calls (writes, commands) need approval",
    "fingerprint": "a hash of the conversation as sent: two requests with the same fingerprint sent the same "
                   "prompt",
    "est.": "loopfence's own estimate of the prompt's tokens, made before the request was sent (budgets are "
            "checked against it)",
    "reported": "the token counts the model's server reported in its reply",
    "estimated": "the server reported no token counts: these are loopfence's estimates",
    "reused": "a read-only call asked for again: answered from the run's cache, not run again",
    "refused": "a guard or the gate would not let this call run",
    "rejected": "the call was malformed (unknown tool, bad JSON, wrong arguments) and was not run",
}


def jargon(term: str) -> str:
    """`term` with its meaning as a tooltip (JARGON)."""
    return f'<abbr title="{esc(JARGON[term])}">{esc(term)}</abbr>'


def reason_words(reason: str | None) -> str:
    """The stop reason as a sentence (an unknown one: named as it is)."""
    try:
        return REASON_WORDS[StopReason(reason)]
    except ValueError:
        return f"Stopped: {reason}." if reason else "The log ends without its stop."


def call_words(name: str, arguments: Any, raw: str | None = None, limit: int = 60) -> str:
    """One call as a person reads it: the tool and its most telling argument (a path, a command, an
    action), cut to `limit` characters."""
    args = arguments if isinstance(arguments, dict) else {}
    if not args and raw:
        try:
            parsed = loads(raw)  # bounded: deep nesting is a ValueError
            args = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            args = {}
    main = next((args[k] for k in ("action", "command", "cmd", "path", "file", "url", "query", "pattern")
                 if isinstance(args.get(k), str) and args[k].strip()), None)
    if main is None:
        main = next((v for v in args.values() if isinstance(v, str) and v.strip()), None)
    if main is None:
        return name
    main = " ".join(main.split())
    if len(main) > limit:
        main = main[:limit - 1] + "…"
    return f"{name} {main}"


def story(calls: Iterable[tuple[str, str]], answered: bool, cut: bool = False, limit: int = 8) -> str:
    """The run in one line: "it ran read_file app/config.py (executed), list_dir . (reused), then
    answered" from (call words, decision) in order; the first `limit` calls, then how many more."""
    seen = list(calls)
    parts = [w if d == "executed" else f"{w} ({d})" for w, d in seen[:limit]]
    if len(seen) > limit:
        parts.append(f"{len(seen) - limit} more")
    did = f"It called {', '.join(parts)}" if parts else "It called no tool"
    if answered:
        return did + ", then answered."
    if cut:
        return did + "; its last reply was cut off."
    return did + "."
