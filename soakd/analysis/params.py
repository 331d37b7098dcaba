"""The leak detector's settings (``[leak]``, scaled for accelerated runs), its false-alarm
budget over an unbounded run (:meth:`DetectorParams.span_alpha`), and each series' slope floor."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from soakd.names import TARGET_METRIC_PREFIX

MIB = float(1 << 20)  # the one place the analysis modules take it from
DAY = 86400.0
DEFAULT_FLOOR_BYTES_PER_HOUR = 2 * MIB
DEFAULT_WINDOW = 6 * 3600.0
ACCELERATED_BELOW = 1800.0  # a window shorter than this is an accelerated run


@dataclass(frozen=True)
class DetectorParams:
    warmup: float = 900.0  # seconds ignored at the start of the run (a floor: the data may say later)
    window: float = 6 * 3600.0  # seconds of history judged at most (the longest span)
    trough_span: float = 1800.0  # seconds; the trailing minimum rides out sawtooth up to this period
    bin: float = 60.0  # seconds between trough points
    alpha: float = 0.01  # false-alarm probability over a whole leak-free run, however long
    persistence: float = 1800.0  # seconds a suspected verdict's signs must be gone before it clears
    min_span: float = 900.0  # seconds: the shortest span judged
    floor_scale: float = 1.0  # the slope floor's factor: time runs this much faster (accelerated runs)
    cycle_seconds: float | None = None  # a known load period: judged per cycle (soakd.analysis.cycles)

    @classmethod
    def from_config(cls, leak: Any) -> DetectorParams:
        """From a :class:`soakd.config.LeakConfig` (duck-typed: fields it lacks keep defaults).

        A window shorter than the default time scales (an accelerated test run) scales them
        down with it: the shortest span, the trough span and the persistence hold at most a
        third of the window, points at most a thirtieth apart."""
        names = ("warmup", "window", "trough_span", "bin", "alpha", "persistence", "min_span")
        kw = {f: getattr(leak, f) for f in names if getattr(leak, f, None) is not None}
        return cls(**kw, cycle_seconds=getattr(leak, "cycle", None)).scaled()

    def scaled(self) -> DetectorParams:
        w = self.window
        bin_ = min(self.bin, w / 30.0)
        # A window under 30 min is an accelerated run (a test, a demo): time runs faster by
        # the default window's ratio, and so does a leak in bytes/hour; the floor scales too
        # (else a fresh interpreter's first minute of allocations is a "leak").
        scale = DEFAULT_WINDOW / w if w < ACCELERATED_BELOW else 1.0
        return replace(
            self,
            bin=bin_,
            trough_span=min(self.trough_span, w / 3.0),
            min_span=max(min(self.min_span, w / 3.0), 5 * bin_),
            persistence=min(self.persistence, w / 3.0),
            floor_scale=scale,
        )

    @property
    def spans(self) -> list[int]:
        """Span lengths judged, in points: min_span doubling, up to the window."""
        lo = max(5, round(self.min_span / self.bin))
        hi = max(lo, round(self.window / self.bin))
        out = []
        n = lo
        while n < hi:
            out.append(n)
            n *= 2
        return [*out, hi]

    def span_alpha(self, points: int, judged: float = 0.0) -> float:
        """The one-sided p-value a span of ``points`` must beat after ``judged`` seconds of
        judging: alpha spent over epochs of judged time (see the module docstring)."""
        unit = max(DAY, self.window)
        j = 0 if judged < unit else 1 + math.floor(math.log2(judged / unit))
        epoch = unit * (1 if j == 0 else 2 ** (j - 1))  # lengths 1, 1, 2, 4 ... units
        share = self.alpha * 6.0 / (math.pi**2 * (j + 1) ** 2)
        return share * points * self.bin / (len(self.spans) * epoch)


def in_bytes(series: str) -> bool:
    """Whether the series is memory in bytes; a scraped server gauge (``target_metric:NAME``) is
    in its own unit (a ratio, a count, microseconds)."""
    return not series.startswith(TARGET_METRIC_PREFIX)


def floor_for(series: str, table: dict[str, float] | None, scale: float = 1.0) -> float:
    """The series' slope floor from the ``leak.min_slope_bytes_per_hour`` table ("default" key);
    the built-in default times ``scale`` (``DetectorParams.floor_scale``) when the table has none.

    A scraped server gauge (``target_metric:NAME``) is in its own unit (a ratio, a count,
    microseconds), not bytes: only its own entry applies, else no floor (any rise the trend
    test is sure of)."""
    table = table or {}
    if not in_bytes(series):
        return float(table.get(series, 0.0))
    got = table.get(series, table.get("default"))
    return float(got) if got is not None else DEFAULT_FLOOR_BYTES_PER_HOUR * scale
