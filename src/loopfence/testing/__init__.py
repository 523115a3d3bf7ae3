"""Test helpers that ship with the package: builders, a real loopback fake server, and the adapter
conformance kit (`check_model`, `check_tool`)."""

from ._builders import calls_reply, text_chunks, text_reply, tool_call
from ._conformance import Conformance, ConformanceError, check_model
from ._fakeserver import FAULTS, FakeServer, FormError, load_forms, overflow_body
from ._toolcheck import check_tool

__all__ = ["FAULTS", "Conformance", "ConformanceError", "FakeServer", "FormError", "calls_reply", "check_model", "check_tool",
           "load_forms", "overflow_body", "text_chunks", "text_reply", "tool_call"]
