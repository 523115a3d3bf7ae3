"""Test helpers that ship with the package (builders; the pytest plugin and fake server join later)."""

from ._builders import calls_reply, text_reply, tool_call

__all__ = ["calls_reply", "text_reply", "tool_call"]
