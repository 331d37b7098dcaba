"""Rises made of jumps: an allocator reserving segments, an arena taking chunks, a leak that
comes in rare big steps. The trough noise between jumps says nothing of when the next comes: a
rate read off ``k`` jumps is only as sure as their count (:func:`steps_lower`, the count's
Poisson bound): three steps are consistent with 1.1.

A jump is counted on the bin minima (a trailing minimum held by an old low point turns a leak's
onset into a jump and a flat stretch): a change over at most a third of ``max_lag`` points
standing out by JUMP_SIGMAS robust spreads from the changes the history shows over as many
points (its usual drift allowed for; few of those short changes hold a jump, so the spread is
the noise's, not the jumps'). Changes that follow on within as many points are one stretch of
growth; a stretch longer than ``max_lag`` is a ramp, not a jump. Spikes (a move back within two
points, either way) are not jumps: the minima are read :func:`soakd.analysis.trend.despiked`.
"""

from __future__ import annotations

import math

import numpy as np

from soakd.analysis.judgement import Z90
from soakd.analysis.trend import Array, _largest_change, _robust_spread, _shift_out, despiked, ols_slope

JUMP_SIGMAS = 4.0  # a jump stands out from the history's changes by this many robust spreads
JUMP_SHARE = 0.5  # jumps make a rise when the span without them rises less than this share of it


def _spread(history: Array, max_lag: int) -> tuple[float, float] | None:
    d = history[max_lag:] - history[:-max_lag]
    d = d[d != 0]  # a quantised series holds flat for stretches; those zeros are not its noise
    return _robust_spread(d) if d.size >= 5 else None


def _stands_out(size: float, lag: int, short: int, centre: float, spread: float) -> bool:
    return size > max(centre, 0.0) * lag / short + JUMP_SIGMAS * spread


def _stretches(y: Array, history: Array, max_lag: int, limit: int) -> tuple[list[list[int]], Array, bool]:
    """The stretches of jumps in ``y`` ([first, last] points, in order), ``y`` without them, and
    whether ``y``'s newest change lag holds no change that stands out (growth has stopped)."""
    short = max(1, max_lag // 3)
    got = _spread(history, short) if y.size >= 3 and history.size > max_lag + 2 else None
    if got is None:
        return [], y, False
    centre, spread = got
    out = y.copy()
    found: list[tuple[int, int]] = []
    for _ in range(limit):
        size, at, lag = _largest_change(out, short)
        if not _stands_out(size, lag, short, centre, spread):
            break
        _shift_out(out, size, at, lag)
        found.append((at, at + lag))
    stretches: list[list[int]] = []
    for first, last in sorted(found):
        if stretches and first - stretches[-1][1] < short:
            stretches[-1][1] = max(stretches[-1][1], last)
        else:
            stretches.append([first, last])
    size, _, lag = _largest_change(y[-(short + 1) :], short)
    return stretches, out, not _stands_out(size, lag, short, centre, spread)


def jumps(y: Array, history: Array, max_lag: int, limit: int = 8) -> int:
    """How many jumps make the rise of ``y`` (bin minima ending ``history``), or 0 when it is not
    made of jumps: a ramp among them, ``y`` without them still rising by JUMP_SHARE of its rise,
    or the newest still going on: within ``max_lag`` points of the end, unless it was short
    and growth has stopped since (a leak that has just begun reads as a jump until it goes on;
    an allocator's new segment is over within a minute)."""
    n = y.size
    stretches, out, stopped = _stretches(y, history, max_lag, limit)
    rise = ols_slope(y) * (n - 1) if n >= 2 else 0.0
    if not stretches or rise <= 0 or ols_slope(out) * (n - 1) >= JUMP_SHARE * rise:
        return 0
    first, last = stretches[-1]
    over = n - 1 - last >= max_lag or (stopped and last - first <= max(1, max_lag // 3))
    if any(b - a > max_lag for a, b in stretches) or not over:
        return 0
    return len(stretches)


def counted_rate(slope: float, raw: Array, judged: int, n: int, max_lag: int) -> tuple[int, float]:
    """(jumps, ``slope`` scaled to their count's 90% lower bound) for a span of the newest ``n``
    of the ``judged`` newest bin minima of ``raw`` (NaN: an empty bin); (0, nan) when its rise
    is not made of jumps."""
    judged_raw = despiked(raw[np.isfinite(raw)][-judged:])  # a spike is not a jump
    k = jumps(judged_raw[-n:], judged_raw, max_lag)
    return (k, slope * steps_lower(k, Z90) / k) if k else (0, math.nan)


def steps_lower(k: int, z: float) -> float:
    """One-sided lower confidence bound, at ``z`` standard normal deviates, on the mean count
    of a Poisson process seen to make ``k`` steps (Wilson-Hilferty; within 1% of the chi-square
    bound from k = 3). A rate read off a few steps is that uncertain: 3 steps at z = 1.28 are
    consistent with a mean of 1.1, so 3 chunks of an allocator settling pass for a leak's rate."""
    if k <= 0:
        return 0.0
    return k * max(0.0, 1.0 - 1.0 / (9.0 * k) - z / (3.0 * math.sqrt(k))) ** 3
