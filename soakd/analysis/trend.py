"""Trend primitives for memory series: trough tracking, robust slope, autocorrelation-aware
Mann-Kendall, level-shift removal, and the end of warm-up as a change in slope.

Memory series are not the independent samples a textbook trend test assumes: samples 10 s
apart are strongly autocorrelated and GC or allocator sawtooth puts a large periodic swing on
top. Working on bin minima (troughs) removes the sawtooth and most of the autocorrelation;
the Hamed-Rao variance correction takes care of what is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import norm, rankdata

Array = npt.NDArray[np.float64]


def troughs(t: Array, v: Array, bin_seconds: float, *, end: float | None = None) -> tuple[Array, Array]:
    """Minimum of ``v`` in consecutive bins of ``bin_seconds`` ending at ``end`` (default: last t).

    Bins are aligned to the end so the newest bin is complete; a bin holding under a third of
    the samples of a full bin is dropped (a gap or the ragged oldest edge). Returns the bins'
    centre times and minima.
    """
    if t.size == 0:
        return np.zeros(0), np.zeros(0)
    end = float(t[-1]) if end is None else end
    idx = np.floor((end - t) / bin_seconds).astype(np.int64)  # 0 = newest bin
    keep = idx >= 0
    idx, vals = idx[keep], v[keep]
    if idx.size == 0:
        return np.zeros(0), np.zeros(0)
    nbins = int(idx.max()) + 1
    counts = np.bincount(idx, minlength=nbins)
    mins = np.full(nbins, np.inf)
    np.minimum.at(mins, idx, vals)
    full = counts.max()
    ok = counts * 3 >= full
    order = np.arange(nbins)[ok][::-1]  # oldest first
    centres = end - (order + 0.5) * bin_seconds
    return centres.astype(np.float64), mins[order]


def lower_envelope(
    t: Array, v: Array, span: float, step: float, *, end: float | None = None
) -> tuple[Array, Array]:
    """Trailing minimum over ``span`` seconds, every ``step`` seconds: the troughs under a
    sawtooth of period up to ``span``, at a finer time step than bins of ``span`` would give.
    Neighbouring points overlap, which the autocorrelation-corrected test allows for."""
    tb, yb = troughs(t, v, step, end=end)
    k = max(1, round(span / step))
    if k == 1 or yb.size < k:
        return tb, yb
    win = np.lib.stride_tricks.sliding_window_view(yb, k)
    return tb[k - 1 :], win.min(axis=1)


def theil_sen(x: Array, y: Array) -> float:
    """Theil-Sen slope (median of pairwise slopes) of y against x; nan with under 2 points.

    The same estimate as ``scipy.stats.theilslopes(y, x).slope``, without its confidence
    interval, which costs more than the slope on the small series judged here.
    """
    if x.size < 2:
        return math.nan
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return math.nan
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))


@dataclass(frozen=True)
class MKResult:
    s: float  # Mann-Kendall S: concordant minus discordant pairs
    z: float
    p_increasing: float  # one-sided p-value for an increasing trend


def mann_kendall(y: Array, *, lag_alpha: float = 0.05) -> MKResult:
    """Mann-Kendall with the Hamed-Rao (1998) autocorrelation correction, one-sided (increasing).

    As ``pymannkendall.hamed_rao_modification_test`` (ties in the variance, significant rank
    autocorrelations of the Sen-detrended series at ``lag_alpha``), vectorised, with one
    change: the correction only ever widens the variance. With few points the rank
    autocorrelation can come out negative, and a correction that shrinks the variance
    would make the test more eager, not less.
    """
    n = y.size
    if n < 4:
        return MKResult(0.0, 0.0, 1.0)
    i, j = np.triu_indices(n, k=1)
    s = float(np.sign(y[j] - y[i]).sum())
    _, counts = np.unique(y, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18.0
    if var <= 0:
        return MKResult(s, 0.0, 1.0)
    slope = float(np.median((y[j] - y[i]) / (j - i)))
    ranks = rankdata(y - slope * np.arange(1, n + 1))
    r = ranks - ranks.mean()
    denom = float(np.dot(r, r))
    if denom > 0:
        acf = np.correlate(r, r, "full")[n:] / denom  # lags 1..n-1
        lags = np.arange(1, n)
        bound = norm.ppf(1 - lag_alpha / 2) / math.sqrt(n)
        sig = np.abs(acf) > bound
        sni = float(np.sum(((n - lags) * (n - lags - 1) * (n - lags - 2) * acf)[sig]))
        var *= max(1.0, 1.0 + 2.0 / (n * (n - 1) * (n - 2)) * sni)
    z = (s - math.copysign(1.0, s)) / math.sqrt(var) if s != 0 else 0.0
    return MKResult(s, z, float(norm.sf(z)))


def remove_largest_step(y: Array, max_lag: int = 2) -> tuple[Array, int]:
    """Take out the largest rise over up to ``max_lag`` neighbouring points.

    One level shift (a new input shape, a cache that grows once) is not a leak; a staircase
    that keeps stepping still trends after one of its steps is taken out, and a creep loses
    only one increment. A step that settles over a few points counts as one (``max_lag``).
    Returns the adjusted series and the index the step ends at (0: none).
    """
    out = y.copy()
    if y.size < 3:
        return out, 0
    best, at, lag = 0.0, 0, 1
    for k in range(1, min(max_lag, y.size - 1) + 1):
        d = y[k:] - y[:-k]
        i = int(np.argmax(d))
        if d[i] > best:
            best, at, lag = float(d[i]), i, k
    if best <= 0:
        return out, 0
    out[at + lag :] -= best
    out[at + 1 : at + lag] = y[at]
    return out, at + lag


def warmup_end(x: Array, y: Array, *, min_ratio: float = 4.0, min_tail: int = 4) -> int:
    """Index where growth stops decelerating: the knee of the best two-slope (hinge) fit.

    Returns 0 when the series does not look like warm-up, i.e. unless the slope before the
    knee is positive and at least ``min_ratio`` times the slope after it and the hinge fits
    clearly better than one straight line. Candidate knees leave ``min_tail`` points after.
    """
    n = x.size
    if n < min_tail + 3:
        return 0
    xs = (x - x[0]) / max(float(x[-1] - x[0]), 1e-9)
    base = np.column_stack([np.ones(n), xs])
    line, *_ = np.linalg.lstsq(base, y, rcond=None)
    sse_line = float(np.sum((y - base @ line) ** 2))
    ks = np.arange(2, n - min_tail + 1)
    # All candidate hinge fits at once: design (k, n, 3), normal equations solved batched.
    hinge = np.maximum(0.0, xs[None, :] - xs[ks][:, None])
    a = np.stack([np.broadcast_to(base[:, 0], hinge.shape), np.broadcast_to(xs, hinge.shape), hinge], axis=2)
    gram = np.einsum("kni,knj->kij", a, a)
    rhs = np.einsum("kni,n->ki", a, y)
    try:
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return 0
    sse = np.sum((y[None, :] - np.einsum("kni,ki->kn", a, coef)) ** 2, axis=1)
    best = int(np.argmin(sse))
    before, after = coef[best, 1], coef[best, 1] + coef[best, 2]
    if before <= 0 or before < min_ratio * max(after, 0.0) or sse[best] > 0.5 * sse_line:
        return 0
    return int(ks[best])
