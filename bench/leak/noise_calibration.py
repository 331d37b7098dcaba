"""How well the trend test knows the noise: the z (slope over its standard error) of every span a
look tests on leak-free traces, before the rules that hold a flag back (#39).

Where the variogram-based standard error is right, z is standard normal: its spread 1 and its
upper tail at the normal's. The table gives, per shape and per span length, the spread and the
upper tail at z 2.33, 3.09 and 3.72 as a multiple of the normal's (1% / 0.1% / 0.01%); the spans'
thresholds over a run sit at z 3.1-4.1. Looks are every ``--step`` from 2 h on (the noise is then
judged at its own size, without the early looks' bars); a trace's looks share its data, so the
tails are those of a few traces: "traces" counts the traces with any z above 3.72.

    .venv/bin/python bench/leak/noise_calibration.py --seeds 20 --seed-offset 100 --jobs 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.leak.detection import SETS
from soakd.analysis.detector import Grid
from soakd.analysis.params import DetectorParams
from soakd.analysis.trend import upper_tail

DEFAULT_SHAPES = (
    "tuning:noise,tuning:wander,heldout:white,heldout:wander,fresh:wander_5,fresh:wander_10,fresh:sawtooth,"
    "week:ar1,week:jitter,week:wander,week:sawtooth"
)
TAILS = (2.33, 3.09, 3.72)
FROM = 2 * 3600.0  # seconds of trace before the first look counted


def one(args: tuple[str, str, int, float, float]) -> list[tuple[float, int, float]]:
    """(look's minute, span points, z) of every span tested on one trace."""
    which, shape, seed, hours, step = args
    tr = SETS[which].generate(shape, seed, duration=hours * 3600.0)
    p = DetectorParams()
    grid = Grid(tr.t, tr.v, p, float(tr.t[0]), float(tr.t[-1]))
    every = max(1, round(step / p.bin))
    looks = range(round(FROM / p.bin), grid.nbins + 1, every)
    return [(m * p.bin / 60.0, n, z) for m in looks for n, z in grid.span_z(m)]


def row(label: str, zs: list[float], traces: str = "") -> str:
    z = np.asarray(zs)
    tails = " ".join(f"{float(np.mean(z > q)) / upper_tail(q):7.1f}" for q in TAILS)
    return f"{label:<26}{z.size:>7}{float(np.std(z)):>7.2f} {tails}   {traces}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated SET:SHAPE (leak-free shapes)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seed-offset", type=int, default=100)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", type=float, default=900.0, help="seconds of trace between looks")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--worst", type=int, default=0, help="also list the N highest z: trace, look and span")
    ns = ap.parse_args()
    cases = [tuple(item.split(":", 1)) for item in ns.shapes.split(",") if item]
    for which, shape in cases:
        if which not in SETS or shape not in SETS[which].leak_free:
            ap.error(f"--shapes: {which}:{shape} is not a leak-free shape of a set ({', '.join(SETS)})")
    seeds = range(ns.seed_offset, ns.seed_offset + ns.seeds)
    work = [(which, shape, seed, ns.hours, ns.step) for which, shape in cases for seed in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(ns.jobs) as pool:
        results = list(pool.map(one, work))
    by_case: dict[str, list[float]] = defaultdict(list)
    by_span: dict[str, list[float]] = defaultdict(list)
    spans = DetectorParams().spans
    hot_case: dict[str, int] = defaultdict(int)
    for (which, shape, *_), got in zip(work, results, strict=True):
        key = f"{which}:{shape}"
        by_case[key] += [z for _, _, z in got]
        hot_case[key] += any(z > TAILS[-1] for _, _, z in got)
        for _, n, z in got:  # a span of the listed lengths, or the longest the data allow
            by_span[f"span {n}" if n in spans else "the longest span"].append(z)
    head = f"{'':<26}{'tests':>7}{'sd':>7} " + " ".join(f"  x@{q:<4}" for q in TAILS) + "   traces"
    looks = f"{ns.hours:g} h, a look every {ns.step:g} s"
    print(f"span z on leak-free traces, {ns.seeds} seeds from {ns.seed_offset}, {looks}")
    print("tails as multiples of the normal's: 1 = calibrated, below 1 = conservative\n")
    print(head)
    for key, zs in by_case.items():
        print(row(key, zs, f"{hot_case[key]}/{ns.seeds}"))
    print("\nper span length (points of 60 s), all shapes:")
    for label in sorted(by_span, key=lambda k: (len(k), k)):
        print(row(label, by_span[label]))
    if ns.worst:
        tests = [
            (z, f"{which}:{shape}#{seed}", at, n)
            for (which, shape, seed, *_), got in zip(work, results, strict=True)
            for at, n, z in got
        ]
        print(f"\nthe {ns.worst} highest z:")
        for z, trace, at, n in sorted(tests, reverse=True)[: ns.worst]:
            print(f"  z {z:6.1f}  {trace}, the look at {at:.0f} min, its {n}-point span")
    print(
        f"\nmedian |z| {statistics.median(abs(z) for zs in by_case.values() for z in zs):.2f}; "
        f"bench time {time.perf_counter() - t0:.0f} s on {ns.jobs} worker(s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
