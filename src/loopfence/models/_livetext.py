"""The embedded model's answer text as it is generated, for `stream()` (`TextDelta`s).

`LiveText` is a llama.cpp stopping criterion that never stops: called after each sampled token, it
reads the generation so far and passes on the answer text it has grown by. Under the reply grammar
that text is the `{"answer": "..."}` string, decoded as far as it is written (a half-written escape
or the first half of a surrogate pair waits for the rest); without tools it is the text itself, short
of a partly written end-of-turn marker. A call, or an answer in another form, shows nothing live:
`finish(content)` passes on the rest of the reply's text once it is known.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ._chatml import IM_END
from ._gbnf import ANSWER_KEY

__all__ = ["LiveText"]

_HEAD = f'{{"{ANSWER_KEY}": "'


class LiveText:
    """A `stopping_criteria` entry for `Llama.create_completion` that reports answer text to `sink`."""

    def __init__(self, sink: Callable[[str], None], detokenize: Callable[[list[int], list[int]], bytes],
                 prompt: list[int], grammar: bool) -> None:
        self._sink, self._detokenize, self._prompt, self._grammar = sink, detokenize, prompt, grammar
        self._seen = 0  # completion tokens read so far
        self.sent = ""

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        completion = [int(t) for t in input_ids[len(self._prompt):]]
        if len(completion) > self._seen:
            self._seen = len(completion)
            raw = self._detokenize(completion, self._prompt).decode("utf-8", "ignore")
            self._offer(answer_so_far(raw) if self._grammar else _short_of_marker(raw))
        return False  # never stops the generation

    def finish(self, content: str | None) -> None:
        """The reply's text, now known: whatever of it was not passed on yet."""
        if content is not None:
            self._offer(content)

    def _offer(self, text: str) -> None:
        if len(text) > len(self.sent) and text.startswith(self.sent):
            self._sink(text[len(self.sent):])
            self.sent = text


def answer_so_far(raw: str) -> str:
    """The answer string of a partial `{"answer": "...` reply, decoded as far as it can be ("" for
    any other reply)."""
    if not raw.startswith(_HEAD):
        return ""
    body, end, i = raw[len(_HEAD):], None, 0
    while i < len(body):
        if body[i] == "\\":
            i += 2
            continue
        if body[i] == '"':
            end = i
            break
        i += 1
    written = body if end is None else body[:end]
    for cut in range(len(written), max(len(written) - 12, -1), -1):  # a half-written escape waits
        try:
            text = str(json.loads('"' + written[:cut] + '"'))
        except ValueError:
            continue
        if end is None and text and "\ud800" <= text[-1] <= "\udbff":
            text = text[:-1]  # the first half of a surrogate pair: the second decides the character
        return text
    return ""


def _short_of_marker(raw: str) -> str:
    """Plain text up to the end-of-turn marker, or short of a partly written one at its end."""
    if IM_END in raw:
        return raw[:raw.index(IM_END)]
    for k in range(len(IM_END) - 1, 0, -1):
        if raw.endswith(IM_END[:k]):
            return raw[:-k]
    return raw
