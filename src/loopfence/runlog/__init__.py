"""The JSONL run log."""

from ._writer import EVENT_KINDS, FORMAT, VERSION, RunLog

__all__ = ["EVENT_KINDS", "FORMAT", "RunLog", "VERSION"]
