"""The engine driving a real model in-process: closed and open loop, drops, and honest latency."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from soakd.config import load_config
from soakd.load.engine import Engine
from soakd.models.loader import load_model
from soakd.request import Request
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.shapes import ShapeSource
from tests.conftest import wait_for


def run_engine(
    seconds: float,
    spec: str = "builtin:noop",
    options: dict[str, Any] | None = None,
    shapes: str = "16",
    **overrides: Any,
) -> Engine:
    ov = {k.replace("__", "."): v for k, v in overrides.items()}
    cfg = load_config(None, {"model.spec": spec, "model.device": "cpu", "input.shapes": shapes, **ov})
    cfg.model.options = options or {}
    model = load_model(cfg.model.spec, "cpu", options=cfg.model.options)
    engine = Engine(
        LocalModelTarget(model.fn, model.device, instances=cfg.batcher.instances), ShapeSource(shapes), cfg, Metrics()
    )
    engine.start()
    time.sleep(seconds)
    assert engine.stop(drain_timeout=10.0), "engine did not drain"
    return engine


def test_closed_loop_fills_batches() -> None:
    """With more requests in flight than the batch size, batches run full and all requests succeed."""
    engine = run_engine(1.0, load__concurrency=64, batcher__max_batch_size=16, batcher__max_queue_delay_ms=5)
    stats = engine.stats()
    assert stats.completed["ok"] > 1000
    assert stats.completed["error"] == 0
    assert engine.batch_size_summary()["mean"] > 12
    assert stats.inflight == 0
    assert stats.stages["e2e"].count == stats.completed["ok"]


def test_batch_of_one_hands_the_model_the_same_tensors_every_time() -> None:
    """At batch 1 on the CPU the model gets one of the pool's pre-made batch-of-one views every call,
    never a view made per request (a small malloc on the model thread per call, which with glibc moves
    where the model's own heap is trimmed: docs/model-threads.md)."""
    seen: list[torch.Tensor] = []

    def record(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)  # kept alive: a view made per call could not reuse an id
        return x

    cfg = load_config(
        None,
        {"model.device": "cpu", "input.shapes": "3x8x8", "input.pool": 4, "load.concurrency": 2},
    )
    cfg.batcher.max_batch_size = 1
    source = ShapeSource("3x8x8", pool=4)
    engine = Engine(LocalModelTarget(record, torch.device("cpu")), source, cfg, Metrics())
    engine.start()
    wait_for(lambda: len(seen) > 50, timeout=30, interval=0.01, what="50 model calls")
    assert engine.stop(drain_timeout=10.0)
    assert len({id(x) for x in seen}) == 4
    assert {x.data_ptr() for x in seen} == {t.data_ptr() for t in source.pooled()}


def test_model_instances_share_the_load() -> None:
    """Several model instances run batches side by side: a sleeping model's throughput scales with them."""
    one = run_engine(
        1.0, spec="builtin:sleep", options={"batch_ms": 20.0}, load__concurrency=8, batcher__max_batch_size=1
    )
    four = run_engine(
        1.0,
        spec="builtin:sleep",
        options={"batch_ms": 20.0},
        load__concurrency=8,
        batcher__max_batch_size=1,
        batcher__instances=4,
    )
    assert four.stats().completed["ok"] > 2.5 * one.stats().completed["ok"]
    assert four.stats().inflight == 0


def test_closed_loop_keeps_exactly_n_in_flight() -> None:
    """Closed loop with N=3 at batch 1: whenever the model is called, exactly 3 requests are in
    flight (one in the model, two queued: each completion is replaced before the next batch);
    with N=1 the batcher never has a second request to batch."""
    seen: list[int] = []
    holder: list[Engine] = []

    def count(x: torch.Tensor) -> torch.Tensor:
        if holder:
            seen.append(holder[0].inflight)
        return x

    cfg = load_config(None, {"model.device": "cpu", "input.shapes": "4", "load.concurrency": 3})
    cfg.batcher.max_batch_size = 1
    engine = Engine(LocalModelTarget(count, torch.device("cpu")), ShapeSource("4"), cfg, Metrics())
    holder.append(engine)
    engine.start()
    wait_for(lambda: len(seen) > 100, timeout=30, interval=0.01, what="100 model calls")
    assert engine.stop(drain_timeout=10.0)
    # The last two calls are the drain's: stop() sends nothing new, so 2 then 1 remain.
    assert seen[-2:] == [2, 1]
    assert set(seen[:-2]) == {3}, sorted(set(seen))
    one = run_engine(0.5, load__concurrency=1, batcher__max_batch_size=8)
    assert one.batch_size_summary()["max"] == 1


def test_open_loop_sends_at_the_configured_rate() -> None:
    """A constant-rate open loop sends close to rate x duration requests, whatever the model does."""
    engine = run_engine(2.0, spec="builtin:sleep", options={"batch_ms": 2.0}, load__rate=400, load__arrival="constant")
    stats = engine.stats()
    sent = stats.completed["ok"] + stats.completed["dropped"]
    assert 0.9 * 800 <= sent <= 1.1 * 800
    assert stats.lag.count == sent


def test_open_loop_drops_beyond_the_inflight_cap() -> None:
    """When the model cannot keep up, open loop drops (and counts) requests instead of slowing down."""
    engine = run_engine(
        1.5,
        spec="builtin:sleep",
        options={"batch_ms": 50.0},
        load__rate=300,
        load__max_inflight=4,
        batcher__max_batch_size=1,
    )
    stats = engine.stats()
    assert stats.completed["dropped"] > 100
    assert stats.completed["ok"] < 60


def test_open_loop_latency_counts_from_the_intended_start() -> None:
    """A model that stalls now and then: open-loop e2e p90 shows the stalls, the model's own time does not.

    Requests scheduled during a stall wait behind it; counting from their intended start (not from
    when the engine got round to them) is what puts the stall into their latency.
    """
    engine = run_engine(
        4.0,
        spec="builtin:sleep",
        options={"batch_ms": 1.0, "stall_every": 60, "stall_ms": 400.0},
        load__rate=200,
        load__arrival="constant",
        batcher__max_batch_size=8,
        batcher__max_queue_delay_ms=0,
    )
    stats = engine.stats()
    e2e, inference = stats.stages["e2e"], stats.stages["inference"]
    assert inference.percentile(0.9) < 0.02
    assert e2e.percentile(0.9) > 0.1
    assert e2e.maximum >= 0.35


def test_model_errors_are_counted_and_the_soak_goes_on() -> None:
    """A model that raises counts outcome=error per request and keeps running."""
    calls = {"n": 0}

    def flaky(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise ValueError("bad batch")
        return x

    cfg = load_config(
        None,
        {"model.spec": "builtin:noop", "input.shapes": "4", "load.concurrency": "2", "batcher.max_batch_size": "1"},
    )
    engine = Engine(LocalModelTarget(flaky, torch.device("cpu")), ShapeSource("4"), cfg, Metrics())
    engine.start()
    wait_for(lambda: engine.stats().completed["error"] > 10, timeout=30, interval=0.01, what="10 errors")
    engine.stop()
    stats = engine.stats()
    assert stats.completed["ok"] == pytest.approx(2 * stats.completed["error"], rel=0.1)


def test_scrape_shows_batch_sizes_and_queue_depth() -> None:
    """/metrics' soakd_batch_size buckets and count describe the batches the summary reports, and
    soakd_queue_depth is read at scrape time: requests waiting in the batcher, 0 once drained."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    engine = run_engine(1.0, load__concurrency=12, batcher__max_batch_size=8, batcher__max_queue_delay_ms=2)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(engine.metrics.registry).decode())}
    samples = {(s.name, s.labels.get("le", "")): s.value for s in families["soakd_batch_size"].samples}
    summary = engine.batch_size_summary()
    assert samples[("soakd_batch_size_count", "")] == summary["batches"] > 100
    assert samples[("soakd_batch_size_bucket", "+Inf")] == summary["batches"]
    # Every batch holds 1 to 8 requests; with 12 in flight, not all of them hold one.
    assert samples[("soakd_batch_size_bucket", "8.0")] == summary["batches"]
    assert samples[("soakd_batch_size_bucket", "1.0")] < summary["batches"]
    assert samples[("soakd_batch_size_sum", "")] == engine.stats().completed["ok"]
    assert [s.value for s in families["soakd_queue_depth"].samples] == [0.0]
    now = time.perf_counter()
    engine.batcher.put(Request(now, now, "16", torch.zeros(16)))  # the engine has stopped: it stays queued
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(engine.metrics.registry).decode())}
    assert [s.value for s in families["soakd_queue_depth"].samples] == [1.0]
