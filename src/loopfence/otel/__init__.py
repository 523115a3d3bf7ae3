"""OpenTelemetry GenAI spans and metrics for loopfence runs (`pip install 'loopfence[otel]'`).

    import loopfence
    inst = loopfence.instrument()            # the global tracer/meter providers
    loopfence.run(..., on_event=inst.on_event)

Spans are built from the run's typed events (loopfence._log._schema), so a recorded log gives
the same spans afterwards: `spans_from_log(path)`, `loopfence export LOG --format otlp`.
"""

try:
    import opentelemetry.sdk  # noqa: F401
except ImportError as exc:  # pragma: no cover
    raise ImportError("loopfence.otel needs OpenTelemetry: pip install 'loopfence[otel]'") from exc

from ._instrument import CAPTURE_ENV, Instrumentation, configure, instrument
from ._otlp import send_spans, spans_from_log, to_otlp_json, traces_url, write_otlp_json
from ._spans import SpanRecorder

__all__ = ["CAPTURE_ENV", "Instrumentation", "SpanRecorder", "configure", "instrument", "send_spans",
           "spans_from_log", "to_otlp_json", "traces_url", "write_otlp_json"]
