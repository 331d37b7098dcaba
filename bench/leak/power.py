"""How long to soak to catch a leak of a given size: detection rate and median time to verdict
over leak rate x noise x run length, and false alarms over 24 h leak-free runs of every shape.

Traces are 10 s samples built from bench/leak/heldout_traces.py's pieces (the generator the
detector was not tuned on). A leak starts with the run (t = 0; the default 15 min warm-up
floor applies); a run of length L detects it when the first flag comes before L (verdicts
are causal, so one 24 h trace per seed serves all three lengths, and its replay stops at the
first flag). Looks every ``--step`` seconds (default 5 min; the live monitor looks every
minute, which can only flag sooner).

Noise: white (1 MiB jitter), wander N (Ornstein-Uhlenbeck level, sd N MiB, 30 min correlation
time, plus 0.3 MiB jitter), sawtooth (GC sawtooth 50 MiB every ~10 min, 0.3 MiB jitter).

    .venv/bin/python bench/leak/power.py --seeds 10 --jobs 2       # ~5 min on 2 shared cores
    .venv/bin/python bench/leak/power.py --seeds 3 --rates 5,20,100  # a quick look

It ends with the README's "how long to soak" table, made from the same runs.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.leak import heldout_traces as held
from soakd.analysis.params import DEFAULT_FLOOR_BYTES_PER_HOUR, MIB, DetectorParams
from soakd.analysis.replay import replay

HOUR = 3600.0
RATES = (1, 2, 5, 10, 20, 50, 100, 200)
NOISES = ("white", "wander2", "wander5", "wander10", "sawtooth")
LENGTHS = (2.0, 6.0, 24.0)
DT = 10.0


def noise(kind: str, seed: int, t: np.ndarray) -> np.ndarray:
    key = int.from_bytes(hashlib.blake2b(f"power/{kind}/{seed}".encode(), digest_size=8).digest(), "big")
    rng = np.random.default_rng(key)
    jitter = rng.standard_normal(t.size) * (1.0 if kind == "white" else 0.3) * MIB
    if kind == "white":
        return jitter + held.ou(rng, t.size, DT, 0.5 * MIB, 60.0)
    if kind.startswith("wander"):
        return jitter + held.ou(rng, t.size, DT, float(kind[6:]) * MIB, 30 * 60.0)
    if kind == "sawtooth":
        return jitter + held.gc_sawtooth(rng, t, 50 * MIB, 10 * 60.0)
    raise ValueError(kind)


def first_flag(args: tuple[str, float, int, float, DetectorParams, float]) -> tuple[str, float, int, float | None]:
    kind, rate, seed, hours, params, step = args
    t = np.arange(0.0, hours * HOUR, DT)
    v = 2e9 + rate * MIB * t / HOUR + noise(kind, seed, t)
    r = replay(t, v, params, DEFAULT_FLOOR_BYTES_PER_HOUR, step=step, stop_on_flag=True)
    return kind, rate, seed, r.first_suspected_at


def free_run(args: tuple[str, int, float, DetectorParams, float]) -> tuple[str, int, bool]:
    shape, seed, hours, params, step = args
    if shape in held.LEAK_FREE:
        h = held.generate(shape, 1000 + seed, duration=hours * HOUR)
        t, v = h.t, h.v
    else:
        t = np.arange(0.0, hours * HOUR, DT)
        v = 2e9 + noise(shape.removeprefix("noise:"), 1000 + seed, t)
    r = replay(t, v, params, DEFAULT_FLOOR_BYTES_PER_HOUR, step=step, stop_on_flag=True)
    return shape, seed, r.first_suspected_at is not None


def _minutes(seconds: float) -> str:
    m = round(seconds / 60)
    return f"{m} min" if m < 60 else f"{m // 60} h {m % 60:02d}"


def readme_table(
    flags: list[tuple[str, float, int, float | None]], rates: list[float], noises: list[str], lengths: list[float]
) -> list[str]:
    """The README's table: per leak rate and noise, the shortest soak in which at least 7 of 8
    traces are flagged, and in brackets the median time from leak start to those verdicts."""
    names = [k.replace("wander", "wander ") for k in noises]
    out = ["| MiB/h | " + " | ".join(names) + " |", "|---|" + "---|" * len(noises)]
    for r in rates:
        cells = []
        for k in noises:
            got = [f for (kk, rr, _, f) in flags if kk == k and rr == r]
            cell = "-"
            for h in lengths:
                hit = [f for f in got if f is not None and f <= h * HOUR]
                if got and len(hit) >= 7 / 8 * len(got):
                    cell = f"{h:g} h ({_minutes(statistics.median(hit))})"
                    break
            cells.append(cell)
        out.append(f"| {r:g} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="traces per cell")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--step", type=float, default=300.0, help="seconds between looks")
    ap.add_argument("--rates", default=",".join(map(str, RATES)), help="MiB/h")
    ap.add_argument("--noises", default=",".join(NOISES))
    ap.add_argument("--lengths", default=",".join(f"{x:g}" for x in LENGTHS), help="hours")
    ap.add_argument("--free-seeds", type=int, default=None, help="leak-free 24 h runs per shape (default --seeds)")
    ns = ap.parse_args()
    params = DetectorParams()
    rates = [float(x) for x in ns.rates.split(",") if x]
    noises = [x for x in ns.noises.split(",") if x]
    lengths = [float(x) for x in ns.lengths.split(",") if x]
    longest = max(lengths)
    t0 = time.perf_counter()
    work = [(k, r, s, longest, params, ns.step) for k in noises for r in rates for s in range(ns.seeds)]
    free_shapes = [*held.LEAK_FREE, *(f"noise:{k}" for k in noises)]
    fseeds = ns.seeds if ns.free_seeds is None else ns.free_seeds
    fwork = [(sh, s, 24.0, params, ns.step) for sh in free_shapes for s in range(fseeds)]
    with ProcessPoolExecutor(ns.jobs) as pool:
        flags = list(pool.map(first_flag, work, chunksize=2))
        frees = list(pool.map(free_run, fwork, chunksize=2))
    elapsed = time.perf_counter() - t0

    print(
        f"leak power: {ns.seeds} traces per cell, 10 s samples, a look every {ns.step / 60:.0f} min, "
        f"default [leak] settings (warm-up floor {params.warmup / 60:.0f} min, alpha {params.alpha} per 24 h, "
        f"floor 2 MiB/h)"
    )
    print("cell: detected share / median minutes from leak start to verdict (- : none detected)\n")
    head = "| MiB/h | noise | " + " | ".join(f"{h:g} h" for h in lengths) + " |"
    print(head)
    print("|" + "---|" * (2 + len(lengths)))
    for r in rates:
        for k in noises:
            cells = []
            got = [f for (kk, rr, _, f) in flags if kk == k and rr == r]
            for h in lengths:
                hit = [f for f in got if f is not None and f <= h * HOUR]
                med = f"{statistics.median(hit) / 60:.0f}" if hit else "-"
                cells.append(f"{100 * len(hit) / len(got):.0f}% / {med}")
            print(f"| {r:g} | {k} | " + " | ".join(cells) + " |")
    print("\nfalse alarms, flagged at any moment of a 24 h leak-free run:")
    print("| shape | runs | flagged |")
    print("|---|---|---|")
    for sh in free_shapes:
        rows = [x for x in frees if x[0] == sh]
        print(f"| {sh} | {len(rows)} | {sum(x[2] for x in rows)} |")
    total = sum(x[2] for x in frees)
    print(f"| all | {len(frees)} | {total} ({100 * total / max(1, len(frees)):.1f}%) |")
    print("\nthe README's table: the shortest soak that flags at least 7 of 8 traces (median time to verdict)")
    print("\n".join(readme_table(flags, rates, noises, sorted(lengths))))
    print(f"\nbench time {elapsed:.0f} s on {ns.jobs} worker(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
