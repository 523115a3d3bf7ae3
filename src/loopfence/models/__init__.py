"""Models: the protocol and the adapters."""

from ._base import Model
from ._scripted import ScriptedModel, ScriptError, load_script

__all__ = ["Model", "ScriptError", "ScriptedModel", "load_script"]
