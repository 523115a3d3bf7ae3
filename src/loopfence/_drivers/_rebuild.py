"""What a run was started with, rebuilt from its log header: limits, policy, tools, gate, model.

Replay rebuilds the tools as *recorded* tools (their results come from the log); resume checks the
live tools against the recorded schemas; both rebuild the model settings from `header.model`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._compact import Compaction
from .._gate import ApprovalHook, UntrustedGate, approve_all, approver, deny_all
from .._limits import Limits, Policy
from ..models._base import Model
from ..tools._registry import Registry, Tool, signature_model
from .._log import LogError
from .._log._schema import GateLine, HeaderLine, LogEvent, ToolSpec

__all__ = ["RecordedFn", "recorded_tool", "recorded_limits", "recorded_policy", "limits_of",
           "policy_of", "compaction_of", "gate_of",
           "messages_of", "registry_of", "check_tools", "model_of", "ModelRebuildError", "live_approval", "gated_names",
           "workspace_tools_of"]


class ModelRebuildError(ValueError):
    """The header's model settings cannot be turned back into a live model here."""


class RecordedFn:
    """The function of a recorded tool: replay answers from the log, so calling it is a bug."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name} is a recorded tool: its results come from the run log")


def recorded_tool(spec: ToolSpec, privileged: bool = False) -> Tool:
    """The recorded tool: its schema, kind and flags, and where a function's signature validated its
    arguments, the same strict model rebuilt from the schema (so a refused call gets the same words)."""
    t = Tool.from_schema(spec.name, RecordedFn(spec.name), spec.parameters, description=spec.description,
                         kind=spec.kind, untrusted=spec.untrusted, privileged=privileged)
    model = signature_model(spec.name, spec.parameters) if spec.signature else None
    return t if model is None else dataclasses.replace(t, args_model=model)


# Rules added after logs were first written: a header without them comes from a run without them.
_LIMITS_BEFORE: dict[str, Any] = {"max_cycle_repeats": None,  # no cycle detection
                                   "max_tokens_per_request": None}  # no per-request cap
_POLICY_BEFORE: dict[str, Any] = {"repeat_scope": "run"}  # repeats counted over the whole run


def recorded_limits(data: Mapping[str, Any]) -> Limits:
    """The header's limits as the run applied them (ValueError/TypeError when unreadable)."""
    return Limits.from_json({**_LIMITS_BEFORE, **data})


def recorded_policy(data: Mapping[str, Any]) -> Policy:
    return Policy.from_json({**_POLICY_BEFORE, **data})


def limits_of(h: HeaderLine, path: str, overrides: Mapping[str, Any] | None = None) -> Limits:
    try:
        return recorded_limits(h.limits).replace(**dict(overrides or {}))
    except (TypeError, ValueError) as exc:
        raise LogError(path, h.line, f"header limits: {exc}") from None


def policy_of(h: HeaderLine, path: str) -> Policy:
    try:
        return recorded_policy(h.policy)
    except (TypeError, ValueError) as exc:
        raise LogError(path, h.line, f"header policy: {exc}") from None


def compaction_of(h: HeaderLine, path: str) -> Compaction:
    data = h.compaction
    if data is None:  # logs written before compaction existed sent everything
        return Compaction.off()
    try:
        return Compaction(keep_turns=data.get("keep_turns"), min_chars=int(data.get("min_chars", 300)))
    except (TypeError, ValueError) as exc:
        raise LogError(path, h.line, f"header compaction: {exc}") from None


def gate_of(h: HeaderLine, path: str, approve: ApprovalHook | None) -> UntrustedGate:
    """The untrusted-content gate as recorded; `approve` answers for it (recorded or live)."""
    data = h.gate
    if data is None:
        return UntrustedGate(approve)
    names = data.get("privileged", "default")
    if names != "default" and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise LogError(path, h.line, "header gate.privileged must be \"default\" or a list of names")
    return UntrustedGate(approve, None if names == "default" else names)


def live_approval(h: HeaderLine) -> ApprovalHook:
    """Resume keeps the recorded approval mode (`ask` asks only on a terminal, else denies)."""
    mode = h.gate.get("approve") if h.gate is not None else None
    if mode == "all":
        return approve_all
    if mode == "ask":
        return approver(None)
    return deny_all


def messages_of(h: HeaderLine) -> list[dict[str, Any]]:
    """The opening conversation, exactly as `run()` builds it (a continued conversation: as recorded)."""
    if h.messages is not None:
        return [dict(m) for m in h.messages]
    return ([{"role": "system", "content": h.system}] if h.system else []) + \
        [{"role": "user", "content": h.task}]


def registry_of(h: HeaderLine, live: Iterable[Tool] = (), privileged: Iterable[str] = ()) -> Registry:
    """One tool per recorded spec, in the recorded order: the live one where given, else recorded.
    `privileged`: recorded tools the gate treated as privileged (the header does not say; the
    gate's events do)."""
    by_name = {t.name: t for t in live}
    gated = set(privileged)
    return Registry([by_name.get(s.name) or recorded_tool(s, s.name in gated) for s in h.specs])


def gated_names(events: Iterable[LogEvent]) -> set[str]:
    """Tools the untrusted-content gate judged privileged: it logs every call it lets through or not."""
    return {e.name for e in events if isinstance(e, GateLine) and e.decision in ("allowed", "approved", "refused")}


def check_tools(h: HeaderLine, path: str, tools: Iterable[Tool]) -> Registry:
    """Live tools for a resumed run: every recorded tool present, with the recorded schema and kind."""
    by_name = {t.name: t for t in tools}
    missing = [s.name for s in h.specs if s.name not in by_name]
    if missing:
        raise LogError(path, h.line, f"the run used tool(s) {', '.join(missing)} that are not available "
                       "here; pass them to resume()")
    for s in h.specs:
        t = by_name[s.name]
        if t.schema() != s.schema() or t.kind != s.kind:
            raise LogError(path, h.line, f"tool {s.name}: its schema or kind differs from the one "
                           "recorded in the header; the conversation would not continue the same")
    return Registry([by_name[s.name] for s in h.specs])


_Builder = Callable[[dict[str, Any], int], Model]


def model_of(h: HeaderLine, replies_served: int) -> Model:
    """A live model with the recorded settings. Scripted models continue where the log ended."""
    d = h.model
    kind = d.get("kind")
    builders: dict[str, _Builder] = {"scripted": _scripted, "openai": _openai, "local": _local}
    if kind not in builders:
        raise ModelRebuildError(f"the header's model kind {kind!r} cannot be rebuilt here "
                                f"(known: {', '.join(builders)}); pass a model to resume()")
    try:
        return builders[str(kind)](d, replies_served)
    except ModelRebuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to build is reported the same way
        raise ModelRebuildError(f"cannot rebuild the {kind} model from the header: "
                                f"{type(exc).__name__}: {exc}") from None


def _scripted(d: dict[str, Any], served: int) -> Model:
    from ..models._scripted import ScriptedModel, ScriptError

    options: dict[str, Any] = {"repeat_last": bool(d.get("repeat_last", True)), "offset": served}
    path, digest = d.get("script_path"), d.get("script_sha256")
    if isinstance(path, str) and isinstance(digest, str):
        try:
            return ScriptedModel.from_file(path, sha256=digest, **options)
        except ScriptError as exc:
            raise ModelRebuildError(f"cannot rebuild the scripted model: {exc}") from None
    script = d.get("script")
    if not isinstance(script, list) or not script:
        raise ModelRebuildError("the header's scripted model has no script (neither inline nor a "
                                "file); pass the model to resume()")
    return ScriptedModel(script, **options)


def _openai(d: dict[str, Any], served: int) -> Model:
    from ..models._openai import OpenAIModel
    from ..models._retry import Timeouts

    options: dict[str, Any] = {k: d[k] for k in ("stream", "max_retries", "retry_after_cap",
                                                 "request_timeout", "tool_choice", "extra_params")
                               if d.get(k) is not None}
    if "max_response_bytes" in d:  # None is a setting here (unbounded); older headers have none: the default
        options["max_response_bytes"] = d["max_response_bytes"]
    if isinstance(d.get("timeouts"), dict):
        options["timeout"] = Timeouts(**d["timeouts"])
    return OpenAIModel.from_env(d.get("base_url"), d.get("model"), **options)


def _local(d: dict[str, Any], served: int) -> Model:
    from ..models._local import LocalModel

    options = {k: d[k] for k in ("chat_format", "n_ctx", "seed", "temperature", "max_tokens") if k in d}
    return LocalModel(**options)


def workspace_tools_of(h: HeaderLine, path: str, root: str | None = None) -> list[Tool]:
    """The built-in workspace tools as `loopfence run` made them: over `root` (default: the recorded
    workspace), with the recorded sandbox choice, untrusted globs and hard-link choice."""
    from ..tools import workspace_tools

    where = root or h.workspace
    if not where:
        raise LogError(path, h.line, "the header names no workspace; pass the run's tools or a workspace")
    globs, trust = h.record.get("untrusted_globs"), h.record.get("trust_globs")
    return workspace_tools(where, sandbox=not bool(h.record.get("unsandboxed", False)),
                           untrusted_globs=[str(g) for g in globs] if isinstance(globs, list) and globs else None,
                           trust_globs=[str(g) for g in trust] if isinstance(trust, list) and trust else None,
                           allow_hardlinks=h.record.get("allow_hardlinks") is True)
