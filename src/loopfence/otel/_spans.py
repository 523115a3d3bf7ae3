"""One run's typed events -> OpenTelemetry GenAI spans (and metrics), as the events arrive.

The same recorder serves a live run (`on_event=`) and a recorded log (`export --format otlp`), so
both give the same spans: every timestamp comes from the events themselves (the header's
`started_at` and each event's `t`), never from the clock at the time the event is seen.

Spans (GenAI semantic conventions):
- `invoke_agent`: the run, header to stop. `loopfence.stop.reason`, `loopfence.verdict`,
  the ledger's counts; a KILL stop is `error.type` = its reason and an error status.
- `chat {model}`: one per model request (request -> reply), child of the run; retries are span
  events (`loopfence.retry`), the reply's id, model, finish reason and token usage attributes.
- `execute_tool {name}`: one per requested call (call -> result), child of the run, with
  `loopfence.tool.decision` (executed / reused / refused / rejected) and the canonical key's
  digest `loopfence.tool.key_fingerprint` (the key itself, `loopfence.tool.key`, holds the
  arguments: it is content);
  gate decisions are span events (`loopfence.gate`) and `loopfence.gate.decision`.
Message, argument and result contents are recorded only with `include_content=True`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from .._json import fingerprint
from .._log._large import reply_arguments
from .._log._schema import (CallLine, GateLine, HeaderLine, LogEvent, ReplyLine, RequestLine, ResultLine,
                              ResumeLine, RetryLine, StopLine)

__all__ = ["SpanRecorder", "Instruments", "make_instruments", "provider_name", "TOKEN_BUCKETS",
           "DURATION_BUCKETS"]

# the GenAI conventions' advised bucket boundaries
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_PROVIDERS = {"openai": "openai", "local": "llama_cpp", "scripted": "loopfence.scripted"}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = datetime.resolution  # one microsecond


class Instruments:
    """The two GenAI client histograms."""

    def __init__(self, tokens: Histogram, duration: Histogram) -> None:
        self.tokens = tokens
        self.duration = duration


def make_instruments(meter: Meter) -> Instruments:
    return Instruments(
        meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                               description="Number of input and output tokens used",
                               explicit_bucket_boundaries_advisory=TOKEN_BUCKETS),
        meter.create_histogram("gen_ai.client.operation.duration", unit="s",
                               description="GenAI operation duration",
                               explicit_bucket_boundaries_advisory=DURATION_BUCKETS))


def provider_name(model: Mapping[str, Any]) -> str:
    kind = str(model.get("kind") or "unknown")
    return _PROVIDERS.get(kind, kind)


def _epoch_ns(started_at: str) -> int:
    """The header's start in ns since the epoch (a start that is not a date: the epoch itself)."""
    try:
        when = datetime.fromisoformat(started_at)
    except ValueError:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return (when - _EPOCH) // _US * 1000


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes OpenTelemetry accepts: None dropped, other non-scalars as JSON text."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, (str, bool, int, float)):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            out[k] = tuple(v)
        else:
            out[k] = json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)
    return out


def _messages(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _output_message(raw: Any, finish_reason: str | None) -> list[dict[str, Any]]:
    """A recorded chat.completion -> the conventions' output message (role, parts, finish_reason)."""
    message: dict[str, Any] = {}
    if isinstance(raw, dict):
        choices = raw.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message") or {}
    parts: list[dict[str, Any]] = []
    if isinstance(message, dict):
        if isinstance(message.get("content"), str) and message["content"]:
            parts.append({"type": "text", "content": message["content"]})
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict):
                fn = call.get("function") or {}
                parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                              "arguments": fn.get("arguments")})
    return [{"role": "assistant", "parts": parts, "finish_reason": finish_reason or ""}]


class SpanRecorder:
    """One run's `on_event` callback: feed it the run's typed events, in order, header to stop.

    Never raises into the run: an error inside is kept in `error` and the recorder goes quiet.
    `finish()` ends whatever is still open (a log that ends without its stop line).
    """

    def __init__(self, tracer: Tracer, *, instruments: Instruments | None = None, include_content: bool = False,
                 parent: otel_context.Context | None = None,
                 claim: Callable[[str, SpanRecorder], bool] | None = None) -> None:
        self.tracer = tracer
        self.claim = claim  # asked at the header: False when another recorder already traces the run
        self.instruments = instruments
        self.include_content = include_content
        self.parent = parent
        self.error: BaseException | None = None
        self.run_id: str | None = None
        self.root: Span | None = None
        self._ctx: otel_context.Context | None = None
        self._t0 = 0  # epoch ns of the run's t = 0
        self._last_t = 0.0
        self._chat: Span | None = None
        self._chat_t = 0.0
        self._chat_attrs: dict[str, Any] = {}
        self._tools: dict[str, Span] = {}
        self._ended: set[str] = set()
        self._gates: dict[str, list[GateLine]] = {}
        self._kinds: dict[str, str] = {}
        self._descriptions: dict[str, str] = {}
        self._common: dict[str, Any] = {}
        self._server: dict[str, Any] = {}
        self._limits: dict[str, Any] = {}
        self._params: dict[str, Any] = {}
        self._completion = 0
        self._reply_raw: Any = None  # the latest reply's raw response (a large call's arguments)
        self._lock = threading.Lock()
        self.done = False

    # -- the callback -----------------------------------------------------------------------------
    def __call__(self, event: LogEvent) -> None:
        if self.done or self.error is not None:
            return
        with self._lock:
            try:
                self._on(event)
            except Exception as exc:  # noqa: BLE001  (an observer never breaks the run it watches)
                self.error = exc

    def finish(self) -> None:
        """End every span still open at the last event's time (a log cut off before its stop)."""
        with self._lock:
            if self.done or self.root is None:
                return
            at = self._ns(self._last_t)
            self._close_open("incomplete_log", at)
            self.root.set_attribute("loopfence.incomplete", True)
            self.root.end(end_time=at)
            self.done = True

    # -- events -----------------------------------------------------------------------------------
    def _ns(self, t: float) -> int:
        return self._t0 + round(t * 1e9)

    def _on(self, e: LogEvent) -> None:
        self._last_t = max(self._last_t, e.t)
        if isinstance(e, HeaderLine):
            self._header(e)
        elif self.root is None:
            return  # nothing before a header
        elif isinstance(e, RequestLine):
            self._request(e)
        elif isinstance(e, RetryLine):
            (self._chat or self.root).add_event("loopfence.retry", _clean({
                "loopfence.step": e.step, "loopfence.retry.attempt": e.attempt,
                "http.response.status_code": e.status, "loopfence.retry.wait_s": e.wait_s,
                "loopfence.retry.reason": e.reason}), timestamp=self._ns(e.t))
        elif isinstance(e, ReplyLine):
            self._reply(e)
        elif isinstance(e, CallLine):
            self._call(e)
        elif isinstance(e, ResultLine):
            self._result(e)
        elif isinstance(e, GateLine):
            self._gate(e)
        elif isinstance(e, ResumeLine):
            self._resume(e)
        elif isinstance(e, StopLine):
            self._stop(e)

    def _set_model(self, model: Mapping[str, Any]) -> None:
        name = model.get("model") or model.get("kind") or "unknown"
        self._common = {"gen_ai.provider.name": provider_name(model), "gen_ai.request.model": str(name),
                        "gen_ai.conversation.id": self.run_id}
        self._server = {}
        base = model.get("base_url")
        if isinstance(base, str) and base:
            url = urlsplit(base)
            self._server = {"server.address": url.hostname,
                            "server.port": url.port or (443 if url.scheme == "https" else 80)}

    def _header(self, e: HeaderLine) -> None:
        if self.root is not None:
            return
        if self.claim is not None and not self.claim(e.run_id, self):
            self.done = True  # traced already (the run hook and a hand-passed callback both saw it)
            return
        self.run_id = e.run_id
        self._t0 = _epoch_ns(e.started_at) - round(e.t * 1e9)
        self._set_model(e.model)
        self._limits, self._params = dict(e.limits), dict(e.params)
        for spec in e.tools:
            fn = spec.get("function") if isinstance(spec.get("function"), dict) else spec
            name = fn.get("name") if isinstance(fn, dict) else None
            if isinstance(name, str):
                self._kinds[name] = str(spec.get("kind") or "")
                if isinstance(fn.get("description"), str):
                    self._descriptions[name] = fn["description"]
        attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", **self._common,
                                 "loopfence.run_id": e.run_id, "loopfence.log.version": e.version}
        for name, value in e.limits.items():
            if isinstance(value, (int, float, bool)):
                attrs[f"loopfence.limits.{name}"] = value
        if e.workspace:
            attrs["loopfence.workspace"] = e.workspace
        if self.include_content:
            attrs["gen_ai.input.messages"] = _messages([{"role": "user", "parts": [
                {"type": "text", "content": e.task}]}])
            if e.system:
                attrs["gen_ai.system_instructions"] = _messages([{"type": "text", "content": e.system}])
        self.root = self.tracer.start_span("invoke_agent", context=self.parent, kind=SpanKind.INTERNAL,
                                           attributes=_clean(attrs), start_time=self._t0)
        self._ctx = trace.set_span_in_context(self.root, self.parent)

    def _max_tokens(self) -> int | None:
        caps = [self._limits.get("max_tokens_per_request")]
        for name in ("max_tokens", "max_completion_tokens"):
            value = self._params.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                caps.append(value)
                break
        total = self._limits.get("max_completion_tokens")
        if isinstance(total, int):
            caps.append(total - self._completion)
        known = [c for c in caps if isinstance(c, int) and not isinstance(c, bool)]
        return max(1, min(known)) if known else None

    def _request(self, e: RequestLine) -> None:
        self._close_chat("request_abandoned", self._ns(e.t))
        model = self._common["gen_ai.request.model"]
        self._chat_attrs = {"gen_ai.operation.name": "chat", **self._common, **self._server}
        attrs = {**self._chat_attrs, "gen_ai.request.max_tokens": self._max_tokens(), "loopfence.step": e.step,
                 "loopfence.request.prompt_estimate": e.prompt_estimate,
                 "loopfence.request.fingerprint": e.fingerprint, "loopfence.request.n_messages": e.n_messages}
        self._chat = self.tracer.start_span(f"chat {model}", context=self._ctx, kind=SpanKind.CLIENT,
                                            attributes=_clean(attrs), start_time=self._ns(e.t))
        self._chat_t = e.t

    def _reply(self, e: ReplyLine) -> None:
        self._reply_raw = e.raw
        self._completion += e.usage.completion_tokens
        span = self._chat
        if span is None:
            return
        raw = e.raw if isinstance(e.raw, dict) else {}
        response_model = raw.get("model") if isinstance(raw.get("model"), str) else None
        attrs: dict[str, Any] = {
            "gen_ai.response.id": raw.get("id") if isinstance(raw.get("id"), str) else None,
            "gen_ai.response.model": response_model,
            "gen_ai.response.finish_reasons": [e.finish_reason] if e.finish_reason else None,
            "gen_ai.usage.input_tokens": e.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": e.usage.completion_tokens,
            "loopfence.usage.reported": e.usage.reported, "loopfence.usage.charged": e.usage.charged,
            "loopfence.reply.complete": e.complete, "loopfence.reply.duration_s": e.duration_s}
        error = None
        if not e.complete:
            error = "incomplete_stream"
            attrs["loopfence.reply.problem"] = e.problem
        if self.include_content:
            attrs["gen_ai.output.messages"] = _messages(_output_message(e.raw, e.finish_reason))
        span.set_attributes(_clean(attrs))
        if error:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, e.problem or error))
        span.end(end_time=self._ns(e.t))
        self._chat = None
        if self.instruments is not None:
            metric = _clean({**self._chat_attrs, "gen_ai.response.model": response_model,
                             "error.type": error})
            metric.pop("gen_ai.conversation.id", None)  # not a metric dimension (unbounded)
            self.instruments.tokens.record(e.usage.prompt_tokens, {**metric, "gen_ai.token.type": "input"})
            self.instruments.tokens.record(e.usage.completion_tokens, {**metric, "gen_ai.token.type": "output"})
            duration = e.duration_s if e.duration_s is not None else max(0.0, e.t - self._chat_t)
            self.instruments.duration.record(duration, metric)

    def _call(self, e: CallLine) -> None:
        old = self._tools.pop(e.tool_call_id, None)
        if old is not None:
            old.end(end_time=self._ns(e.t))
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": e.name,
            "gen_ai.tool.call.id": e.tool_call_id, "gen_ai.tool.type": "function",
            "gen_ai.tool.description": self._descriptions.get(e.name),
            "gen_ai.conversation.id": self.run_id, "loopfence.step": e.step,
            "loopfence.tool.decision": str(e.decision),
            # the canonical key holds the arguments: in full only with contents, else its digest
            "loopfence.tool.key_fingerprint": fingerprint(e.key) if e.key is not None else None,
            "loopfence.tool.kind": e.kind or self._kinds.get(e.name) or None,
            "loopfence.tool.reason": e.reason}
        if self.include_content:
            attrs["loopfence.tool.key"] = e.key
            args = e.arguments if e.arguments is not None else e.raw_arguments
            if args is None:  # large arguments are stored once, in the reply that brought them
                args = reply_arguments(self._reply_raw, e.tool_call_id)
            attrs["gen_ai.tool.call.arguments"] = args if isinstance(args, str) else \
                json.dumps(args, ensure_ascii=False) if args is not None else None
        span = self.tracer.start_span(f"execute_tool {e.name}", context=self._ctx, kind=SpanKind.INTERNAL,
                                      attributes=_clean(attrs), start_time=self._ns(e.t))
        self._tools[e.tool_call_id] = span
        for gate in self._gates.pop(e.tool_call_id, []):
            self._gate_on(span, gate)

    def _result(self, e: ResultLine) -> None:
        span = self._tools.pop(e.tool_call_id, None)
        if span is None:
            return
        attrs: dict[str, Any] = {"loopfence.tool.decision": str(e.decision), "loopfence.result.ok": e.ok,
                                 "loopfence.result.fingerprint": e.fingerprint,
                                 "loopfence.result.duration_s": e.duration_s,
                                 "loopfence.result.untrusted": e.untrusted,
                                 "loopfence.result.violation": e.violation}
        if self.include_content:
            attrs["gen_ai.tool.call.result"] = e.content
        span.set_attributes(_clean(attrs))
        if not e.ok:
            # a refusal's or a rejection's error is free text (a guard's words): the decision is its type
            kind = e.error or "tool_error" if e.decision in ("executed", "reused") else str(e.decision)
            span.set_attributes(_clean({"error.type": kind, "loopfence.result.error": e.error}))
            span.set_status(Status(StatusCode.ERROR, e.error or kind))
        span.end(end_time=self._ns(e.t))
        self._ended.add(e.tool_call_id)

    def _gate_on(self, span: Span, e: GateLine) -> None:
        span.add_event("loopfence.gate", _clean({
            "loopfence.gate.decision": str(e.decision), "loopfence.gate.reason": e.reason,
            "loopfence.gate.source": e.source, "loopfence.step": e.step, "gen_ai.tool.name": e.name,
            "gen_ai.tool.call.id": e.tool_call_id,
            "loopfence.gate.result": str(e.result) if e.result is not None else None}),
            timestamp=self._ns(e.t))
        if e.decision != "tainted":
            span.set_attribute("loopfence.gate.decision", str(e.decision))

    def _gate(self, e: GateLine) -> None:
        cid = e.tool_call_id
        if cid is not None and cid in self._tools:
            self._gate_on(self._tools[cid], e)
        elif cid is not None and cid not in self._ended and e.decision != "tainted":
            self._gates.setdefault(cid, []).append(e)  # the gate decides before the call is logged
        else:
            assert self.root is not None
            self._gate_on(self.root, e)

    def _resume(self, e: ResumeLine) -> None:
        assert self.root is not None
        if e.model:
            self._set_model(e.model)
        self.root.add_event("loopfence.resume", _clean({
            "loopfence.resume.after_line": e.after_line, "loopfence.resume.elapsed_s": e.elapsed_s,
            "loopfence.step": e.step, "loopfence.resume.torn_bytes": e.torn_bytes,
            "loopfence.resume.pending_intent": e.pending_intent}), timestamp=self._ns(e.t))

    def _close_chat(self, why: str, at: int) -> None:
        if self._chat is not None:
            self._chat.set_attribute("error.type", why)
            self._chat.set_status(Status(StatusCode.ERROR, why))
            self._chat.end(end_time=at)
            self._chat = None

    def _close_open(self, why: str, at: int) -> None:
        self._close_chat(why, at)
        for span in self._tools.values():
            span.set_attribute("error.type", why)
            span.set_status(Status(StatusCode.ERROR, why))
            span.end(end_time=at)
        self._tools.clear()
        assert self.root is not None
        for gates in self._gates.values():
            for gate in gates:
                self._gate_on(self.root, gate)
        self._gates.clear()

    def _stop(self, e: StopLine) -> None:
        root = self.root
        assert root is not None
        at = self._ns(e.t)
        self._close_open(str(e.reason), at)
        ledger = e.ledger
        attrs: dict[str, Any] = {
            "loopfence.stop.reason": str(e.reason), "loopfence.stop.detail": e.detail,
            "loopfence.verdict": str(e.verdict),
            "gen_ai.usage.input_tokens": ledger.get("prompt_tokens"),
            "gen_ai.usage.output_tokens": ledger.get("completion_tokens")}
        for name in ("model_requests", "tool_calls", "tool_executions", "reused", "refused", "rejected"):
            if isinstance(ledger.get(name), int):
                attrs[f"loopfence.ledger.{name}"] = ledger[name]
        if self.include_content:
            text = e.final_answer if e.final_answer is not None else e.partial_text
            if text is not None:
                attrs["gen_ai.output.messages"] = _messages([{"role": "assistant", "parts": [
                    {"type": "text", "content": text}], "finish_reason": str(e.reason)}])
        root.set_attributes(_clean(attrs))
        if str(e.verdict) != "SHIP":
            root.set_attribute("error.type", str(e.reason))
            root.set_status(Status(StatusCode.ERROR, f"{e.reason}: {e.detail}" if e.detail else str(e.reason)))
        root.end(end_time=at)
        self.done = True
        if self.instruments is not None:
            metric = _clean({"gen_ai.operation.name": "invoke_agent", **self._common})
            metric.pop("gen_ai.conversation.id", None)
            if str(e.verdict) != "SHIP":
                metric["error.type"] = str(e.reason)
            self.instruments.duration.record(max(0.0, e.t), metric)
