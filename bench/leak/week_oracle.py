"""The one-look oracle on the week set (bench/leak/week_traces.py), and the detectable slope it
implies, next to what soakd finds and prints on the same traces (#39).

Per trace, the oracle is told the noise law (R replicas of the trace's own leak-free part: same
parameters, other noise streams) and the leak's start, and looks once at the end: the
least-squares slope from max(leak start, 15 min) to the end, on the raw samples and on 60 s bin
minima (the better per shape), against the replicas' 99th percentile (1% false alarms). Power of
a trace: the share of replicas whose noise plus the trace's own leak clears that threshold.

Its 90%-power slope (for a linear leak from the warm-up floor on): the threshold minus the
replicas' 10th percentile, on leak-free shapes' traces; soakd's printed detectable slope at the
end of the same trace (``Judgement.detectable_bytes_per_hour``) is shown beside it.

    .venv/bin/python bench/leak/week_oracle.py --seeds 10 --replicas 100 [--hours 6]
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

from bench.leak import week_traces as week
from soakd.analysis.detector import judge
from soakd.analysis.params import DEFAULT_FLOOR_BYTES_PER_HOUR, MIB, DetectorParams

H = 3600.0
SKIP = 900.0  # soakd's warm-up floor
BIN = 60.0


def _slopes(t: np.ndarray, v: np.ndarray, since: float) -> tuple[float, float]:
    """(raw, troughs) least-squares slopes in bytes/hour from ``since`` on."""
    keep = t >= since
    tt, vv = t[keep], v[keep]
    raw = float(np.polyfit(tt / H, vv, 1)[0])
    k = (tt - tt[0]) // BIN
    nb = int(k[-1]) + 1
    mins = np.full(nb, np.inf)
    np.minimum.at(mins, k.astype(np.int64), vv)
    tb = tt[0] / H + (np.arange(nb) + 0.5) * BIN / H
    return raw, float(np.polyfit(tb, mins, 1)[0])


def one(args: tuple[str, int, int, float]) -> dict[str, object]:
    shape, seed, replicas, hours = args
    dur = hours * H
    t = week.times(dur)
    leak, start, _ = week.leak_part(shape, seed, duration=dur)
    since = max(SKIP, start or 0.0)
    null = np.array([_slopes(t, week.noise(shape, seed, r, duration=dur), since) for r in range(replicas)])
    thr = np.quantile(null, 0.99, axis=0)
    out: dict[str, object] = {"shape": shape, "seed": seed, "leaking": shape in week.LEAKING}
    if shape in week.LEAKING:
        lk = np.array([_slopes(t, week.noise(shape, seed, r, duration=dur) + leak, since) for r in range(replicas)])
        out["power"] = (lk > thr).mean(axis=0).tolist()  # per statistic
    else:
        # linear leak from the floor on: its slope adds exactly; 90% power at thr - q10
        s90 = thr - np.quantile(null, 0.10, axis=0)
        tr = week.generate(shape, seed, duration=dur)
        j = judge(tr.t, tr.v, DetectorParams(), DEFAULT_FLOOR_BYTES_PER_HOUR)
        out["s90"] = s90.tolist()
        out["detectable"] = j.detectable_bytes_per_hour
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seed-offset", type=int, default=0, help="first seed (bench/leak/detection.py's --seed-offset)")
    ns = ap.parse_args()
    work = [
        (s, seed, ns.replicas, ns.hours)
        for s in week.SHAPES
        for seed in range(ns.seed_offset, ns.seed_offset + ns.seeds)
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(ns.jobs) as pool:
        rows = list(pool.map(one, work))
    print(f"week oracle: {ns.seeds} traces per shape of {ns.hours:g} h, {ns.replicas} replicas, one look at 1%")
    print(f"{'shape':<16}{'oracle raw':>12}{'troughs':>10}{'best':>8}   90%-power slope (best) / soakd's detectable")
    for shape in week.SHAPES:
        rs = [r for r in rows if r["shape"] == shape]
        if rs[0]["leaking"]:
            p = np.array([r["power"] for r in rs]).mean(axis=0)
            print(f"{shape:<16}{100 * p[0]:>11.1f}%{100 * p[1]:>9.1f}%{100 * p.max():>7.1f}%")
        else:
            s90 = np.array([r["s90"] for r in rs]).min(axis=1) / MIB
            det = [float(r["detectable"]) / MIB for r in rs]  # type: ignore[arg-type]
            ok = [d for d in det if d == d]
            ratio = statistics.median([d / s for d, s in zip(det, s90, strict=True) if d == d]) if ok else float("nan")
            print(
                f"{shape:<16}{'':>12}{'':>10}{'':>8}   {statistics.median(s90.tolist()):.2f} MiB/h / "
                f"{statistics.median(ok) if ok else float('nan'):.2f} MiB/h (median ratio {ratio:.2f})"
            )
    print(f"bench time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
