"""The leak verdict for one memory series: one judgement per evaluation, a persistence rule
over judgements, and a replay of a recorded trace as the live monitor would have judged it.

A judgement is positive when, over the analysis window after warm-up,
  * the troughs (a trailing-minimum envelope) trend upward: Mann-Kendall with the Hamed-Rao
    correction, one-sided p below ``alpha``, within the blocks either side of the single
    largest level shift when one stands out (one step is not a leak; a staircase is);
  * the Theil-Sen slope of those troughs is at least the series' floor (bytes/hour); and
  * the newest half of the window still grows at half the floor or more (a leak keeps
    growing; a warm-up tail or a swing that has turned does not).
The verdict flips to suspected only after judgements have been positive for ``persistence``
seconds. It clears only after the leak's signs have been gone as long (hysteresis): a
suspected series "holds" while its troughs still trend up (p below ten times ``alpha``), at
half the floor or more, and still grow in the newest third of the window; a noisy third
that merely slows down does not clear a verdict.

Pure numpy (no torch, no scipy.stats), so ``soakd analyze`` starts fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from soakd.analysis.trend import (
    Array,
    lower_envelope,
    mann_kendall,
    remove_largest_step,
    theil_sen,
    warmup_end,
)

MIB = float(1 << 20)
DEFAULT_FLOOR_BYTES_PER_HOUR = 2 * MIB


@dataclass(frozen=True)
class DetectorParams:
    warmup: float = 1800.0  # seconds ignored at the start of the run
    window: float = 6 * 3600.0  # seconds of history judged (and its newest half)
    trough_span: float = 1800.0  # seconds; the lower envelope rides out sawtooth up to this period
    bin: float = 300.0  # seconds between envelope points
    alpha: float = 0.001  # one-sided Mann-Kendall significance
    persistence: float = 1800.0  # seconds a judgement must hold before the verdict flips
    min_span: float = 3600.0  # seconds of post-warm-up data before any judgement

    @classmethod
    def from_config(cls, leak: Any) -> DetectorParams:
        """From a :class:`soakd.config.LeakConfig` (duck-typed: fields it lacks keep defaults)."""
        names = ("warmup", "window", "trough_span", "bin", "alpha", "persistence", "min_span")
        kw = {f: getattr(leak, f) for f in names if getattr(leak, f, None) is not None}
        return cls(**kw)


def floor_for(series: str, table: dict[str, float] | None) -> float:
    """The series' slope floor from the ``leak.min_slope_bytes_per_hour`` table ("default" key)."""
    table = table or {}
    return float(table.get(series, table.get("default", DEFAULT_FLOOR_BYTES_PER_HOUR)))


@dataclass(frozen=True)
class Judgement:
    positive: bool
    slope_bytes_per_hour: float  # nan until there is enough data
    p_value: float  # one-sided, increasing trend; 1.0 until there is enough data
    reason: str  # why it is (not) positive, for logs and events
    start: float = math.nan  # first time judged (after warm-up and any detected warm-up tail)
    bins: int = 0
    last_value: float = math.nan
    holds: bool = False  # enough to keep a verdict that is already suspected

    def keeps(self, suspected: bool) -> bool:
        """The judgement to feed the persistence rule, given the current verdict."""
        return self.holds if suspected else self.positive


def judge(t: Array, v: Array, params: DetectorParams, floor: float, *, now: float | None = None,
          since: float | None = None) -> Judgement:
    """Judge samples (t seconds, v bytes) at time ``now``; the run started at ``since``.

    Judges the whole window and its newest half: the long view catches slow staircases, the
    short one a leak that started late. Positive when either is.
    """
    if t.size == 0:
        return Judgement(False, math.nan, 1.0, "no data")
    now = float(t[-1]) if now is None else now
    since = float(t[0]) if since is None else since
    first = since + params.warmup
    long = _judge_span(t, v, params, floor, max(first, now - params.window), now)
    if now - first <= params.window / 2 + params.bin or long.positive:
        return long
    short = _judge_span(t, v, params, floor, max(first, now - params.window / 2), now)
    best = short if short.positive and not long.positive else long
    return replace(best, positive=long.positive or short.positive, holds=long.holds or short.holds)


def _rate(x: Array, y: Array, lo: float, hi: float) -> float:
    """Rise per hour between the medians of the [lo, mid) and [mid, hi] halves of a span."""
    mid = (lo + hi) / 2
    a, b = y[(x >= lo) & (x < mid)], y[(x >= mid) & (x <= hi)]
    if a.size == 0 or b.size == 0:
        return math.nan
    return float(np.median(b) - np.median(a)) / ((hi - lo) / 2) * 3600.0


def _judge_span(
    t: Array, v: Array, params: DetectorParams, floor: float, start: float, now: float
) -> Judgement:
    sel = (t >= start) & (t <= now)
    last = float(v[sel][-1]) if sel.any() else math.nan
    if now - start < params.min_span or not sel.any():
        return Judgement(False, math.nan, 1.0, "warming up", start, 0, last)
    tb, yb = lower_envelope(t[sel], v[sel], params.trough_span, params.bin, end=now)
    if tb.size < 6:
        return Judgement(False, math.nan, 1.0, "too few samples", start, int(tb.size), last)
    knee = warmup_end(tb, yb)
    if knee:
        # What came before the knee was warm-up; judge only after it, once there is enough.
        start = float(tb[knee])
        if now - start < params.min_span:
            return Judgement(False, math.nan, 1.0, "warming up (growth is levelling off)", start, 0, last)
        tb, yb = tb[knee:], yb[knee:]
    yd, split = remove_largest_step(yb)
    # Envelope points closer than the trough span share samples: dependent by construction.
    test = mann_kendall(yb, split=split, known_lags=max(0, round(params.trough_span / params.bin) - 1))
    slope = theil_sen(tb, yb, split) * 3600.0
    # Rise from the middle third's median to the newest third's, against the rise from the
    # oldest third's to the middle's (on the series with the level shift taken out):
    # a leak keeps its pace, a warm-up tail slows down, a swing that has turned goes flat.
    x0, x1 = float(tb[0]), float(tb[-1])
    third = (x1 - x0) / 3
    old, new = _rate(tb, yd, x0, x0 + 2 * third), _rate(tb, yd, x0 + third, x1)
    # Weaker than positive (which implies it): what keeps an existing verdict.
    hold_alpha = max(params.alpha, min(0.05, 10 * params.alpha))
    holds = test.p_increasing < hold_alpha and slope >= 0.5 * floor and new >= 0.5 * floor
    if test.p_increasing >= params.alpha:
        reason = f"no significant upward trend (p={test.p_increasing:.3g})"
    elif slope < floor:
        reason = f"slope {slope / MIB:.2f} MiB/h below the floor {floor / MIB:.2f} MiB/h"
    elif not new >= 0.5 * floor or not new >= 0.4 * old:
        reason = f"growth is slowing down ({old / MIB:.2f} then {new / MIB:.2f} MiB/h)"
    else:
        reason = f"troughs rise {slope / MIB:.2f} MiB/h (p={test.p_increasing:.3g})"
        return Judgement(True, slope, test.p_increasing, reason, start, int(tb.size), last, holds)
    return Judgement(False, slope, test.p_increasing, reason, start, int(tb.size), last, holds)


@dataclass
class Persistence:
    """Flips the verdict only after judgements have agreed for ``hold`` seconds."""

    hold: float
    suspected: bool = False
    _since: float | None = None  # when judgements started disagreeing with the verdict

    def update(self, now: float, positive: bool) -> bool:
        """Feed one judgement; returns True when the verdict flipped."""
        if positive == self.suspected:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        if now - self._since >= self.hold:
            self.suspected, self._since = positive, None
            return True
        return False

    @property
    def rising(self) -> bool:
        """Judgements disagree with a clear verdict: suspicion is building."""
        return not self.suspected and self._since is not None


@dataclass
class Replay:
    """A recorded trace judged as the live monitor would have judged it."""

    final: Judgement
    suspected: bool
    first_suspected_at: float | None  # seconds from the start of the trace
    flips: list[tuple[float, bool]] = field(default_factory=list)
    evaluations: int = 0


def replay(t: Array, v: Array, params: DetectorParams, floor: float, *, step: float = 600.0) -> Replay:
    """Judge a trace every ``step`` seconds from its start, with persistence, up to its end."""
    if t.size == 0:
        return Replay(Judgement(False, math.nan, 1.0, "no data"), False, None)
    t0, t_end = float(t[0]), float(t[-1])
    first_eval = t0 + params.warmup + params.min_span
    times = list(np.arange(first_eval, t_end, step))
    if not times or times[-1] < t_end:
        times.append(t_end)
    state = Persistence(params.persistence)
    flips: list[tuple[float, bool]] = []
    first: float | None = None
    j = Judgement(False, math.nan, 1.0, "warming up")
    for now in times:
        hi = int(np.searchsorted(t, now, side="right"))
        j = judge(t[:hi], v[:hi], params, floor, now=now, since=t0)
        if state.update(now, j.keeps(state.suspected)):
            flips.append((now - t0, state.suspected))
            if state.suspected and first is None:
                first = now - t0
    return Replay(j, state.suspected, first, flips, len(times))
