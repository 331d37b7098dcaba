"""Faults a soak must survive and count: model exceptions, out-of-memory, slow and hung inference."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from soakd.config import load_config
from soakd.load.engine import Engine
from soakd.models.loader import load_model
from soakd.run.health import Health
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.shapes import ShapeSource
from tests.conftest import wait_for


def start_engine(spec: str, options: dict[str, Any], **overrides: Any) -> tuple[Engine, Metrics]:
    ov = {k.replace("__", "."): v for k, v in overrides.items()}
    cfg = load_config(None, {"model.spec": spec, "model.device": "cpu", "input.shapes": "16", **ov})
    model = load_model(spec, "cpu", options=options)
    metrics = Metrics()
    engine = Engine(LocalModelTarget(model.fn, model.device), ShapeSource("16"), cfg, metrics)
    engine.start()
    return engine, metrics


def test_errors_and_ooms_are_counted_and_the_run_goes_on(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """builtin:flaky raises errors and torch.OutOfMemoryError; the run completes (exit 0 with the
    error gate opened by `[slo] max_error_ratio = 1.0`) with each outcome counted, and most
    requests still succeed."""
    cfg = tmp_path / "soak.toml"
    cfg.write_text("[model.options]\nerror_every = 5\noom_every = 7\nafter = 2\n[slo]\nmax_error_ratio = 1.0\n")
    out = tmp_path / "summary.json"
    d = daemon_factory(
        "--config",
        str(cfg),
        "--model",
        "builtin:flaky",
        "--warmup",
        "2",
        "--concurrency",
        "2",
        "--max-batch-size",
        "1",
        "--duration",
        "2s",
        "--summary-json",
        str(out),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert d.proc.wait(120) == 0, d.output()
    req = json.loads(out.read_text())["requests"]
    assert req["error"] > 0 and req["oom"] > 0
    assert req["ok"] > 2 * (req["error"] + req["oom"])
    # One log line per kind of failure, not one per failure.
    assert d.output().count("model raised OutOfMemoryError") == 1
    assert d.output().count("model raised RuntimeError") == 1


def test_slow_batches_count_as_timeouts_with_their_latency() -> None:
    """Batches slower than batcher.inference_timeout are outcome=timeout, still in the latency histograms."""
    engine, _ = start_engine(
        "builtin:sleep",
        {"batch_ms": 0.0, "stall_every": 2, "stall_ms": 30.0},
        load__concurrency=1,
        batcher__inference_timeout="10ms",
    )
    try:
        wait_for(
            lambda: min(engine.stats().completed["timeout"], engine.stats().completed["ok"]) >= 5,
            30,
            what="both ok and timeout outcomes",
        )
    finally:
        assert engine.stop(drain_timeout=10)
    stats = engine.stats()
    assert stats.completed["error"] == 0
    assert stats.stages["e2e"].count == stats.completed["ok"] + stats.completed["timeout"]
    assert stats.stages["inference"].maximum >= 0.03


def test_a_hung_model_makes_the_engine_unhealthy_and_the_drain_is_bounded() -> None:
    """After builtin:hang stops answering, health reports a stall; stop() gives up after its drain bound."""
    engine, metrics = start_engine("builtin:hang", {"after": 20}, load__concurrency=2)
    health = Health(metrics, stall_timeout=0.3, sampler_stale_after=60)
    health.engine = engine
    wait_for(lambda: not health()[0], 30, what="a stall to be reported")
    ok, reason = health()
    assert not ok and "stalled" in reason and "in flight" in reason
    t0 = time.monotonic()
    assert engine.stop(drain_timeout=0.3) is False
    assert time.monotonic() - t0 < 5


def test_a_stale_sampler_makes_the_daemon_unhealthy() -> None:
    """A sampler whose last success is older than the limit (a stuck driver call) fails the health check."""
    metrics = Metrics()
    health = Health(metrics, stall_timeout=60, sampler_stale_after=30)
    engine, _ = start_engine("builtin:noop", {}, load__concurrency=1)
    try:
        health.engine = engine
        metrics.collector_last_success.labels("host").set(time.time())
        assert health() == (True, "ok")
        metrics.collector_last_success.labels("nvml").set(time.time() - 120)
        ok, reason = health()
        assert not ok and "nvml" in reason and "host" not in reason
    finally:
        engine.stop(drain_timeout=5)
