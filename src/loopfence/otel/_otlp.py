"""A recorded log -> the spans a live run gives (the same SpanRecorder), as OTLP/JSON or sent over
OTLP/HTTP (protobuf) to a collector."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from .._json import dumps
from .._log._reader import RunLogFile, read_log
from ._instrument import SCOPE, _version
from ._spans import SpanRecorder

__all__ = ["spans_from_log", "to_otlp_json", "write_otlp_json", "send_spans", "traces_url"]

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4,
          SpanKind.CONSUMER: 5}
_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def spans_from_log(path: str | os.PathLike[str] | RunLogFile, *, tracer_provider: Any = None,
                   include_content: bool = False) -> list[ReadableSpan]:
    """The spans of a recorded run (read strictly: LogError for a damaged log). With
    `tracer_provider` they also go through its processors; the list is what was made here."""
    log = path if isinstance(path, RunLogFile) else read_log(path)
    memory = InMemorySpanExporter()
    provider = tracer_provider
    if provider is None:
        provider = TracerProvider(resource=Resource.create(
            {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or "loopfence"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    recorder = SpanRecorder(provider.get_tracer(SCOPE, _version()), include_content=include_content)
    for event in log.all_events:
        recorder(event)
        if recorder.error is not None:
            raise recorder.error
    recorder.finish()
    return list(memory.get_finished_spans())


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # int64 as a JSON string (the protobuf JSON mapping)
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attributes(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in (attrs or {}).items()]


def _span(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    assert ctx is not None
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}", "name": s.name,
        "kind": _KINDS.get(s.kind, 1), "startTimeUnixNano": str(s.start_time or 0),
        "endTimeUnixNano": str(s.end_time or 0), "attributes": _attributes(s.attributes),
        "events": [{"timeUnixNano": str(e.timestamp), "name": e.name, "attributes": _attributes(e.attributes)}
                   for e in s.events],
        "status": {"code": _STATUS[s.status.status_code],
                   **({"message": s.status.description} if s.status.description else {})}}
    if s.parent is not None:
        out["parentSpanId"] = f"{s.parent.span_id:016x}"
    return out


def to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """An OTLP/JSON ExportTraceServiceRequest (`resourceSpans`), as a collector's /v1/traces takes
    it or an OTLP file exporter writes it: ids in hex, 64-bit integers as strings."""
    groups: dict[tuple[int, tuple[str, str]], tuple[Any, Any, list[dict[str, Any]]]] = {}
    for s in spans:
        scope = s.instrumentation_scope
        key = (id(s.resource), (scope.name if scope else "", scope.version or "" if scope else ""))
        groups.setdefault(key, (s.resource, scope, []))[2].append(_span(s))
    by_resource: dict[int, dict[str, Any]] = {}
    for (rid, _), (resource, scope, items) in groups.items():
        entry = by_resource.setdefault(rid, {"resource": {"attributes": _attributes(resource.attributes)},
                                             "scopeSpans": []})
        entry["scopeSpans"].append({"scope": {"name": scope.name if scope else "",
                                              **({"version": scope.version} if scope and scope.version else {})},
                                    "spans": items})
    return {"resourceSpans": list(by_resource.values())}


def traces_url(endpoint: str) -> str:
    """A collector's address -> its traces URL: `http://host:4318` gets `/v1/traces`; a URL with a
    path is taken as it is."""
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"--endpoint {endpoint!r}: expected an http:// or https:// URL")
    return endpoint.rstrip("/") + "/v1/traces" if url.path in ("", "/") else endpoint


def send_spans(spans: Sequence[ReadableSpan], endpoint: str | None = None, *, timeout: float | None = None) -> bool:
    """Send over OTLP/HTTP (protobuf). `endpoint=None`: where OTEL_EXPORTER_OTLP_TRACES_ENDPOINT /
    OTEL_EXPORTER_OTLP_ENDPOINT say (headers, timeout and compression from the same variables)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint) if endpoint else None, timeout=timeout)
    try:
        return exporter.export(list(spans)) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


def write_otlp_json(spans: Sequence[ReadableSpan], path: str | os.PathLike[str]) -> None:
    """Write finished spans to `path` as one OTLP/JSON document (`ExportTraceServiceRequest`)."""
    Path(path).write_text(dumps(to_otlp_json(spans)) + "\n", encoding="utf-8")
