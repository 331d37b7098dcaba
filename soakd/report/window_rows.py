"""Per-window figures (throughput, errors, per-stage percentiles) over a run: the bounded table,
and its rows rebuilt from stored windows. The live cursor is :mod:`soakd.run.windows`.

They go into the summary and report JSON as ``windows: [{t, seconds, throughput_rps, ok,
errors, latency_ms: {stage: {p50, p90, p99}}}, ...]``: what the report plots over time and
what ``soakd compare`` resamples to tell a regression from noise.

The rows live in one float array allocated (and touched) up front, not in a list of dicts:
the recorder runs for the whole soak, and a table that grew by a dict per tick read as
about 1 MiB/h of creep in the daemon's own RSS. Past ``max_rows`` the rows are merged in
pairs in place and later windows span twice as many ticks, so the table never grows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from soakd.record.types import WindowPercentiles, WindowRow
from soakd.record.write import seconds_to_ms
from soakd.telemetry.histogram import HistSnapshot

MAX_ROWS = 720  # a day at 2-minute resolution; a few hundred kB of JSON at most
WINDOW_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
_T, _SECONDS, _OK, _ERRORS = range(4)  # the fixed columns; then p50/p90/p99 (seconds) per stage
_FIXED = 4
_NQ = len(WINDOW_QUANTILES)


class WindowTable:
    """A bounded table of window rows for a fixed set of stages; NaN where a window has no
    figure. Merging a pair adds the counts exactly and takes the count-weighted mean of the
    percentiles (the histograms behind them are gone by then): close enough for a trend and
    a resample."""

    def __init__(self, stages: Sequence[str], max_rows: int = MAX_ROWS) -> None:
        self.stages = tuple(stages)
        self.max_rows = max(2, max_rows)
        self._data = np.full((self.max_rows + 1, _FIXED + _NQ * len(self.stages)), np.nan)
        self._n = 0
        self.merges = 0  # how many times the rows were merged in pairs

    def append(self, t: float, seconds: float, outcomes: dict[str, int], hists: dict[str, HistSnapshot]) -> None:
        row = self._data[self._n]
        row[:] = np.nan
        row[_T], row[_SECONDS] = t, seconds
        row[_OK] = outcomes.get("ok", 0)
        row[_ERRORS] = sum(v for k, v in outcomes.items() if k != "ok")
        for i, stage in enumerate(self.stages):
            h = hists.get(stage)
            if h is not None and h.count:
                col = _FIXED + _NQ * i
                row[col : col + _NQ] = [h.percentile(q) for q in WINDOW_QUANTILES.values()]
        self._n += 1
        if self._n > self.max_rows:
            self._merge_pairs()

    def _merge_pairs(self) -> None:
        n, d = self._n, self._data
        pairs = n // 2
        a, b = d[0 : 2 * pairs : 2], d[1 : 2 * pairs : 2]
        merged = b.copy()  # t: the later row's end
        merged[:, _SECONDS] = a[:, _SECONDS] + b[:, _SECONDS]
        merged[:, _OK] = a[:, _OK] + b[:, _OK]
        merged[:, _ERRORS] = a[:, _ERRORS] + b[:, _ERRORS]
        qa, qb = a[:, _FIXED:], b[:, _FIXED:]
        wa, wb = np.maximum(a[:, _OK : _OK + 1], 1.0), np.maximum(b[:, _OK : _OK + 1], 1.0)
        has_a, has_b = ~np.isnan(qa), ~np.isnan(qb)
        weight = wa * has_a + wb * has_b
        total = np.where(has_a, qa * wa, 0.0) + np.where(has_b, qb * wb, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            merged[:, _FIXED:] = np.where(weight > 0, total / weight, np.nan)
        odd = d[n - 1].copy() if n % 2 else None
        d[:pairs] = merged
        if odd is not None:
            d[pairs] = odd
        self._n = pairs + (1 if odd is not None else 0)  # append() clears a row before reuse
        self.merges += 1

    def rows(self) -> list[WindowRow]:
        """The rows, oldest first."""
        return [self._row(r) for r in self._data[: self._n]]

    def _row(self, r: npt.NDArray[np.float64]) -> WindowRow:
        seconds, ok = float(r[_SECONDS]), int(r[_OK])
        latency: dict[str, WindowPercentiles] = {}
        for i, stage in enumerate(self.stages):
            vals = r[_FIXED + _NQ * i : _FIXED + _NQ * (i + 1)]
            if not np.isnan(vals).all():
                p50, p90, p99 = (seconds_to_ms(float(v)) for v in vals)
                latency[stage] = WindowPercentiles(p50=p50, p90=p90, p99=p99)
        return WindowRow(
            t=round(float(r[_T]), 3),
            seconds=round(seconds, 3),
            throughput_rps=round(ok / seconds, 3) if seconds > 0 else 0.0,
            ok=ok,
            errors=int(r[_ERRORS]),
            latency_ms=latency,
        )


def rows_from_windows(
    windows: Iterable[tuple[float, float, dict[str, int], dict[str, HistSnapshot]]], max_rows: int = MAX_ROWS
) -> list[WindowRow]:
    """Rows from stored windows ``(t_start, t_end, outcomes, hists)``, oldest first; ``t`` is
    seconds from the first window's start (wall time: gaps between segments stay visible).
    Past ``max_rows``, runs of 2, 4, 8... stored windows make one row; their histograms add,
    so the percentiles stay exact."""
    stored = list(windows)
    stages: dict[str, None] = {}  # every stage any window has, in first-seen order
    for window in stored:
        stages.update(dict.fromkeys(window[3]))
    table = WindowTable(list(stages), max_rows)
    group = 1
    while math.ceil(len(stored) / group) > table.max_rows:
        group *= 2
    origin = stored[0][0] if stored else 0.0
    for i in range(0, len(stored), group):
        chunk = stored[i : i + group]
        outcomes: dict[str, int] = {}
        hists: dict[str, HistSnapshot] = {}
        for _, _, counts, hs in chunk:
            for k, v in counts.items():
                outcomes[k] = outcomes.get(k, 0) + v
            for s, h in hs.items():
                hists[s] = hists[s] + h if s in hists else h
        table.append(chunk[-1][1] - origin, sum(t1 - t0 for t0, t1, _, _ in chunk), outcomes, hists)
    return table.rows()


def series(rows: Sequence[WindowRow], key: str, stage: str | None = None) -> list[float]:
    """One figure per window (NaN where a window has none): ``throughput_rps``, or a stage's
    percentile (``key`` = p50/p90/p99, ``stage`` = e2e...)."""
    out: list[float] = []
    for r in rows:
        if stage is None:
            v = r.throughput_rps if key == "throughput_rps" else None
        else:
            figures = r.latency_ms.get(stage) if isinstance(r.latency_ms, dict) else None
            v = None if figures is None else {"p50": figures.p50, "p90": figures.p90, "p99": figures.p99}.get(key)
        out.append(math.nan if v is None else float(v))
    return out
