"""Is "no leak above X" true? soakd's printed detectable slope against its own power (#39).

A look that finds nothing prints the smallest leak it would have caught with 90% probability at
the noise it measured (``Judgement.detectable_bytes_per_hour``). That is a claim about soakd
itself, and it can be checked: take a leak-free trace's noise (a replica: the trace's own
parameters, another noise stream), read the printed slope X off it, add a linear leak of X from
the run's start and judge the same look again. Over many replicas an honest X is caught about
90% of the time. Fewer means the claim is optimistic (a user reads "no leak above 3 MiB/h" where
a 3 MiB/h leak is missed most of the time); caught nearly always even at half of X means it is
over-cautious. Each replica is judged against its own printed X, so the estimate's own scatter
is part of what is checked.

    .venv/bin/python bench/leak/honesty.py --corpus week --seeds 4 --replicas 20 --jobs 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.leak import fresh_traces as fresh
from bench.leak import oracle
from bench.leak import week_traces as week
from soakd.analysis.detector import judge
from soakd.analysis.params import DEFAULT_FLOOR_BYTES_PER_HOUR, MIB, DetectorParams

H = 3600.0
SHARES = (0.5, 1.0)  # leaks at these multiples of the printed slope
SETS = {"week": tuple(week.LEAK_FREE), "fresh": tuple(fresh.LEAK_FREE)}


def _noise(corpus: str, shape: str, seed: int, replica: int, hours: float) -> tuple[np.ndarray, np.ndarray]:
    """(times, leak-free bytes) of replica ``replica`` of (shape, seed)."""
    if corpus == "week":
        return week.times(hours * H), week.noise(shape, seed, replica, duration=hours * H)
    v = oracle.build(shape, seed, hours=hours, replica=replica).noise
    return np.arange(v.size) * oracle.INTERVAL, v


def one(args: tuple[str, str, int, int, float]) -> tuple[str, list[float], list[list[bool]]]:
    """(shape, printed slopes in MiB/h, per replica whether each share of it was caught)."""
    corpus, shape, seed, replicas, hours = args
    params = DetectorParams()
    printed, caught = [], []
    for r in range(replicas):
        t, v = _noise(corpus, shape, seed, r, hours)
        x = judge(t, v, params, DEFAULT_FLOOR_BYTES_PER_HOUR).detectable_bytes_per_hour
        if not np.isfinite(x):
            continue  # not judged: nothing was claimed
        printed.append(x / MIB)
        caught.append([judge(t, v + f * x * t / H, params, DEFAULT_FLOOR_BYTES_PER_HOUR).positive for f in SHARES])
    return shape, printed, caught


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=tuple(SETS), default="week")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seed-offset", type=int, default=0)
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--jobs", type=int, default=2)
    ns = ap.parse_args()
    work = [
        (ns.corpus, shape, seed, ns.replicas, ns.hours)
        for shape in SETS[ns.corpus]
        for seed in range(ns.seed_offset, ns.seed_offset + ns.seeds)
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(ns.jobs) as pool:
        rows = list(pool.map(one, work))
    print(
        f"{ns.corpus}: {ns.seeds} traces x {ns.replicas} replicas per shape, {ns.hours:g} h; a linear leak at a "
        "share of each replica's own printed detectable slope, judged at the same look"
    )
    print(f"{'shape':<16}{'printed (median)':>18}{'caught at 0.5x':>16}{'at 1x':>8}   (honest: about 90% at 1x)")
    total = [0, 0]
    for shape in SETS[ns.corpus]:
        printed = [x for s, xs, _ in rows if s == shape for x in xs]
        caught = np.array([c for s, _, cs in rows if s == shape for c in cs], dtype=bool).reshape(-1, len(SHARES))
        if not printed:
            print(f"{shape:<16}{'never judged':>18}")
            continue
        total[0] += int(caught[:, 1].sum())
        total[1] += len(caught)
        share = caught.mean(axis=0)
        print(f"{shape:<16}{statistics.median(printed):>12.2f} MiB/h{100 * share[0]:>15.0f}%{100 * share[1]:>7.0f}%")
    print(f"all shapes: caught at 1x {100 * total[0] / max(1, total[1]):.1f}% of {total[1]} replicas")
    print(f"bench time {time.perf_counter() - t0:.0f} s on {ns.jobs} worker(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
