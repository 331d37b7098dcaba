"""Whether a rising span keeps its pace: a leak's rate does not decay, settling memory's does.

A span the trend test flags is growth at the noise; these checks tell the growth apart:

  * its halves: each must rise at the span's rate, at the noise. The newer half slower is
    settling; one half flat (or both flat around a jump) is a level shift a short span reads
    as a steep trend;
  * the judged history before it: everything before the span rising significantly faster is
    a log-like arena or caching allocator whose rate keeps decaying (each span only a little
    slower than the one before it);
  * the span of equal length just before it, reaching back into warm-up: a warm-up still
    levelling off;
  * its jumps (:func:`jumps`): a rise made of a few level shifts with flat stretches between
    (an allocator reserving segments, an arena taking chunks) has a rate only as sure as the
    count of its jumps, judged as a staircase's is (:func:`steps_lower`).
"""

from __future__ import annotations

import math

import numpy as np

from soakd.analysis.trend import Array, _largest_change, _robust_spread, _shift_out, ols_slope, slope_variance

MIB = float(1 << 20)
SETTLE_Z = 2.0  # a rate this many standard errors below the one before it is settling, not a leak
JUMP_SIGMAS = 4.0  # a jump stands out from the history's changes by this many robust spreads
JUMP_SHARE = 0.5  # jumps make a rise when the span without them rises less than this share of it


def unsteady(yd: Array, history: Array, noise: Array, full: Array, slope: float, se: float, per_hour: float) -> str:
    """Why the span ``yd`` (its level shift taken out; ``slope`` +- ``se`` bytes/hour) is not a
    steady rise, or "" when it is one. ``history``: the judged troughs it ends; ``noise``: the
    troughs the noise is measured on; ``full``: the troughs from the run's start."""
    n = yd.size
    if n >= 10:
        half = n // 2
        old, new = ols_slope(yd[:half]) * per_hour, ols_slope(yd[half:]) * per_hour
        se_half = math.sqrt(max(0.0, 2 * slope_variance(noise, half))) * per_hour
        if old - new > SETTLE_Z * se_half:
            return f"settling: growth is slowing ({old / MIB:.3g} then {new / MIB:.3g} MiB/h)"
        if max(abs(old - slope), abs(new - slope)) > SETTLE_Z * se_half:
            return f"not a steady rise ({old / MIB:.3g} then {new / MIB:.3g} MiB/h): a step"
    if history.size >= 2 * n:
        early = history[:-n]
        prev = ols_slope(early) * per_hour
        se_prev = math.sqrt(max(0.0, slope_variance(noise, min(early.size, noise.size)))) * per_hour
        if prev - slope > SETTLE_Z * math.hypot(se, se_prev):
            return f"settling: growth is slowing ({prev / MIB:.3g} then {slope / MIB:.3g} MiB/h)"
    # The troughs here reach back into the warm-up on purpose: a warm-up's rate decays too.
    before = full[max(0, full.size - 2 * n) : full.size - n]
    before = before[np.isfinite(before)]
    if before.size >= max(5, n // 2):
        prev = ols_slope(before) * per_hour
        if prev - slope > SETTLE_Z * math.sqrt(2.0) * se:
            return f"settling: growth is slowing ({prev / MIB:.3g} then {slope / MIB:.3g} MiB/h)"
    return ""


def jumps(y: Array, history: Array, max_lag: int, limit: int = 8) -> int:
    """How many jumps make the rise of ``y`` (troughs ending ``history``), or 0 when it is not
    made of jumps: each a change over at most ``max_lag`` points standing out by JUMP_SIGMAS
    robust spreads from the changes ``history`` shows over ``max_lag`` points (its usual drift
    allowed for), the jumps covering at most half of ``y`` (a ramp is not jumps: its changes
    come back to back) and ``y`` without them rising less than JUMP_SHARE of its rise."""
    n = y.size
    if n < 3 or history.size <= max_lag + 2:
        return 0
    d = history[max_lag:] - history[:-max_lag]
    d = d[d != 0]  # an envelope holds flat for stretches; those zeros are not its noise
    if d.size < 5:
        return 0
    centre, spread = _robust_spread(d)
    out = y.copy()
    k = covered = 0
    for _ in range(limit):
        size, at, lag = _largest_change(out, max_lag)
        if size <= max(centre, 0.0) * lag / max_lag + JUMP_SIGMAS * spread:
            break
        _shift_out(out, size, at, lag)
        k, covered = k + 1, covered + lag
    rise = ols_slope(y) * (n - 1)
    if k == 0 or covered > n / 2 or rise <= 0 or ols_slope(out) * (n - 1) >= JUMP_SHARE * rise:
        return 0
    return k


def steps_lower(k: int, z: float) -> float:
    """One-sided lower confidence bound, at ``z`` standard normal deviates, on the mean count
    of a Poisson process seen to make ``k`` steps (Wilson-Hilferty; within 1% of the chi-square
    bound from k = 3). A rate read off a few steps is that uncertain: 3 steps at z = 1.28 are
    consistent with a mean of 1.1, so 3 chunks of an allocator settling pass for a leak's rate."""
    if k <= 0:
        return 0.0
    return k * max(0.0, 1.0 - 1.0 / (9.0 * k) - z / (3.0 * math.sqrt(k))) ** 3
