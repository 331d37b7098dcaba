"""A known load cycle (#39): memory judged at the same point of each cycle, not on a half
cycle's rise.

When the load repeats every P seconds (a ``[phases]`` probe schedule whose fire times are evenly
spaced, or ``[leak] cycle``), memory that follows the load swings with period P, and the first
rise of each cycle reads as a leak's start. With P known the detector judges in three stages of
judged time (after warm-up):

  * under one cycle: nothing (the cycle's swing has not been seen once, and a rise within it
    may be the swing);
  * from one to two cycles: the troughs as without a cycle, under the early looks' bars (the
    rise at twice the threshold z, and twice the largest fall seen: by now the cycle's own
    swing, so only a rise far beyond it is flagged);
  * from one cycle on, also: the troughs against the same point of the cycle before
    (:func:`cycle_rise`), flagged when they stand higher by twice the largest fall seen: a
    strong leak from the start is caught about a cycle in, one that begins later within 1-2 h;
  * from two cycles on: the per-cycle means (a trailing mean of the troughs over one period,
    where any swing of period P averages out to a constant), tested as the troughs are
    without a cycle: a leak raises every cycle's mean by its rate times P.

With no period given, a run whose load repeats all the same (a nightly batch, a traffic replay
on a loop) shows it: once PERIOD_CYCLES cycles are in the judged troughs, :func:`find_period`
reads P from them and the series is judged from then on as under a known cycle. Before that,
its rises are judged as any series' are (the early looks' bars, the page's wait for a rise's age).
"""

from __future__ import annotations

import numpy as np

from soakd.analysis.trend import SWING_RISE, Array, dur, lag_variogram

FIRST, SECOND, JUDGED = 1, 2, 3  # the stages, in judged cycles: < 1, < 2, >= 2


def stage(judged: float, cycle: float | None) -> int:
    """Which stage ``judged`` seconds of judged data are at under a cycle of ``cycle`` seconds
    (0: no cycle known)."""
    if not cycle:
        return 0
    return FIRST if judged < cycle else SECOND if judged < 2 * cycle else JUDGED


def cycle_mean(env: Array, q: int) -> Array:
    """Trailing mean over ``q`` points of ``env`` (nan until ``q`` finite points are in the
    window, and wherever a gap leaves fewer than half of them): the per-cycle mean at each point."""
    if q <= 1 or env.size == 0:
        return env.copy()
    ok = np.isfinite(env)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, env, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    out = np.full(env.size, np.nan)
    s = c[q:] - c[:-q]
    n = k[q:] - k[:-q]
    # The window must reach back over a whole cycle of the judged series (its first finite point on).
    first = int(np.argmax(ok)) if ok.any() else env.size
    valid = n >= max(1, q // 2)
    idx = np.arange(q - 1, env.size)
    valid &= idx >= first + q - 1
    out[q - 1 :] = np.where(valid, s / np.maximum(n, 1), np.nan)
    return out


def hold_reason(cycle: float | None, judged: float) -> str:
    """The "not judged yet" reason under a known cycle ("" without one)."""
    if not cycle:
        return ""
    return f"not judged yet: a load cycle of {dur(cycle)} needs {dur(2 * cycle)}" + (
        "" if judged >= cycle else " (none seen yet)"
    )


def cycle_rise(
    y: Array, q: int, shortest: int, swing: float, zbar: float, per_hour: float
) -> tuple[float, float] | None:
    """The troughs ``y`` against the same point of the cycle before (``q`` points back): the
    mean rise over the newest ``shortest`` points and over the newest cycle (what there is of
    them), when it is beyond SWING_RISE x ``swing`` (the largest fall seen: a bounded swing,
    however its cycles differ, rises by at most that from one cycle to the next) and ``zbar``
    times the spread of those differences (their noise, however correlated: the spread of one
    difference, not of their mean). Returns (rate, its spread) in bytes per hour (``per_hour``:
    per cycle to per hour), or None."""
    y = y[np.isfinite(y)]
    d = y[q:] - y[:-q] if y.size > q else y[:0]
    if d.size < shortest:
        return None
    spread = float(np.std(d))
    for n in sorted({shortest, min(d.size, q)}):
        rise = float(np.mean(d[-n:]))
        if rise >= SWING_RISE * swing and rise >= zbar * spread:
            return rise * per_hour, max(spread * per_hour, 1e-9)
    return None


PERIOD_RANGE = (3600.0, 12 * 3600.0)  # seconds: shorter swings the troughs ride out; longer need days
PERIOD_CYCLES = 3.0  # a period is read from the data once this many cycles of it are judged
PERIOD_DIP = 25.0  # at the period, the variogram is this many times below its peak over a half cycle
PERIOD_SMOOTH = 5  # bins: the troughs' trailing minimum the period is read on (spikes, white noise)


def find_period(y: Array, lo: int, hi: int) -> int | None:
    """The period, in points, of a swing that repeats in ``y`` (evenly spaced troughs), or None.

    Memory that follows a repeating load comes back to the same level one period later, however
    it moved between: the troughs' variogram (detrended by their line, which takes out a leak's
    rise) falls to the noise's one period apart, PERIOD_DIP times below its peak over a quarter
    to three quarters of a period, where the swing itself shows. Wander and short-memory noise
    have no such dip: the variogram of a random path grows or levels off. Periods from ``lo``
    points up to ``hi`` (and a third of the data) are looked at; of the dips found the shortest
    nearly as deep as the deepest is taken (a cycle's multiples dip too). Gaps are filled with
    the level before them."""
    ok = np.isfinite(y)
    if not ok.any():
        return None
    y = y[int(np.argmax(ok)) :]
    idx = np.maximum.accumulate(np.where(np.isfinite(y), np.arange(y.size), 0))
    y = y[idx]  # forward fill: a gap neither swings nor repeats
    hi = min(hi, int(y.size / PERIOD_CYCLES))
    if hi < lo or lo < 4:
        return None
    v = lag_variogram(y, hi + 2)
    dips = []
    for lag in range(lo, hi + 1):
        if v[lag] > v[lag - 1] or v[lag] > v[lag + 1]:
            continue  # not a local minimum
        swing = float(np.max(v[lag // 4 : 3 * lag // 4 + 1]))
        if swing >= PERIOD_DIP * max(float(v[lag]), 1e-12 * swing):
            dips.append((lag, float(v[lag])))
    if not dips:
        return None
    deepest = min(d for _, d in dips)
    return next(lag for lag, d in dips if d <= 2 * deepest)
