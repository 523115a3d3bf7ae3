"""`instrument()`: every run traced through the global (or a given) tracer and meter provider.

`instrument()` registers a run hook (loopfence._hooks): each run started afterwards gets a fresh
SpanRecorder of its own as its `on_event` (where the loop calls the hooks). `inst.on_event` is the
same thing as a callback to pass by hand, `run(..., on_event=inst.on_event)`: at each header it
starts a recorder for that run, in the run's context (contextvars), so concurrent runs never share
one. A run seen by both (hook and callback) is traced once.

Contents (task, system prompt, replies, tool arguments and results) are recorded only when asked:
`include_content=True`, or OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true.
"""

from __future__ import annotations

import os
import threading
import weakref
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from .._hooks import add_run_hook, remove_run_hook
from .._log._schema import HeaderLine, LogEvent
from ._spans import Instruments, SpanRecorder, make_instruments

__all__ = ["Instrumentation", "instrument", "configure", "CAPTURE_ENV", "SCOPE", "content_from_env"]

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SCOPE = "loopfence"


def content_from_env() -> bool:
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopfence")
    except PackageNotFoundError:  # pragma: no cover
        return "0"


class Instrumentation:
    """What `instrument()` returns. `recorder()` makes one run's callback; `on_event` dispatches
    to the current run's; `uninstrument()` stops tracing new runs."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None,
                 include_content: bool | None = None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.include_content = content_from_env() if include_content is None else include_content
        self._instruments: Instruments | None = None
        self._runs: dict[str, weakref.ref[SpanRecorder]] = {}
        self._lock = threading.Lock()
        self._current: ContextVar[SpanRecorder | None] = ContextVar(f"loopfence_otel_{id(self)}", default=None)
        self.hooked = False

    def _tracer(self) -> trace.Tracer:
        provider = self.tracer_provider or trace.get_tracer_provider()  # the global one, looked up per run
        return provider.get_tracer(SCOPE, _version())

    def _meter_instruments(self) -> Instruments:
        if self._instruments is None:  # the global provider's meters follow a provider set later
            provider = self.meter_provider or metrics.get_meter_provider()
            self._instruments = make_instruments(provider.get_meter(SCOPE, _version()))
        return self._instruments

    def _claim(self, run_id: str, recorder: SpanRecorder) -> bool:
        """One recorder per run: False when another live recorder already traces `run_id`."""
        with self._lock:
            for rid in [r for r, ref in self._runs.items() if (x := ref()) is None or x.done]:
                del self._runs[rid]
            held = self._runs.get(run_id)
            if held is not None and held() is not None and held() is not recorder:
                return False
            self._runs[run_id] = weakref.ref(recorder)
            return True

    def recorder(self, parent: otel_context.Context | None = None) -> SpanRecorder:
        """A fresh callback for one run; its spans go under `parent` (default: the current context)."""
        return SpanRecorder(self._tracer(), instruments=self._meter_instruments(),
                            include_content=self.include_content,
                            parent=parent if parent is not None else otel_context.get_current(),
                            claim=self._claim)

    def on_event(self, event: LogEvent) -> None:
        """An `on_event=` callback for any number of runs, one after another or at once."""
        if isinstance(event, HeaderLine):
            try:
                rec = self.recorder()
            except Exception:  # noqa: BLE001  (a provider that fails never breaks the run)
                rec = None
            self._current.set(rec)
        else:
            rec = self._current.get()  # type: ignore[assignment]
        if rec is not None:
            rec(event)

    def uninstrument(self) -> None:
        remove_run_hook(self.recorder)
        self.hooked = False


_lock = threading.Lock()
_active: Instrumentation | None = None


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None,
               include_content: bool | None = None) -> Instrumentation:
    """Trace every run started from now on: spans through `tracer_provider` (default: the global
    one, `opentelemetry.trace.set_tracer_provider`), GenAI metrics through `meter_provider` (default:
    the global one). A second call replaces the first. Returns the Instrumentation; its `on_event`
    may also be passed to `run(..., on_event=...)` by hand."""
    global _active
    with _lock:
        if _active is not None:
            _active.uninstrument()
        _active = Instrumentation(tracer_provider, meter_provider, include_content)
        add_run_hook(_active.recorder)
        _active.hooked = True
        return _active


def configure(service_name: str = "loopfence") -> Any:
    """Global SDK providers exporting over OTLP/HTTP as the standard OTEL_EXPORTER_OTLP_* variables
    say (endpoint, headers, timeout, …), for a command line's `--otel`. Returns a function that
    flushes and shuts them down. Leaves providers someone already set alone."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = MeterProvider(resource=resource, metric_readers=[
        PeriodicExportingMetricReader(OTLPMetricExporter())])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown
