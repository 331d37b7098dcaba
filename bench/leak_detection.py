"""Leak verdict quality on a synthetic corpus: false alarms and detections per pattern.

Every trace (6 h at 10 s, see soakd/analysis/corpus.py) is judged as the live monitor would
judge it: every 10 min of trace, with persistence. A leak-free trace is a false alarm if the
verdict is suspected at the end ("final") or ever flipped to suspected during the run
("ever", what an operator watching the alert would have seen). A leaking trace counts as
detected when the verdict is suspected at the end; time to verdict is from the leak's start
to the first flip after it.

The baseline row is the straightforward method: Mann-Kendall (no autocorrelation correction,
two-sided 5%) plus a positive Theil-Sen slope on 15-minute minima over the last 3 h after the
same warm-up, with no persistence and no floor.

    .venv/bin/python bench/leak_detection.py --seeds 100 --jobs 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymannkendall as mk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soakd.analysis.corpus import LEAK_FREE, LEAKING, PATTERNS, generate
from soakd.analysis.detector import DEFAULT_FLOOR_BYTES_PER_HOUR, DetectorParams, replay
from soakd.analysis.trend import troughs


@dataclass
class Outcome:
    pattern: str
    seed: int
    leaking: bool
    final: bool
    ever: bool
    time_to_verdict: float | None  # seconds from leak start
    base_final: bool
    base_ever: bool


def baseline_positive(t: np.ndarray, v: np.ndarray, now: float, params: DetectorParams) -> bool:
    start = max(float(t[0]) + params.warmup, now - 3 * 3600.0)
    sel = (t >= start) & (t <= now)
    if now - start < params.min_span:
        return False
    _, y = troughs(t[sel], v[sel], 900.0, end=now)
    if y.size < 4:
        return False
    res = mk.original_test(y, alpha=0.05)
    return bool(res.trend == "increasing" and res.slope > 0)


def judge_one(args: tuple[str, int, DetectorParams, float, float]) -> Outcome:
    pattern, seed, params, step, floor = args
    tr = generate(pattern, seed)
    r = replay(tr.t, tr.v, params, floor, step=step)
    ttv = None
    if tr.leaking and r.suspected:
        start = tr.leak_start or 0.0
        ups = [at for at, up in r.flips if up and at >= start]
        ttv = (ups[0] - start) if ups else 0.0
    times = np.arange(float(tr.t[0]) + params.warmup + params.min_span, float(tr.t[-1]), step)
    times = np.append(times, tr.t[-1])
    base = [baseline_positive(tr.t, tr.v, float(now), params) for now in times]
    return Outcome(pattern, seed, tr.leaking, r.suspected, bool(r.flips and any(up for _, up in r.flips)),
                   ttv, base[-1], any(base))


def pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:6.1f}%" if n else "     -"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100, help="traces per pattern")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--step", type=float, default=600.0, help="seconds of trace between evaluations")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a DetectorParams field (seconds), e.g. --set persistence=2700")
    ap.add_argument("--floor", type=float, default=DEFAULT_FLOOR_BYTES_PER_HOUR, help="bytes/hour")
    ns = ap.parse_args()
    params = DetectorParams(**{k: float(v) for k, v in (item.split("=", 1) for item in ns.set)})
    patterns = [p for p in ns.patterns.split(",") if p]
    work = [(p, s, params, ns.step, ns.floor) for p in patterns for s in range(ns.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(ns.jobs) as pool:
        outcomes = list(pool.map(judge_one, work, chunksize=8))
    elapsed = time.perf_counter() - t0

    by: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by[o.pattern].append(o)
    print(f"leak detection: {len(outcomes)} traces (6 h, 10 s), {ns.seeds} per pattern, judged every "
          f"{ns.step / 60:.0f} min; params {params}, floor {ns.floor / 2**20:.1f} MiB/h")
    print(f"{'pattern':<16}{'kind':<10}{'soakd final':>12}{'soakd ever':>12}{'median ttv':>12}"
          f"{'base final':>12}{'base ever':>12}")
    def rate(rows: list[Outcome], attr: str) -> str:
        return pct(sum(bool(getattr(o, attr)) for o in rows), len(rows))

    for p in patterns:
        rows = by[p]
        kind = "leak" if p in LEAKING else "leak-free"
        ttvs = [o.time_to_verdict for o in rows if o.time_to_verdict is not None]
        med = f"{statistics.median(ttvs) / 60:8.0f} min" if ttvs else "           -"
        print(f"{p:<16}{kind:<10}{rate(rows, 'final'):>12}{rate(rows, 'ever'):>12}{med:>12}"
              f"{rate(rows, 'base_final'):>12}{rate(rows, 'base_ever'):>12}")
    free = [o for o in outcomes if o.pattern in LEAK_FREE]
    leak = [o for o in outcomes if o.pattern in LEAKING]
    ttvs = [o.time_to_verdict for o in leak if o.time_to_verdict is not None]
    print()
    if free:
        worst = max((p for p in patterns if p in LEAK_FREE), key=lambda p: sum(o.ever for o in by[p]))
        print(f"false alarms (leak-free, n={len(free)}): soakd final {rate(free, 'final')}, ever "
              f"{rate(free, 'ever')} (worst pattern {worst}: {rate(by[worst], 'ever')}); "
              f"baseline final {rate(free, 'base_final')}, ever {rate(free, 'base_ever')}")
    if leak:
        med = statistics.median(ttvs) / 60 if ttvs else math.nan
        worst = min((p for p in patterns if p in LEAKING), key=lambda p: sum(o.final for o in by[p]))
        print(f"detection (leaking, n={len(leak)}): soakd {rate(leak, 'final')} (worst pattern {worst}: "
              f"{rate(by[worst], 'final')}), median time to verdict {med:.0f} min; "
              f"baseline {rate(leak, 'base_final')}")
    print(f"bench time {elapsed:.1f} s on {ns.jobs} worker(s)")
    misses = [o for o in outcomes if o.final != o.leaking]
    if misses:
        print("wrong at end:", ", ".join(f"{o.pattern}#{o.seed}" for o in misses[:40]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
