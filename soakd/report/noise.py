"""Noise estimates for ``soakd compare``: how far apart two runs' figures may be by chance.

Per-window figures, when each side has a few windows, give the best estimate: a circular block
bootstrap of the difference in window means (neighbouring windows are correlated, so blocks
of them are drawn). A short run has too few windows; then the run's own counts say how precise
its figures are:

* a percentile, from the latency histogram behind the summary. The sample q-quantile of n
  requests is the order statistic of rank about nq; the rank of the population quantile is
  Binomial(n, q), so at the chosen confidence it lies between that binomial's quantiles. The
  summary keeps the histogram's p50, p90, p99, p999 and max (the values at known ranks), so
  those ranks map to latencies by interpolating between them on the tail axis, and each end is
  widened by half a histogram bucket (a reported percentile is its bucket's middle). With few
  requests the upper rank reaches n and the bound is the run's max (a p99 of 400 requests is
  only known to lie below about the slowest one), or passes it and there is no upper bound.
  Requests that shared a batch share their latency, so the count is divided by the mean
  batch size first.
* throughput, from the ok count: a count over a fixed time has Poisson error sqrt(N), a
  relative error of 1/sqrt(N) on the rate.

Each side's interval is taken at the confidence; the difference interval runs from
``lo_B - hi_A`` to ``hi_B - lo_A``, so "beyond noise" means the two intervals do not overlap
(conservative: a short run is not a regression on one unlucky tail).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.stats import binom, norm

from soakd.record.types import Percentiles
from soakd.telemetry.histogram import BUCKET_GROWTH

# Summary keys of the latency percentiles and their quantiles (soakd/record/write.py QUANTILES).
QUANTILE_KEYS = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
_HALF_BUCKET = math.sqrt(BUCKET_GROWTH)


def block_bootstrap_ci(
    xa: npt.NDArray[np.float64],
    xb: npt.NDArray[np.float64],
    confidence: float,
    resamples: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """Interval of mean(xb) - mean(xa), resampling circular blocks of about n^(1/3) windows."""

    def means(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        n = x.size
        block = max(1, round(n ** (1 / 3)))
        nblocks = math.ceil(n / block)
        starts = rng.integers(0, n, size=(resamples, nblocks))
        idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(resamples, -1)[:, :n] % n
        return np.asarray(x[idx].mean(axis=1), dtype=np.float64)

    diff = means(xb) - means(xa)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(diff, [tail, 100 - tail])
    return float(lo), float(hi)


def _z(confidence: float) -> float:
    return float(norm.ppf(1 - (1 - confidence) / 2))


def _tail(rank: float | npt.NDArray[np.float64], n: int) -> Any:
    """Position on the 'nines' axis, -log(1 - F): latency tails are close to straight lines
    there (exponential and power-law tails exactly), so interpolating between the known
    percentiles in it follows the tail; linear in rank would bend the bounds upward."""
    return -np.log(1 - (np.asarray(rank, dtype=np.float64) - 0.5) / n)


def quantile_interval(
    stage: Percentiles, key: str, confidence: float, per_sample: float = 1.0
) -> tuple[float, float] | None:
    """Where the population percentile ``key`` (``p99``) lies, in the stage's unit (ms), from
    one stage of a summary's ``latency_ms``; None without a count or that percentile. The
    upper end is infinite when the run is too short to bound it (fewer requests than it takes
    for the max to pass the percentile with the confidence: about 370 for a p99 at 95%).

    ``per_sample``: requests per independent sample. Requests batched together share their
    queue wait and their inference call, so a run of n requests in batches of 4 holds about
    n/4 independent latencies, not n (the mean batch size is the design effect; compare also
    counts requests in flight together, which share the server's stalls)."""
    count, q = stage.count, QUANTILE_KEYS.get(key)
    figures = {"p50": stage.p50, "p90": stage.p90, "p99": stage.p99, "p999": stage.p999}
    if not isinstance(count, int) or count < 1 or q is None or figures.get(key) is None:
        return None
    n = max(1, round(count / max(1.0, per_sample)))
    known = {
        max(1, math.ceil(qq * n)): float(v)
        for k, qq in QUANTILE_KEYS.items()
        if (v := figures[k]) is not None and v > 0
    }
    has_max = stage.max is not None and stage.max > 0
    if stage.max is not None and has_max:
        known[n] = float(stage.max)  # exact, and the value at rank n
    if not known:
        return None
    tail = (1 - confidence) / 2
    # Order statistics X(l) <= quantile <= X(u) with the confidence: Binomial(n, q) ranks.
    lo_rank = max(1, int(binom.ppf(tail, n, q)))
    hi_rank = int(binom.ppf(1 - tail, n, q)) + 1
    ranks = np.asarray(sorted(known), dtype=np.float64)
    logs = np.log(np.asarray([known[int(r)] for r in ranks]))
    # Below the lowest known rank nothing is known but that latency is positive: bound at 0.
    lo = 0.0 if lo_rank < ranks[0] else float(np.exp(np.interp(_tail(lo_rank, n), _tail(ranks, n), logs)))
    if hi_rank > n or (hi_rank > ranks[-1] and not has_max):
        return lo / _HALF_BUCKET, math.inf
    hi = float(np.exp(np.interp(_tail(hi_rank, n), _tail(ranks, n), logs)))
    # A percentile is its bucket's middle, so the bucket's edges bound it; the max is exact.
    return lo / _HALF_BUCKET, hi * (1.0 if hi_rank == n and has_max else _HALF_BUCKET)


def rate_interval(count: Any, rate: Any, confidence: float) -> tuple[float, float] | None:
    """Where the true rate lies, from a rate measured as ``count`` events over a fixed time:
    the count's Poisson error sqrt(N) is a relative error of 1/sqrt(N) on the rate, whatever the
    time (so a fleet's summed throughput and total count work as well as one run's)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
        return None
    half = _z(confidence) * rate / math.sqrt(count)
    return max(0.0, rate - half), rate + half


def difference(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Interval of B - A from each side's interval."""
    return b[0] - a[1], b[1] - a[0]
