"""OTLP/HTTP push: a real receiver on 127.0.0.1 decodes what soakd sends with opentelemetry-proto."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.otlp import RegistryBridge, build_resource
from soakd.telemetry.otlp_env import otlp_wanted
from tests.conftest import free_port, wait_for


class Receiver:
    """A minimal OTLP/HTTP (protobuf) collector: keeps every decoded request."""

    def __init__(self) -> None:
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.traces: list[ExportTraceServiceRequest] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                reply: Any
                if self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                    reply = ExportMetricsServiceResponse()
                elif self.path == "/v1/traces":
                    receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                    reply = ExportTraceServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metric_names(self) -> set[str]:
        return {
            m.name for req in self.metrics for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }

    def find(self, name: str) -> Any:
        for req in reversed(self.metrics):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == name:
                            return m
        return None

    def resource(self) -> dict[str, Any]:
        attrs = self.metrics[-1].resource_metrics[0].resource.attributes
        return {a.key: a.value.string_value or a.value.int_value for a in attrs}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_bridge_pushes_registry_families_with_soakd_names(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gauges, counters and histograms from the Prometheus registry arrive with their values."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    monkeypatch.setenv("OTEL_SERVICE_NAME", "soak-staging")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    m = Metrics()
    m.process_rss.set(123456789)
    m.cuda_fragmentation.labels("cuda:0", "inactive_split").set(0.25)
    m.requests.add("ok", 42)
    m.gc_pause.labels("2").observe(0.003)
    m.gc_pause.labels("2").observe(0.2)
    m.request_duration.labels("e2e").observe_many([0.001, 0.002, 0.004])
    bridge = RegistryBridge(
        m.registry,
        build_resource({"soakd.run_id": "r1"}),
        60,
        OTLPMetricExporter(endpoint=receiver.url + "/v1/metrics"),
    )
    assert bridge.export_once()
    bridge.stop()

    rss = receiver.find("soakd_process_resident_memory_bytes")
    assert rss.unit == "By" and rss.gauge.data_points[0].as_double == 123456789
    frag = receiver.find("soakd_torch_cuda_fragmentation_ratio")
    attrs = {a.key: a.value.string_value for a in frag.gauge.data_points[0].attributes}
    assert attrs == {"device": "cuda:0", "kind": "inactive_split"}
    req = receiver.find("soakd_requests_total")
    assert req.sum.is_monotonic and req.sum.aggregation_temporality == 2  # cumulative
    ok = [p for p in req.sum.data_points if p.attributes[0].value.string_value == "ok"]
    assert ok[0].as_double == 42
    pause = receiver.find("soakd_python_gc_pause_seconds")
    point = next(p for p in pause.histogram.data_points if p.attributes[0].value.string_value == "2")
    assert point.count == 2 and point.sum == pytest.approx(0.203)
    assert len(point.bucket_counts) == len(point.explicit_bounds) + 1
    assert sum(point.bucket_counts) == 2 and not point.HasField("min")
    e2e = receiver.find("soakd_request_duration_seconds")
    assert e2e.histogram.data_points[0].count == 3
    res = receiver.resource()
    assert res["service.name"] == "soak-staging"
    assert res["deployment.environment"] == "staging"
    assert res["soakd.run_id"] == "r1" and res["host.name"]


def test_otlp_switch_follows_config_and_standard_variables() -> None:
    """On with an endpoint variable or otel.enabled = true; off with enabled = false or OTEL_SDK_DISABLED."""
    assert otlp_wanted(None, {}) == (False, False)
    assert otlp_wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == (True, True)
    assert otlp_wanted(None, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c/v1/metrics"}) == (True, False)
    assert otlp_wanted(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces"}) == (False, True)
    assert otlp_wanted(True, {}) == (True, True)
    assert otlp_wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == (False, False)
    assert otlp_wanted(True, {"OTEL_SDK_DISABLED": "true"}) == (False, False)


def test_default_service_name_is_soakd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without OTEL_SERVICE_NAME the service is called soakd, not unknown_service."""
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    res: Resource = build_resource({})
    assert res.attributes["service.name"] == "soakd"


def test_daemon_pushes_metrics_and_batch_spans(daemon_factory: Any, receiver: Receiver, tmp_path: Path) -> None:
    """`soakd run` with OTEL_EXPORTER_OTLP_ENDPOINT pushes soakd's metrics and sampled batch spans."""
    cfg = tmp_path / "otel.toml"
    cfg.write_text('[otel]\nexport_interval = "0.5s"\ntrace_sample_ratio = 1.0\n')
    d = daemon_factory(
        "--config",
        str(cfg),
        "--model",
        "builtin:noop",
        "--warmup",
        "2",
        "--duration",
        "30s",
        "--memory-interval",
        "0.25s",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "soakd-ci",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
    d.wait_ready()
    wanted = {
        "soakd_process_resident_memory_bytes",
        "soakd_requests_total",
        "soakd_collector_up",
        "soakd_request_duration_seconds",
        "soakd_malloc_in_use_bytes",
    }
    wait_for(lambda: wanted <= receiver.metric_names(), 30, 0.2, "soakd metrics at the receiver")
    wait_for(lambda: receiver.traces, 30, 0.2, "batch spans at the receiver")
    assert receiver.resource()["service.name"] == "soakd-ci"
    spans = [s for req in receiver.traces for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert spans and all(s.name == "batch" for s in spans)
    assert all(s.end_time_unix_nano >= s.start_time_unix_nano > 0 for s in spans)
    assert d.stop() == 0


def test_unreachable_collector_is_logged_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    """Failed exports to a closed port: the exporter's warnings and errors pass once, then are held."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from soakd.telemetry.otlp import RepeatFilter

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    flt = RepeatFilter(period=600)
    flt.install()
    caplog.set_level(logging.INFO)
    try:
        bridge = RegistryBridge(
            Metrics().registry, build_resource({}), 60, OTLPMetricExporter(endpoint=url + "/v1/metrics", timeout=0.5)
        )
        results = [bridge.export_once() for _ in range(3)]
    finally:
        flt.remove()
    assert results == [False, False, False] and bridge.failures == 3
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert 1 <= len(sdk) <= 2  # one per level (a warning and an error), not two per export
    ours = [r for r in caplog.records if r.name == "soakd.otlp"]
    assert len(ours) == 1
