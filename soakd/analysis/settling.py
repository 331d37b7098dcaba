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

and a rise made of jumps is judged on their count (:mod:`soakd.analysis.jumps`).
"""

from __future__ import annotations

import math

import numpy as np

from soakd.analysis.params import MIB
from soakd.analysis.trend import Array, ols_slope, slope_variance

SETTLE_Z = 2.0  # a rate this many standard errors below the one before it is settling, not a leak


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
