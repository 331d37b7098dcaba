"""A real `soakd run` on this CPU host, scraped over HTTP: host telemetry present and plausible,
absent GPU sources reported down once, and a model that keeps memory shows RSS growing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.conftest import metric_value, wait_for

LEAKY_MODEL = """
import time

def make():
    kept = []

    def forward(x):
        kept.append(b"x" * 65536)  # written, so the pages are resident
        time.sleep(0.004)
        return x

    return forward
"""


def _number(text: str, name: str, labels: str = "") -> float:
    v = metric_value(text, name, labels)
    assert v is not None, f"{name}{{{labels}}} missing"
    return v


def test_cpu_run_exports_host_telemetry_and_rss_growth(daemon_factory: Any, tmp_path: Path) -> None:
    """Host sources up, GPU sources down with one log line each, RSS rising under a leaky model."""
    model = tmp_path / "leaky.py"
    model.write_text(LEAKY_MODEL)
    d = daemon_factory(
        "--model",
        f"python:{model}:make",
        "--input-shapes",
        "16",
        "--concurrency",
        "1",
        "--max-batch-size",
        "1",
        "--warmup",
        "2",
        "--duration",
        "30s",
        "--memory-interval",
        "0.25s",
    )
    d.wait_ready()
    wait_for(
        lambda: metric_value(d.metrics(), "soakd_collector_up", 'source="host"') == 1, 20, what="host collector up"
    )
    first = d.metrics()
    t_first = time.monotonic()

    for source in ("host", "host_uss", "malloc", "gc"):
        assert _number(first, "soakd_collector_up", f'source="{source}"') == 1, source
        assert _number(first, "soakd_collector_last_success_timestamp_seconds", f'source="{source}"') > 1e9
    assert _number(first, "soakd_collector_up", 'source="nvml"') == 0
    assert _number(first, "soakd_collector_up", 'source="torch_cuda"') == 0

    rss = _number(first, "soakd_process_resident_memory_bytes")
    uss = _number(first, "soakd_process_unique_memory_bytes")
    available = _number(first, "soakd_host_memory_available_bytes")
    assert 30e6 < rss < 16e9  # torch alone is tens of MB
    assert 0 < uss <= rss
    assert 0 < available < 1 << 50
    assert _number(first, "soakd_process_threads") >= 3
    assert _number(first, "soakd_process_open_fds") >= 3
    assert _number(first, "soakd_process_cpu_seconds_total") > 0
    assert _number(first, "soakd_malloc_in_use_bytes") > 0
    assert _number(first, "soakd_python_gc_collections_total", 'generation="0"') >= 0

    # ~250 batches/s x 64 KiB: about 16 MB/s kept by the model.
    def grown() -> bool:
        now = d.metrics()
        return (
            _number(now, "soakd_process_resident_memory_bytes") > rss + 8e6
            and _number(now, "soakd_malloc_in_use_bytes") > _number(first, "soakd_malloc_in_use_bytes") + 8e6
        )

    wait_for(grown, 20, 0.25, "RSS and malloc in-use to grow")
    assert time.monotonic() - t_first < 20

    assert d.stop() == 0
    out = d.log.read_text()
    assert out.count("telemetry source nvml unavailable") == 1, out
    assert out.count("telemetry source torch_cuda unavailable") == 1, out
    assert "Traceback" not in out


def test_config_switches_optional_sources(tmp_path: Path) -> None:
    """memory.tracemalloc adds the tracemalloc source (stopped again at the end); a snapshot
    interval adds the snapshot job, absent on a CPU model like the other CUDA source."""
    import tracemalloc

    import torch

    from soakd.config import load_config
    from soakd.telemetry.catalogue import Metrics
    from soakd.telemetry.pipeline import Telemetry, run_samplers
    from soakd.telemetry.series import SeriesStore

    cfg = load_config(
        None,
        {
            "model.spec": "builtin:noop",
            "memory.interval": "0.1s",
            "memory.tracemalloc": "true",
            "memory.snapshot_interval": "0.2s",
            "otel.enabled": "false",
        },
    )
    metrics, series = Metrics(), SeriesStore(100)
    telemetry = Telemetry(cfg, metrics, run_samplers(cfg, metrics, series, torch.device("cpu")))
    telemetry.start()
    try:
        wait_for(lambda: telemetry.scheduler.states()["tracemalloc"] == "up", 10, 0.05, "tracemalloc up")
        wait_for(lambda: series.read("host_rss")[0].size >= 3, 10, 0.05, "three RSS samples")
    finally:
        telemetry.stop()
    states = telemetry.scheduler.states()
    assert states["torch_cuda_snapshot"] == "absent" and states["torch_cuda"] == "absent"
    traced = metrics.registry.get_sample_value("soakd_tracemalloc_traced_bytes")
    assert traced is not None and traced > 0
    assert not tracemalloc.is_tracing()
    assert telemetry.batch_hook is None  # OTel off: the engine's hot path pays a None check only
