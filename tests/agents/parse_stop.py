"""Stop texts through the agents' own parsers: run by the agents' venv (build/agents), never by
loopfence's.

    build/agents/bin/python tests/agents/parse_stop.py < texts.json

stdin: a JSON array of texts. Prints one JSON line: the texts any parser read as a call or an action,
each with the parser that did: smolagents' ToolCallingAgent (`get_tool_call_from_text`, and the JSON
blob it starts from), its CodeAgent (`parse_code_blobs` with its default `<code>` tags, then its
Markdown and bare-Python fallbacks), mini-swe-agent's text mode (`parse_regex_actions` with the
action regex of `LitellmTextbasedModelConfig`).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map download (loopback only)
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from minisweagent.exceptions import FormatError
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModelConfig
from minisweagent.models.utils.actions_text import parse_regex_actions
from smolagents.models import get_tool_call_from_text
from smolagents.utils import parse_code_blobs, parse_json_blob


def parsed(text: str, regex: str) -> list[str]:
    found = []
    for name, parse in (("smolagents parse_json_blob", lambda: parse_json_blob(text)),
                        ("smolagents get_tool_call_from_text", lambda: get_tool_call_from_text(text, "name", "arguments")),
                        ("smolagents parse_code_blobs", lambda: parse_code_blobs(text, ("<code>", "</code>")))):
        try:
            parse()
        except ValueError:
            continue
        found.append(name)
    try:
        parse_regex_actions(text, action_regex=regex, format_error_template="{{error}}")
        found.append("mini-swe-agent parse_regex_actions")
    except FormatError as exc:
        if exc.messages[0]["extra"]["n_actions"]:  # more than one action is still an action read
            found.append("mini-swe-agent parse_regex_actions (several)")
    return found


def main() -> None:
    regex = LitellmTextbasedModelConfig(model_name="m").action_regex
    texts = json.load(sys.stdin)
    bad = [{"text": t, "parsers": p} for t in texts if (p := parsed(t, regex))]
    print(json.dumps({"checked": len(texts), "parsed": bad}))


if __name__ == "__main__":
    main()
