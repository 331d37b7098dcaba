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
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
_NORMAL = NormalDist()  # stdlib, not scipy.stats: `soakd analyze` starts in a fraction of the time


def _upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _average_ranks(a: Array) -> Array:
    """Ranks 1..n with ties sharing their average rank (as ``scipy.stats.rankdata``)."""
    ranks = np.empty(a.size)
    ranks[np.argsort(a, kind="mergesort")] = np.arange(1, a.size + 1)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(inv, weights=ranks) / counts)[inv]


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


def lower_envelope(t: Array, v: Array, span: float, step: float, *, end: float | None = None) -> tuple[Array, Array]:
    """Trailing minimum over ``span`` seconds, every ``step`` seconds: the troughs under a
    sawtooth of period up to ``span``, at a finer time step than bins of ``span`` would give.
    Neighbouring points overlap, which the autocorrelation-corrected test allows for."""
    tb, yb = troughs(t, v, step, end=end)
    k = max(1, round(span / step))
    if k == 1 or yb.size < k:
        return tb, yb
    win = np.lib.stride_tricks.sliding_window_view(yb, k)
    return tb[k - 1 :], win.min(axis=1)


def _pairs(n: int, split: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Index pairs i < j, only within the blocks [0, split) and [split, n) when split > 0."""
    i, j = np.triu_indices(n, k=1)
    if split > 0:
        same = (i < split) == (j < split)
        i, j = i[same], j[same]
    return i, j


def theil_sen(x: Array, y: Array, split: int = 0) -> float:
    """Theil-Sen slope (median of pairwise slopes) of y against x; nan with under 2 points.

    The same estimate as ``scipy.stats.theilslopes(y, x).slope``, without its confidence
    interval, which costs more than the slope on the small series judged here. With
    ``split``, only pairs on the same side of a level shift at that index count.
    """
    if x.size < 2:
        return math.nan
    i, j = _pairs(x.size, split)
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


def mann_kendall(y: Array, *, split: int = 0, known_lags: int = 0, lag_alpha: float = 0.05) -> MKResult:
    """Mann-Kendall with the Hamed-Rao (1998) autocorrelation correction, one-sided (increasing).

    As ``pymannkendall.hamed_rao_modification_test`` (ties in the variance, significant rank
    autocorrelations of the Sen-detrended series at ``lag_alpha``), vectorised, with one
    change: the correction only ever widens the variance. With few points the rank
    autocorrelation can come out negative, and a correction that shrinks the variance
    would make the test more eager, not less.

    ``known_lags``: lags 1..known_lags enter the correction whether or not their estimate
    passes the significance bound, for series dependent by construction (the overlapping
    windows of :func:`lower_envelope`); with few points their estimates often would not.

    With ``split``, the series is two blocks either side of a level shift and the test is the
    blocked (seasonal-Kendall style) sum of the blocks' S and variances: the shift itself,
    and any error in estimating its size, never counts as trend.
    """
    blocks = [y[:split], y[split:]] if split > 0 else [y]
    s_total, var_total = 0.0, 0.0
    for b in blocks:
        s, var = _mk_block(b, lag_alpha, known_lags)
        s_total += s
        var_total += var
    if var_total <= 0:
        return MKResult(s_total, 0.0, 1.0)
    z = (s_total - math.copysign(1.0, s_total)) / math.sqrt(var_total) if s_total != 0 else 0.0
    return MKResult(s_total, z, _upper_tail(z))


def _mk_block(y: Array, lag_alpha: float, known_lags: int = 0) -> tuple[float, float]:
    """(S, variance) of one block, Hamed-Rao corrected (never narrower); (0, 0) under 4 points."""
    n = y.size
    if n < 4:
        return 0.0, 0.0
    i, j = np.triu_indices(n, k=1)
    s = float(np.sign(y[j] - y[i]).sum())
    _, counts = np.unique(y, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18.0
    if var <= 0:
        return s, 0.0
    slope = float(np.median((y[j] - y[i]) / (j - i)))
    ranks = _average_ranks(y - slope * np.arange(1, n + 1))
    r = ranks - ranks.mean()
    denom = float(np.dot(r, r))
    if denom > 0:
        acf = np.correlate(r, r, "full")[n:] / denom  # lags 1..n-1
        lags = np.arange(1, n)
        bound = _NORMAL.inv_cdf(1 - lag_alpha / 2) / math.sqrt(n)
        sig = (np.abs(acf) > bound) | (lags <= known_lags)
        sni = float(np.sum(((n - lags) * (n - lags - 1) * (n - lags - 2) * acf)[sig]))
        var *= max(1.0, 1.0 + 2.0 / (n * (n - 1) * (n - 2)) * sni)
    return s, var


def _robust_spread(d: Array) -> tuple[float, float]:
    """Median of ``d`` and its median absolute deviation scaled to a normal's sigma."""
    centre = float(np.median(d))
    return centre, 1.4826 * float(np.median(np.abs(d - centre)))


def _largest_change(y: Array, max_lag: int, centre: float = 0.0, *, falls: bool = False) -> tuple[float, int, int]:
    """(size, start index, lag) of the largest change of ``y`` over 1..``max_lag`` points: the
    largest rise, or with ``falls`` the largest in size either way, each lag's candidate picked
    against ``centre`` per ``max_lag`` points (the usual drift). (0.0, 0, 1) when none."""
    best, at, lag = 0.0, 0, 1
    for k in range(1, min(max_lag, y.size - 1) + 1):
        dk = y[k:] - y[:-k]
        i = int(np.argmax(np.abs(dk - centre * k / max_lag))) if falls else int(np.argmax(dk))
        if (abs(dk[i]) > abs(best)) if falls else (dk[i] > best):
            best, at, lag = float(dk[i]), i, k
    return best, at, lag


def _shift_out(out: Array, size: float, at: int, lag: int) -> None:
    """Take a change of ``size`` over ``out[at:at + lag + 1]`` out of ``out`` in place: the
    points after it lowered by ``size``, the ones inside it held at its start."""
    out[at + lag :] -= size
    out[at + 1 : at + lag] = out[at]


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


# ---- The sequential test's pieces: a fixed bin grid, a truncated envelope, a noise model.


def bin_minima(t: Array, v: Array, origin: float, bin_seconds: float, nbins: int) -> Array:
    """Minimum of ``v`` in bins ``[origin + i*bin, origin + (i+1)*bin)`` for i < ``nbins``.

    Bins are aligned to a fixed origin (the run's start), so a bin's value never changes once
    it is complete and a replay can compute the grid once. Empty bins are nan."""
    out = np.full(max(0, nbins), np.inf)
    if nbins <= 0 or t.size == 0:
        return np.full(max(0, nbins), np.nan)
    idx = np.floor((t - origin) / bin_seconds).astype(np.int64)
    keep = (idx >= 0) & (idx < nbins)
    np.minimum.at(out, idx[keep], v[keep])
    out[np.isinf(out)] = np.nan
    return out


def trailing_min(y: Array, k: int, start: int = 0, full: bool = False) -> Array:
    """Trailing minimum over ``k`` points of ``y[start:]``, never reaching before ``start``
    (the first points take the minimum so far; with ``full`` they are nan: a minimum of fewer
    points reads higher, so every history judged would start with a fall). nan points are
    skipped (a gap)."""
    seg = y[start:]
    if seg.size == 0 or k <= 1:
        return seg.copy()
    # inf for the padding and the gaps: the minimum skips them; a window of nothing but gap stays inf.
    pad = np.concatenate([np.full(k - 1, np.inf), np.where(np.isnan(seg), np.inf, seg)])
    out = np.lib.stride_tricks.sliding_window_view(pad, k).min(axis=1)
    out[np.isinf(out)] = np.nan
    if full:
        out[: k - 1] = np.nan
    return np.asarray(out, dtype=np.float64)


def ols_slope(y: Array) -> float:
    """Least-squares slope per point (nan under 2 points)."""
    n = y.size
    if n < 2:
        return math.nan
    x = np.arange(n, dtype=np.float64)
    xc = x - x.mean()
    return float(np.dot(xc, y - y.mean()) / np.dot(xc, xc))


def detrended(y: Array) -> Array:
    """``y`` less its least-squares line (a copy under two points)."""
    n = y.size
    return y - ols_slope(y) * np.arange(n, dtype=np.float64) if n >= 2 else y.copy()


def upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return _upper_tail(z)


def z_for(p: float) -> float:
    """The z with P(Z > z) = p."""
    return _NORMAL.inv_cdf(1.0 - min(max(p, 1e-300), 0.5))


def extend_variogram(gam: Array, reliable: int, length: int) -> Array:
    """``gam`` to lags 0..length-1: measured up to ``reliable``, beyond it a random walk at the
    growth rate seen between reliable/2 and reliable (never shrinking: the test errs towards
    "no leak" where the data cannot say how far the level wanders)."""
    reliable = max(2, min(reliable, gam.size - 1))
    half = reliable // 2
    q = max(0.0, float(gam[reliable] - gam[half]) / max(1, reliable - half))
    out = np.empty(length)
    keep = min(length, reliable + 1)
    out[:keep] = gam[:keep]
    if length > keep:
        h = np.arange(keep, length, dtype=np.float64)
        out[keep:] = gam[reliable] + q * (h - reliable)
    return out


_LAG_WEIGHTS: dict[int, Array] = {}


def slope_lag_weights(n: int) -> Array:
    """``a[h] = sum_i c[i] c[i+h]`` for the least-squares slope weights c of n points, so that
    ``var(slope) = -sum_{h>=1} gamma(h) a[h]`` for any series with stationary increments and
    variogram gamma (the constant and the level drop out since sum c = 0). Cached per n."""
    got = _LAG_WEIGHTS.get(n)
    if got is None:
        x = np.arange(n, dtype=np.float64)
        c = (x - x.mean()) / float(np.sum((x - x.mean()) ** 2))
        got = np.correlate(c, c, "full")[n - 1 :].astype(np.float64)
        _LAG_WEIGHTS[n] = got
    return got


def slope_variance(y: Array, span: int) -> float:
    """Variance of the least-squares slope (per point) over the newest ``span`` points of ``y``,
    at the noise ``y`` shows (any autocorrelation: the variogram enters the exact formula).

    The variogram up to lag ``span`` comes from blocks of 4 spans, each detrended by its own
    line (:func:`lag_variogram`), so a leak that started late or a level shift spoils one
    block, not the estimate (an outlying block is left out), and is made non-decreasing.
    With under two blocks of history, from all of it, measured up to a quarter of its length
    and extended beyond as a random walk."""
    n = y.size
    block = 4 * span
    nb = n // block
    if nb >= 2:
        # One trend through all the blocks (a line that may bend once: a leak that began late
        # is trend, not noise), not a line per block: a swing slower than a block (a long GC
        # period, a load cycle, slow wander) is noise to every span within it, and a block's
        # own line would take it out as "trend".
        rows = hinge_residual(y[n - nb * block :]).reshape(nb, block)
        per = np.stack([lag_variogram(row, span, detrend=False) for row in rows])
        level = per[:, 1:].mean(axis=1)
        keep = np.ones(nb, dtype=bool)
        if nb >= 3:
            worst = int(np.argmax(level))
            if level[worst] > 4.0 * float(np.median(level)):
                keep[worst] = False
        gam = per[keep].mean(axis=0)
    else:
        gam = extend_variogram(lag_variogram(y, max(5, n // 4 + 1)), max(4, n // 4), span)
    # Non-decreasing over lags (noise and wander only add up with lag): an estimate noisy at
    # some lag can then never make the variance negative, and a periodic swing counts at its
    # full height from the lag it first reaches it.
    gam = np.maximum.accumulate(gam[:span])
    a = slope_lag_weights(span)
    return max(0.0, float(-np.dot(gam[1:span], a[1:span])))


def despiked(y: Array) -> Array:
    """``y`` through a centred running median of 5 points: a move back within two points, up or
    down, is a spike and is gone; a step and a trend pass. A spike is not a step or a jump: taken
    out as one it left a lasting fall in the noise (7x the slope's error on heavy-tailed jitter)."""
    n = y.size
    if n < 5:
        return y.copy()
    pad = np.concatenate([np.full(2, y[0]), y, np.full(2, y[-1])])
    # The median of five by a min/max network: exactly np.median's, 50x faster (every span, every look).
    a, b, c, d, e = (pad[i : i + n] for i in range(5))
    lo = np.maximum(np.minimum(a, b), np.minimum(c, d))
    hi = np.minimum(np.maximum(a, b), np.maximum(c, d))
    return np.asarray(np.maximum(np.minimum(e, lo), np.minimum(np.maximum(e, lo), hi)), dtype=np.float64)


def take_out_step(y: Array, history: Array, max_lag: int, min_sigmas: float = 5.0) -> Array:
    """``y`` with its largest rise over up to ``max_lag`` points taken out, if that rise stands
    out from the rises over ``max_lag`` points across ``history`` (robust centre and spread:
    a leak rises at its pace everywhere; a level shift once). One step is not a leak; a spike
    is not a step (both are read :func:`despiked`)."""
    if y.size < 3 or history.size <= max_lag + 2:
        return y
    h = despiked(history)
    centre, spread = _robust_spread(h[max_lag:] - h[:-max_lag])
    best, at, lag = _largest_change(despiked(y), max_lag)
    if best - max(centre, 0.0) * lag / max_lag <= min_sigmas * spread or best <= 0:
        return y
    out = y.copy()
    _shift_out(out, best, at, lag)
    return out


HINGE_KNOTS = 16


def hinge_residual(y: Array) -> Array:
    """``y`` less its best continuous two-piece line (one bend, at one of HINGE_KNOTS places
    between an eighth and seven eighths of it), fitted by least squares."""
    n = y.size
    if n < 16:
        return detrended(y)
    x = np.arange(n, dtype=np.float64) / n
    knots = np.linspace(0.125, 0.875, HINGE_KNOTS)
    h = np.maximum(0.0, x[None, :] - knots[:, None])  # each knot's third column
    # Normal equations of the columns 1, x and h per knot: the sums over the two shared columns
    # once, those with h as matrix-vector products (no knots x n x 3 design array: the detector
    # fits this at every look, and the live monitor looks every minute on every series).
    sh, sxh, shh, shy = h.sum(axis=1), h @ x, np.einsum("kn,kn->k", h, h), h @ y
    gram = np.empty((HINGE_KNOTS, 3, 3))
    gram[:, 0, 0], gram[:, 0, 1], gram[:, 1, 1] = n, x.sum(), x @ x
    gram[:, 1, 0] = gram[:, 0, 1]
    gram[:, 0, 2] = gram[:, 2, 0] = sh
    gram[:, 1, 2] = gram[:, 2, 1] = sxh
    gram[:, 2, 2] = shh
    rhs = np.stack([np.full(HINGE_KNOTS, y.sum()), np.full(HINGE_KNOTS, x @ y), shy], axis=1)
    coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
    res = y[None, :] - coef[:, :1] - coef[:, 1:2] * x[None, :] - coef[:, 2:3] * h
    return np.asarray(res[int(np.argmin(np.einsum("kn,kn->k", res, res)))], dtype=np.float64)


def lag_variogram(y: Array, lags: int, *, detrend: bool = True) -> Array:
    """``out[h] = mean((r[i+h] - r[i])**2)``, h = 0..lags-1, over the pairs that start in the
    first ``n - lags + 1`` points (the same pairs at every lag), ``r`` being ``y`` detrended
    by its least-squares line. The mean, not the median: a trough envelope holds flat for
    many points, and a median of its changes would call it noiseless."""
    n = y.size
    lags = max(1, min(lags, n - 1))
    r = detrended(y) if detrend else y
    r = r - r.mean()  # the variogram ignores the level; centred, the sums below keep their digits
    m = n - lags + 1
    # mean((r[i+h] - r[i])^2) = (sum r[i+h]^2 + sum r[i]^2 - 2 sum r[i] r[i+h]) / m: running sums
    # and one correlation, instead of the m x lags array of differences (8 MB at a 6 h window).
    sq = np.concatenate(([0.0], np.cumsum(r * r)))
    out = (sq[m : m + lags] - sq[:lags] + sq[m] - 2.0 * np.correlate(r, r[:m], "valid")) / m
    out[0] = 0.0
    return np.asarray(np.maximum(out, 0.0), dtype=np.float64)


def level_shifts(y: Array, max_lag: int, min_sigmas: float = 5.0, limit: int = 12) -> list[tuple[int, float]]:
    """The level shifts of ``y``, largest first: (index the shift ends at, size; negative for a
    fall), each a change over up to ``max_lag`` points that stands out by ``min_sigmas`` robust
    spreads from the changes ``y`` shows over ``max_lag`` points, up to ``limit`` of them.

    The spread counts only the changes that happen: a trough envelope holds flat for long
    stretches, and counting those zeros would make every wiggle of its noise a shift."""
    if y.size <= max_lag + 2:
        return []
    d = y[max_lag:] - y[:-max_lag]
    d = d[d != 0]
    if d.size < 5:
        return []
    centre, spread = _robust_spread(d)
    out = y.copy()
    found: list[tuple[int, float]] = []
    for _ in range(limit):
        best, at, lag = _largest_change(out, max_lag, centre, falls=True)
        if best == 0 or abs(best - centre * lag / max_lag) <= min_sigmas * spread:
            break
        _shift_out(out, best, at, lag)
        found.append((at + lag, best))
    return found


def take_out_shifts(y: Array, shifts: list[tuple[int, float]]) -> Array:
    """``y`` with the level shifts of :func:`level_shifts` (index ends, sizes) taken out."""
    out = y.copy()
    for at, size in shifts:
        out[at:] -= size
    return out


PLATEAU_HISTORY = 1.0 / 3  # of the window (2 h of 6 h): judged history needed before noise is called bounded
PLATEAU_GROWTH = 1.25  # the variogram grows less than this from an eighth to half the data


def forgets(y: Array, window_points: float, step_lag: int) -> bool:
    """The troughs' noise levels off well within the data: detrended, their variogram at half
    the data's length is within PLATEAU_GROWTH of the one at an eighth (AR(1) noise, jitter,
    a sawtooth seen many times), so it is measured at every lag a span of the whole data needs.
    Slow wander and load cycles keep growing and stay judged on half; level shifts that rise
    more than they fall (an allocator settling, a staircase) are not noise that forgets. Falls
    that give back as much (a GC sawtooth's collections, each after a ramp too slow to be a
    shift) are: counting them as shifts kept every week sawtooth trace, and the faint leaks
    under it, judged on half the data (#39's eighth round)."""
    if y.size < max(32.0, PLATEAU_HISTORY * window_points):
        return False
    # Detrended: on the raw troughs a leak's own rise made a spiky envelope's jumps "rise more
    # than they fall", and the noise stopped forgetting once a leak was added (#39, round 11).
    if sum(size for _, size in level_shifts(detrended(y), step_lag)) > 0:
        return False
    half = y.size // 2
    g = lag_variogram(y, half + 1)
    return bool(g[half // 4] > 0 and g[half] <= PLATEAU_GROWTH * g[half // 4])


# A bounded swing rises by at most its range (the largest fall seen) from one look, or one cycle,
# to the next: a rise must be this many times that range before it can read as a leak.
SWING_RISE = 2.0


def largest_fall(b: Array) -> float:
    """The largest fall of the bin minima ``b`` (nan gaps skipped): the range of the swings seen."""
    y = b[np.isfinite(b)]
    return float(np.max(np.maximum.accumulate(y) - y)) if y.size else 0.0


def dur(seconds: float) -> str:
    """A duration for a reason: "44 min", "6 h"."""
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"
