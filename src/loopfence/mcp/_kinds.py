"""What an MCP tool is to the fence: its kind, whether it is privileged, whether its output is trusted.

The MCP spec says a client must treat tool annotations as untrusted unless the server is trusted,
and its defaults assume the worst. So:

- server not trusted (the default): `side_effect`, privileged (refused once untrusted content is in
  the context), output untrusted, whatever the annotations say;
- `trust_annotations=True` (per server): `readOnlyHint: true` -> `read_only` (cached, reused, subject
  to no_progress) and not privileged; otherwise `side_effect`, privileged unless
  `destructiveHint: false`; output trusted only with `openWorldHint: false`.
- an override by tool name (`kinds={"read_note": "read_only"}` or a dict with any of `kind`,
  `privileged`, `untrusted`) wins over both, and says so.

`classify` returns the decision and a sentence saying why: it goes into the log header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..tools._registry import ToolKind

__all__ = ["Classified", "classify", "Override", "parse_override"]

_HINTS = (("readOnlyHint", "read_only_hint"), ("destructiveHint", "destructive_hint"),
          ("idempotentHint", "idempotent_hint"), ("openWorldHint", "open_world_hint"))


@dataclass(frozen=True)
class Override:
    kind: ToolKind | None = None
    privileged: bool | None = None
    untrusted: bool | None = None

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("kind", self.kind and str(self.kind)), ("privileged", self.privileged),
                                          ("untrusted", self.untrusted)) if v is not None]
        return ", ".join(parts)


def parse_override(name: str, value: Any) -> Override:
    """`"read_only"` or `{"kind": ..., "privileged": bool, "untrusted": bool}`; ValueError otherwise."""
    if isinstance(value, (str, ToolKind)):
        value = {"kind": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"kinds[{name!r}]: expected a kind name or a dict, got {type(value).__name__}")
    unknown = sorted(set(value) - {"kind", "privileged", "untrusted"})
    if unknown:
        raise ValueError(f"kinds[{name!r}]: unknown field(s) {', '.join(unknown)} (kind, privileged, untrusted)")
    kind = value.get("kind")
    if kind is not None:
        try:
            kind = ToolKind(kind)
        except ValueError:
            raise ValueError(f"kinds[{name!r}]: kind must be one of {', '.join(k.value for k in ToolKind)}, "
                             f"got {kind!r}") from None
    for flag in ("privileged", "untrusted"):
        if flag in value and not isinstance(value[flag], bool):
            raise ValueError(f"kinds[{name!r}]: {flag} must be true or false, got {value[flag]!r}")
    return Override(kind, value.get("privileged"), value.get("untrusted"))


@dataclass(frozen=True)
class Classified:
    kind: ToolKind
    privileged: bool
    untrusted: bool
    why: str
    annotations: dict[str, bool]  # the hints the server sent (camelCase, as on the wire)

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "privileged": self.privileged, "untrusted": self.untrusted,
                "why": self.why, "annotations": self.annotations}


def hints(annotations: Any) -> dict[str, bool]:
    """The boolean hints of an SDK ToolAnnotations (or a plain dict), by their wire names."""
    out: dict[str, bool] = {}
    if annotations is None:
        return out
    for wire, attr in _HINTS:
        value = annotations.get(wire, annotations.get(attr)) if isinstance(annotations, Mapping) else \
            getattr(annotations, attr, None)
        if isinstance(value, bool):
            out[wire] = value
    return out


def classify(annotations: Any, trusted: bool, override: Override | None = None) -> Classified:
    """An MCP tool's kind, privilege and trust from its annotations (only when the server is `trusted`;
    otherwise side_effect, privileged, untrusted), then `override`; `why` says which decided."""
    seen = hints(annotations)
    if not trusted:
        kind, privileged, untrusted = ToolKind.SIDE_EFFECT, True, True
        why = ("annotations not trusted (trust_annotations is off for this server): side_effect, privileged, "
               "output untrusted, as the MCP spec's defaults assume")
    else:
        read_only = seen.get("readOnlyHint") is True
        kind = ToolKind.READ_ONLY if read_only else ToolKind.SIDE_EFFECT
        privileged = not read_only and seen.get("destructiveHint") is not False
        untrusted = seen.get("openWorldHint") is not False
        reasons = ["readOnlyHint=true -> read_only, not privileged" if read_only else
                   "readOnlyHint not true -> side_effect"]
        if not read_only:
            reasons.append("destructiveHint=false -> not privileged" if not privileged else
                           "destructiveHint " + ("=true" if seen.get("destructiveHint") else "absent (default true)")
                           + " -> privileged")
        reasons.append("openWorldHint=false -> output trusted" if not untrusted else
                       "openWorldHint " + ("=true" if seen.get("openWorldHint") else "absent (default true)")
                       + " -> output untrusted")
        why = "annotations trusted: " + "; ".join(reasons)
    if override is not None:
        kind = override.kind or kind
        privileged = privileged if override.privileged is None else override.privileged
        untrusted = untrusted if override.untrusted is None else override.untrusted
        why += f"; overridden by kinds=: {override.describe()}"
    return Classified(kind, privileged, untrusted, why, seen)
