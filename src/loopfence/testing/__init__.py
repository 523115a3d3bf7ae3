"""Test helpers that ship with the package: builders and a real loopback fake server."""

from ._builders import calls_reply, text_reply, tool_call
from ._fakeserver import FAULTS, FakeServer, FormError, load_forms, overflow_body

__all__ = ["FAULTS", "FakeServer", "FormError", "calls_reply", "load_forms", "overflow_body", "text_reply",
           "tool_call"]
