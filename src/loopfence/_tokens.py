"""Prompt-token estimates, calibrated from what the endpoint reports as the run goes.

The estimate is over `text_units`, not raw characters: digits, punctuation and non-ASCII bytes cost
more tokens per character than words do (SmolLM2: prose 3.7 characters per token, inline CSS 1.7,
minified script 1.1), so they weigh SYMBOL_WEIGHT times. One calibrated ratio then fits prose,
JSON and markup within a factor of about 2 instead of 3.6, and a page of CSS is not taken for prose.
"""

from __future__ import annotations

import string

__all__ = ["TokenEstimator", "text_units", "SYMBOL_WEIGHT"]

SYMBOL_WEIGHT = 3
_PLAIN = (string.ascii_letters + string.whitespace).encode()


def text_units(text: str) -> int:
    """Characters, plus (SYMBOL_WEIGHT - 1) per byte that is not an ASCII letter or whitespace."""
    symbols = len(text.encode("utf-8", "surrogatepass").translate(None, _PLAIN))
    return len(text) + (SYMBOL_WEIGHT - 1) * symbols


class TokenEstimator:
    """units / chars_per_token (units: `text_units`), rounded up. Starts conservative (3.0: prose is
    about 4.5 units per token) and learns from usage."""

    def __init__(self, chars_per_token: float = 3.0) -> None:
        self.chars_per_token = chars_per_token
        self.start = chars_per_token
        self._chars = 0
        self._tokens = 0

    def estimate(self, chars: int) -> int:
        return int(chars / self.chars_per_token) + 1 if chars > 0 else 0

    def cautious(self, chars: int) -> int:
        """For content the endpoint has not counted yet: never a leaner ratio than the start."""
        return int(chars / min(self.chars_per_token, self.start)) + 1 if chars > 0 else 0

    def calibrate(self, chars: int, reported_tokens: int | None) -> None:
        """Feed one (prompt characters, reported prompt tokens) pair; the ratio is a running sum."""
        if not reported_tokens or reported_tokens <= 0 or chars <= 0:
            return
        self._chars += chars
        self._tokens += reported_tokens
        # never estimate fewer tokens than reported: keep the ratio on the cautious side
        self.chars_per_token = max(1.0, min(8.0, self._chars / self._tokens))
