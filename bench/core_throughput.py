"""Core benchmarks, measured side by side in one process (issue: soakd core).

1. Harness overhead: soakd's sustained throughput vs the same model's offline loop at the same
   batch size (goal: >= 0.95 of offline).
2. Driver ceiling on builtin:noop with large batches (goal: >= 50,000 requests/s on 2 cores).
3. Open-loop accuracy at 2,000 requests/s Poisson (goal: achieved rate within 1%, lag p99 < 1 ms).
4. The seed article's harness on the same model, as the baseline row.

    .venv/bin/python bench/core_throughput.py [--seconds 10] [--device auto]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import torch

from bench.seed_harness import LocalInferenceBenchmarker
from soakd.config import load_config
from soakd.load.engine import Engine
from soakd.models.loader import load_model
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.shapes import ShapeSource


def soak(spec: str, device: str, shapes: str, seconds: float, **ov: Any) -> tuple[Engine, float]:
    overrides = {
        "model.spec": spec,
        "model.device": device,
        "input.shapes": shapes,
        **{k.replace("__", "."): str(v) for k, v in ov.items()},
    }
    cfg = load_config(None, overrides)
    model = load_model(spec, device)
    source = ShapeSource(shapes, pool=cfg.input.pool)
    target = LocalModelTarget(model.fn, model.device, instances=cfg.batcher.instances)
    target.warm_up([t for _, t in source.warmup_inputs()], 20, cfg.batcher.max_batch_size, threading.Event())
    engine = Engine(target, source, cfg, Metrics())
    engine.start()
    time.sleep(seconds)
    engine.stop()
    stats = engine.stats()
    return engine, stats.completed["ok"] / stats.elapsed


def offline_loop(spec: str, device: str, shape: tuple[int, ...], batch: int, seconds: float) -> float:
    model = load_model(spec, device)
    x = torch.randn(batch, *shape, device=model.device)
    with torch.inference_mode():
        for _ in range(20):
            model.fn(x)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            model.fn(x)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            n += batch
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    s = args.seconds
    print(f"device={dev} torch={torch.__version__} threads={torch.get_num_threads()}  ({s:.0f} s per row)")

    # 1. Harness overhead on the builtin convnet (smaller images on CPU so a row takes seconds).
    shape = (3, 224, 224) if dev.startswith("cuda") else (3, 64, 64)
    shapes = "x".join(map(str, shape))
    batch = 8
    # Alternate the two, three rounds each, and compare medians: a shared machine drifts.
    offlines, onlines = [], []
    for _ in range(3):
        offlines.append(offline_loop("builtin:convnet", dev, shape, batch, s / 3))
        engine, rps = soak(
            "builtin:convnet",
            dev,
            shapes,
            s / 3,
            load__concurrency=2 * batch,
            batcher__max_batch_size=batch,
            batcher__max_queue_delay_ms=5,
        )
        onlines.append(rps)
    offline, online = statistics.median(offlines), statistics.median(onlines)
    print("\n1. harness overhead, builtin:convnet", shapes, f"batch {batch} (median of 3 alternating rounds)")
    print(f"   offline loop          {offline:10.1f} req/s   rounds {', '.join(f'{v:.0f}' for v in offlines)}")
    print(
        f"   soakd closed loop     {online:10.1f} req/s   rounds {', '.join(f'{v:.0f}' for v in onlines)}"
        f"   mean batch {engine.batch_size_summary()['mean']:.2f}"
    )
    print(f"   ratio soakd/offline   {online / offline:10.3f}   (goal >= 0.95)")

    # 2. Driver ceiling.
    engine, ceiling = soak(
        "builtin:noop",
        dev,
        "16",
        s,
        load__concurrency=4096,
        batcher__max_batch_size=1024,
        batcher__max_queue_delay_ms=1,
    )
    print("\n2. driver ceiling, builtin:noop, concurrency 4096, max batch 1024")
    print(f"   soakd                 {ceiling:10.1f} req/s   mean batch {engine.batch_size_summary()['mean']:.1f}")
    print(f"   ratio to goal 50k     {ceiling / 50_000:10.3f}   (goal >= 1.0)")

    # 3. Open-loop accuracy.
    rate = 2000.0
    engine, _ = soak(
        "builtin:noop",
        dev,
        "16",
        s,
        load__rate=rate,
        load__arrival="poisson",
        batcher__max_batch_size=64,
        batcher__max_queue_delay_ms=1,
    )
    st = engine.stats()
    sent = st.completed["ok"] + st.completed["dropped"] + st.completed["error"]
    achieved = sent / (engine.last_completion - engine.started_at)
    lag = st.lag
    print(f"\n3. open loop, Poisson {rate:.0f} req/s, builtin:noop")
    print(f"   achieved rate         {achieved:10.1f} req/s   ratio {achieved / rate:.4f}  (goal within 1%)")
    print(
        f"   schedule lag p50/p99  {lag.percentile(0.5) * 1e3:10.3f} / {lag.percentile(0.99) * 1e3:.3f} ms"
        f"   max {lag.maximum * 1e3:.3f} ms  (goal p99 < 1 ms)"
    )
    print(f"   e2e p99               {st.stages['e2e'].percentile(0.99) * 1e3:10.3f} ms")

    # 4. The seed harness on the same convnet and shape, same concurrency, batch size 1 as it runs.
    model = load_model("builtin:convnet", dev)
    seed = LocalInferenceBenchmarker(model.fn, (1, *shape), warmup_runs=20, device=dev)
    per_thread = max(20, int(offline * s / 16 / 2))
    res = seed.run_stress_test([8], requests_per_thread=per_thread)[8]
    print("\n4. seed harness vs soakd, builtin:convnet", shapes, "concurrency 8")
    print(
        f"   seed harness (8 threads, batch 1)   {res['qps']:8.1f} req/s   p50 {res['p50_ms']:.2f} ms"
        f"  p99 {res['p99_ms']:.2f} ms  (model call only: no queue)"
    )
    rows = (
        ("soakd 8 instances, batch 1", 8, 1),
        ("soakd 1 instance, batch<=8", 1, 8),
        ("soakd 2 instances, batch<=4", 2, 4),
    )
    for label, instances, max_batch in rows:
        engine, rps = soak(
            "builtin:convnet",
            dev,
            shapes,
            s,
            load__concurrency=8,
            batcher__max_batch_size=max_batch,
            batcher__max_queue_delay_ms=2,
            batcher__instances=instances,
        )
        e2e = engine.stats().stages["e2e"]
        print(
            f"   {label:<35} {rps:8.1f} req/s   p50 {e2e.percentile(0.5) * 1e3:.2f} ms"
            f"  p99 {e2e.percentile(0.99) * 1e3:.2f} ms  (e2e incl. queue)   ratio to seed {rps / res['qps']:.3f}"
        )


if __name__ == "__main__":
    main()
