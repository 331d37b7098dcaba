"""Pre-processing cost, measured (issue #5: production-like requests).

1. Per-core throughput of decode + resize + normalise (soakd's image preprocess) for JPEG and
   PNG at a few source resolutions, to the model's 224x224: images/s on one thread, and the
   scaling with two threads (Pillow releases the GIL while decoding).
2. Where end-to-end latency goes for builtin:convnet replaying image samples on CPU: the mean
   of each stage (preprocess, queue, inference, postprocess) as a share of the mean e2e.

    .venv/bin/python bench/preprocess.py [--seconds 2] [--soak-seconds 8] [--workers 2]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from soakd.config import load_config
from soakd.load.engine import Engine
from soakd.models.loader import load_model
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.preprocess import decode_image
from soakd.workload.sources import build_source

RESOLUTIONS = [(320, 240), (640, 480), (1280, 720), (1920, 1080)]
TARGET = (3, 224, 224)


def encoded(w: int, h: int, fmt: str) -> bytes:
    # A smooth gradient plus noise: compresses like a photo, not like pure noise or a flat fill.
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // max(1, w - 1), yy * 255 // max(1, h - 1), (xx + yy) % 256], -1)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def rate(data: bytes, seconds: float, threads: int) -> float:
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            decode_image(data, TARGET)
            counts[i] += 1

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def stage_shares(seconds: float, workers: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for i, (w, h) in enumerate(RESOLUTIONS * 3):
            Path(tmp, f"{i:02d}.jpg").write_bytes(encoded(w + i, h, "JPEG"))
        cfg = load_config(
            None,
            {
                "model.spec": "builtin:convnet",
                "model.device": "cpu",
                "input.samples": tmp,
                "input.preprocess_workers": workers,
                "load.concurrency": concurrency,
            },
        )
        model = load_model(cfg.model.spec, "cpu")
        source = build_source(cfg, model.default_shape, model.dtype)
        target = LocalModelTarget(model.fn, model.device)
        target.warm_up([t for _, t in source.warmup_inputs()], 5, cfg.batcher.max_batch_size, threading.Event())
        engine = Engine(target, source, cfg, Metrics())
        engine.start()
        time.sleep(seconds)
        engine.stop()
        stats = engine.stats()
    means = {s: h.mean() * 1e3 for s, h in stats.stages.items()}
    e2e = means["e2e"]
    print(
        f"\nbuiltin:convnet on CPU, JPEG samples {RESOLUTIONS[0][0]}x{RESOLUTIONS[0][1]}.."
        f"{RESOLUTIONS[-1][0]}x{RESOLUTIONS[-1][1]} -> 224x224, concurrency {concurrency}, "
        f"{workers} preprocess workers, torch threads {torch.get_num_threads()}"
    )
    mean_batch = engine.batch_size_summary()["mean"]
    print(f"  {stats.completed['ok'] / stats.elapsed:.1f} req/s; mean batch {mean_batch:.2f}")
    print(f"  {'stage':<12}{'mean ms':>10}{'share of e2e':>14}")
    for stage in ("preprocess", "queue", "inference", "postprocess"):
        print(f"  {stage:<12}{means[stage]:>10.2f}{means[stage] / e2e:>13.1%}")
    rest = e2e - sum(means[s] for s in ("preprocess", "queue", "inference", "postprocess"))
    print(f"  {'unaccounted':<12}{rest:>10.2f}{rest / e2e:>13.1%}")  # stages tile e2e: ~0
    print(f"  {'e2e':<12}{e2e:>10.2f}{1:>13.1%}")
    pool = engine.preprocess_pool
    if pool is not None:
        busy = pool.busy_seconds() / (stats.elapsed * workers)
        print(f"  preprocess pool busy {busy:.0%} of {workers} workers")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0, help="per throughput measurement")
    ap.add_argument("--soak-seconds", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    print(f"decode + resize to {TARGET[1]}x{TARGET[2]} + normalise, images/s")
    print(f"  {'source':<10}{'format':<7}{'KiB':>7}{'1 thread':>11}{'2 threads':>11}{'scaling':>9}")
    for w, h in RESOLUTIONS:
        for fmt in ("JPEG", "PNG"):
            data = encoded(w, h, fmt)
            one, two = rate(data, args.seconds, 1), rate(data, args.seconds, 2)
            print(f"  {w}x{h:<5}{fmt:<7}{len(data) / 1024:>7.0f}{one:>11.1f}{two:>11.1f}{two / one:>8.2f}x")
    stage_shares(args.soak_seconds, args.workers, args.concurrency)


if __name__ == "__main__":
    main()
