"""Prompt-token estimates, calibrated from what the endpoint reports as the run goes."""

from __future__ import annotations

__all__ = ["TokenEstimator"]


class TokenEstimator:
    """characters / chars_per_token, rounded up. Starts conservative (3.0) and learns from usage."""

    def __init__(self, chars_per_token: float = 3.0) -> None:
        self.chars_per_token = chars_per_token
        self._chars = 0
        self._tokens = 0

    def estimate(self, chars: int) -> int:
        return int(chars / self.chars_per_token) + 1 if chars > 0 else 0

    def calibrate(self, chars: int, reported_tokens: int | None) -> None:
        """Feed one (prompt characters, reported prompt tokens) pair; the ratio is a running sum."""
        if not reported_tokens or reported_tokens <= 0 or chars <= 0:
            return
        self._chars += chars
        self._tokens += reported_tokens
        # never estimate fewer tokens than reported: keep the ratio on the cautious side
        self.chars_per_token = max(1.0, min(8.0, self._chars / self._tokens))
