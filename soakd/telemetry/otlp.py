"""OTLP push (http/protobuf) of the measurements soakd already keeps in its Prometheus registry,
and sampled per-batch spans.

The hot path records once, through prometheus_client (~0.6 µs an observation against ~5 µs for
an OpenTelemetry instrument). The bridge reads the registry's ``collect()`` on the export
interval and converts each family into OpenTelemetry SDK metric data (gauge -> Gauge,
counter -> cumulative monotonic Sum, histogram -> cumulative Histogram with the same bucket
bounds), then hands it to the SDK's ``OTLPMetricExporter``. Endpoint, headers, timeout,
compression and resource attributes come from the standard ``OTEL_*`` variables, which the
SDK reads itself.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry

import soakd

SHUTDOWN_DEADLINE_S = 2.0  # each OTLP step at exit; with the drain, exit stays under 15 s by default
log = logging.getLogger("soakd.otlp")


# The exporters log every failed export (two lines each, every export interval): a collector down
# for a day would flood the journal. Their loggers get a filter that lets one record per logger
# and level through per period.
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk.trace.export",
)


class RepeatFilter(logging.Filter):
    """Passes one record per (logger, level) per ``period`` seconds."""

    def __init__(self, period: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.period = period
        self.clock = clock
        self._last: dict[tuple[str, int], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = (record.name, record.levelno), self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.period:
            return False
        self._last[key] = now
        if isinstance(record.msg, str):
            record.msg += f" (repeats suppressed for {self.period:.0f}s)"
        return True

    def install(self) -> None:
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self)


_UNITS = (
    ("_bytes", "By"),
    ("_seconds", "s"),
    ("_ratio", "1"),
    ("_hertz", "Hz"),
    ("_watts", "W"),
    ("_joules", "J"),
    ("_celsius", "Cel"),
)


def build_resource(extra: Mapping[str, Any]) -> Resource:
    """soakd's host/GPU attributes, overridden by OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME."""
    env = Resource.create()  # the SDK's detectors, including the OTEL_* variables
    if str(env.attributes.get("service.name", "")).startswith("unknown_service"):
        env = env.merge(Resource({"service.name": "soakd"}))
    ours: dict[str, Any] = {
        "service.version": soakd.__version__,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    ours.update({k: v for k, v in extra.items() if v is not None and v != ""})
    return Resource(ours).merge(env)


def _unit(name: str) -> str:
    base = name.removesuffix("_total")
    for suffix, unit in _UNITS:
        if base.endswith(suffix):
            return unit
    return "1"


def registry_to_metrics(registry: CollectorRegistry, start_ns: int, now_ns: int) -> list[Metric]:
    """Convert the registry's families (gauge, counter, histogram) to OTel SDK metric data."""
    out: list[Metric] = []
    for family in registry.collect():
        if family.type in ("gauge", "info", "stateset"):
            points = [
                NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value)
                for s in family.samples
                if not math.isnan(s.value)
            ]
            if points:
                out.append(Metric(family.name, family.documentation, _unit(family.name), Gauge(points)))
        elif family.type == "counter":
            points = [
                NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value)
                for s in family.samples
                if s.name.endswith("_total")
            ]
            if points:
                out.append(
                    Metric(
                        family.name + "_total",
                        family.documentation,
                        _unit(family.name),
                        Sum(points, AggregationTemporality.CUMULATIVE, True),
                    )
                )
        elif family.type == "histogram":
            hist = _histogram_points(family.samples, family.name, start_ns, now_ns)
            if hist:
                out.append(
                    Metric(
                        family.name,
                        family.documentation,
                        _unit(family.name),
                        Histogram(hist, AggregationTemporality.CUMULATIVE),
                    )
                )
    return out


def _histogram_points(samples: Iterable[Any], name: str, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        entry = series.setdefault(tuple(sorted(labels.items())), {"labels": labels, "le": [], "sum": 0.0})
        if s.name == name + "_bucket":
            entry["le"].append((float(s.labels["le"]), s.value))
        elif s.name == name + "_sum":
            entry["sum"] = s.value
    points = []
    for entry in series.values():
        les = sorted(entry["le"])
        if not les:
            continue
        cumulative = [int(c) for _, c in les]
        counts = [cumulative[0]] + [b - a for a, b in itertools.pairwise(cumulative)]
        bounds = [le for le, _ in les if not math.isinf(le)]
        # Prometheus histograms carry no min/max; None leaves the optional OTLP fields unset.
        points.append(
            HistogramDataPoint(
                entry["labels"],
                start_ns,
                now_ns,
                cumulative[-1],
                entry["sum"],
                counts,
                bounds,
                cast(float, None),
                cast(float, None),
            )
        )
    return points


class RegistryBridge:
    """Exports the registry over OTLP every ``interval`` seconds from its own thread."""

    def __init__(
        self, registry: CollectorRegistry, resource: Resource, interval: float, exporter: MetricExporter | None = None
    ) -> None:
        if exporter is None:
            # The HTTP exporter pulls in requests and protobuf: only when no exporter is injected.
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter()
        self.registry = registry
        self.resource = resource
        self.interval = interval
        self.exporter = exporter
        self.scope = InstrumentationScope("soakd", soakd.__version__)
        self.start_ns = time.time_ns()
        self.exports = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soakd-otlp", daemon=True)

    def collect(self) -> MetricsData:
        metrics = registry_to_metrics(self.registry, self.start_ns, time.time_ns())
        return MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(self.scope, metrics, "")], "")])

    def export_once(self) -> bool:
        try:
            ok = self.exporter.export(self.collect()) == MetricExportResult.SUCCESS
        except Exception as exc:  # an unreachable collector must not end the soak
            log.debug("OTLP metrics export raised: %s", exc)
            ok = False
        if ok:
            self.exports += 1
        else:
            self.failures += 1
            if self.failures == 1:
                log.warning("OTLP metrics export failed; retrying every %.0fs (logged once)", self.interval)
        return ok

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.export_once()

    def stop(self) -> None:
        """Stop the timer and push one last export so the run's end is not lost; an unreachable
        collector gets ``SHUTDOWN_DEADLINE_S`` in all, not the exporter's retries."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=SHUTDOWN_DEADLINE_S)
            _bounded(self.export_once, SHUTDOWN_DEADLINE_S, "last OTLP metrics export")
        _bounded(self.exporter.shutdown, 1.0, "OTLP metrics exporter shutdown")


class BatchTracer:
    """Per-batch spans, sampled at ``ratio`` before any OpenTelemetry call so the unsampled batch
    costs one random draw. Times arrive on the engine's perf_counter clock and are mapped to
    unix nanoseconds by one offset taken at start."""

    def __init__(self, resource: Resource, ratio: float, exporter: SpanExporter | None = None) -> None:
        if exporter is None:
            # As above: the HTTP exporter only when none is injected.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("soakd", soakd.__version__)
        self.ratio = ratio
        self._random = random.Random().random
        self._offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)

    def __call__(self, size: int, t_dispatch: float, t_end: float, outcome: str) -> None:
        if self._random() >= self.ratio:
            return
        span = self.tracer.start_span(
            "batch",
            start_time=self._offset_ns + int(t_dispatch * 1e9),
            attributes={"soakd.batch_size": size, "soakd.outcome": outcome},
        )
        span.end(end_time=self._offset_ns + int(t_end * 1e9))

    def shutdown(self) -> None:
        _bounded(self.provider.shutdown, SHUTDOWN_DEADLINE_S, "OTLP span flush")


def _bounded(fn: Callable[[], object], seconds: float, what: str) -> None:
    """Run ``fn`` on a daemon thread and wait at most ``seconds``: exits have a deadline."""
    t = threading.Thread(target=fn, name="soakd-otlp-shutdown", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        log.warning("%s abandoned after %.0fs (collector unreachable?)", what, seconds)
