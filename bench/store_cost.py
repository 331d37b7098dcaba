"""State store cost and size (issue #6: a daemon you can leave running for days).

1. Write cost per memory sample: the caller's enqueue (on the sampler thread) and the writer's
   commit, per sample, in batches as the writer commits them.
2. Write cost per window: encoding one window's histograms (e2e, queue, inference) and upserting
   the row, as the writer does at every flush.
3. State size after a simulated 7-day soak: the real store, a synthetic clock, 10 memory series
   every 10 s, one window row per minute (upserted every 2 s as in a live run), a few events an
   hour, maintenance (downsampling, retention) every simulated 10 minutes. Goal: < 200 MB.

    .venv/bin/python bench/store_cost.py [--days 7] [--series 10] [--interval 10]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from soakd.state import DB_NAME, StateStore, WindowRow
from soakd.telemetry.histogram import HistSnapshot, LogHistogram


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def window_hists(rng: np.random.Generator, n: int) -> dict[str, HistSnapshot]:
    """A minute at ~1,000 requests/s: log-normal latencies with a tail, per stage."""
    out = {}
    for stage, median in (("e2e", 0.004), ("queue", 0.001), ("inference", 0.003)):
        h = LogHistogram()
        tail = rng.uniform(0.02, 0.2, n // 200)
        h.observe_many(np.concatenate([rng.lognormal(np.log(median), 0.4, n), tail]))
        out[stage] = h.snapshot()
    return out


def cost_per_sample(tmp: Path, n: int = 200_000) -> tuple[float, float]:
    store = StateStore(tmp / "samples")
    store.begin_segment("bench", None)
    t0 = time.perf_counter()
    for i in range(n):
        store.add_sample("bench", "host_rss", 1e9 + i, 1e9 + i)
        if (i + 1) % 10_000 == 0:  # the queue holds what a flush interval brings; commit as the writer does
            store.flush()
    t1 = time.perf_counter()
    enqueue_only = StateStore(tmp / "enqueue")
    t2 = time.perf_counter()
    for i in range(min(n, 40_000)):
        enqueue_only.add_sample("bench", "host_rss", 1e9 + i, 1e9 + i)
    t3 = time.perf_counter()
    store.close()
    return (t1 - t0) / n * 1e6, (t3 - t2) / min(n, 40_000) * 1e6


def cost_per_window(tmp: Path, n: int = 2_000) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    hists = window_hists(rng, 60_000)
    store = StateStore(tmp / "windows")
    seg = store.begin_segment("bench", None)
    latest: dict[str, WindowRow] = {}
    store.window_source = lambda: (seg, "bench", latest["row"])
    t0 = time.perf_counter()
    for i in range(n):
        latest["row"] = WindowRow(60.0 * (i // 30), 60.0 * (i // 30) + 2 * (i % 30), {"ok": 60_000}, hists)
        store.flush()  # one upsert of the open window per flush, as live
    t1 = time.perf_counter()
    store.close()
    sparse = sum(len(h.to_sparse()["i"]) for h in hists.values())
    return (t1 - t0) / n * 1e6, sparse


def simulate(tmp: Path, days: float, series: int, interval: float) -> dict[str, float]:
    rng = np.random.default_rng(1)
    pool = [window_hists(rng, 60_000) for _ in range(20)]
    start = 1_800_000_000.0
    clock = Clock(start)
    store = StateStore(tmp / "sim", clock=clock, retention=30 * 86400.0)
    seg = store.begin_segment("week", {"model": "builtin:convnet"})
    names = [f"series_{k}" for k in range(series)]
    t, end = start, start + days * 86400.0
    minute = 0
    wall0 = time.perf_counter()
    while t < end:
        # One simulated minute: samples, the window's upserts every 2 s, sometimes an event.
        for s in range(int(60 / interval)):
            for k, name in enumerate(names):
                store.add_sample("week", name, t + s * interval, 1e9 + k * 1e6 + rng.normal(0, 1e5))
        row = WindowRow(t, t + 60.0, {"ok": 60_000, "error": int(rng.poisson(0.2))}, pool[minute % len(pool)])
        store.write_window(seg, "week", row)
        if minute % 20 == 0:
            store.add_event("week", seg, "phase", "steady -> probe" if minute % 40 else "probe -> steady")
        t += 60.0
        minute += 1
        clock.t = t
        store.flush()
        if minute % 10 == 0:
            store.maintain()
    store.maintain()
    store.close()
    conn = sqlite3.connect(tmp / "sim" / DB_NAME)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    counts = {
        tbl: conn.execute(f"SELECT COUNT(*) FROM {tbl}").fetchone()[0] for tbl in ("samples", "windows", "events")
    }
    conn.close()
    size = sum(p.stat().st_size for p in (tmp / "sim").glob(DB_NAME + "*"))
    return {"bytes": size, "wall_s": time.perf_counter() - wall0, **counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--series", type=int, default=10)
    ap.add_argument("--interval", type=float, default=10.0, help="memory sample interval, seconds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        per_sample, enqueue = cost_per_sample(tmp)
        print(f"memory sample: {enqueue:.2f} µs to enqueue (sampler thread), {per_sample:.2f} µs enqueue+commit")
        per_window, bins = cost_per_window(tmp)
        print(
            f"window row (3 stages, {bins:.0f} non-empty buckets): {per_window:.0f} µs per upsert "
            f"(writer thread, every flush interval)"
        )
        res = simulate(tmp, args.days, args.series, args.interval)
        written = args.days * 86400 / args.interval * args.series
        print(
            f"simulated {args.days:g} days ({written:,.0f} samples, {args.days * 1440:,.0f} windows) in "
            f"{res['wall_s']:.0f} s: state {res['bytes'] / 2**20:.1f} MiB (goal < 200 MB); rows kept: "
            f"samples {res['samples']:,}, windows {res['windows']:,}, events {res['events']:,}"
        )


if __name__ == "__main__":
    main()
