"""Per-window figures (throughput, errors, per-stage percentiles) over a run.

They go into the summary and report JSON as ``windows: [{t, seconds, throughput_rps, ok,
errors, latency_ms: {stage: {p50, p90, p99}}}, ...]``: what the report plots over time and
what ``soakd compare`` resamples to tell a regression from noise. The list stays bounded: past
``max_rows`` the rows are merged in pairs and later windows span twice as many ticks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

from soakd.summary import seconds_to_ms
from soakd.telemetry.histogram import HistSnapshot

MAX_ROWS = 720  # a day at 2-minute resolution; a few hundred kB of JSON at most
WINDOW_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


class StatsLike(Protocol):
    """What the recorder reads from the engine (``soakd.load.engine.EngineStats``)."""

    elapsed: float
    completed: dict[str, int]
    stages: dict[str, HistSnapshot]



def window_row(t: float, seconds: float, outcomes: dict[str, int],
               hists: dict[str, HistSnapshot]) -> dict[str, Any]:
    ok = int(outcomes.get("ok", 0))
    return {
        "t": round(t, 3),
        "seconds": round(seconds, 3),
        "throughput_rps": round(ok / seconds, 3) if seconds > 0 else 0.0,
        "ok": ok,
        "errors": int(sum(v for k, v in outcomes.items() if k != "ok")),
        "latency_ms": {s: {k: seconds_to_ms(h.percentile(q)) for k, q in WINDOW_QUANTILES.items()}
                       for s, h in hists.items() if h.count},
    }


def _merge_pair(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two adjacent rows as one: counts add exactly; percentiles are count-weighted means
    (the histograms behind them are gone by now), close enough for a trend and a resample."""
    seconds = a["seconds"] + b["seconds"]
    wa, wb = max(a["ok"], 1), max(b["ok"], 1)
    latency: dict[str, dict[str, float | None]] = {}
    for stage in {**a["latency_ms"], **b["latency_ms"]}:
        la, lb = a["latency_ms"].get(stage, {}), b["latency_ms"].get(stage, {})
        latency[stage] = {}
        for k in WINDOW_QUANTILES:
            va, vb = la.get(k), lb.get(k)
            vals = [(v, w) for v, w in ((va, wa), (vb, wb)) if v is not None]
            weight = sum(w for _, w in vals)
            latency[stage][k] = round(sum(v * w for v, w in vals) / weight, 4) if vals else None
    ok = a["ok"] + b["ok"]
    return {"t": b["t"], "seconds": round(seconds, 3),
            "throughput_rps": round(ok / seconds, 3) if seconds > 0 else 0.0,
            "ok": ok, "errors": a["errors"] + b["errors"], "latency_ms": latency}


class WindowRecorder:
    """Fed the engine's stats at every status tick; emits a row every ``stride`` ticks."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        self.max_rows = max(2, max_rows)
        self.rows: list[dict[str, Any]] = []
        self.stride = 1
        self._ticks = 0
        self._base: StatsLike | None = None

    def start(self, stats: StatsLike) -> None:
        self._base = stats

    def add(self, stats: StatsLike) -> None:
        if self._base is None:
            self._base = stats
            return
        self._ticks += 1
        if self._ticks < self.stride:
            return
        base = self._base
        outcomes = {k: v - base.completed.get(k, 0) for k, v in stats.completed.items()}
        hists = {s: h - base.stages[s] if s in base.stages else h for s, h in stats.stages.items()}
        self.rows.append(window_row(stats.elapsed, stats.elapsed - base.elapsed, outcomes, hists))
        self._base, self._ticks = stats, 0
        if len(self.rows) > self.max_rows:
            self.rows = [_merge_pair(*self.rows[i:i + 2]) if i + 1 < len(self.rows) else self.rows[i]
                         for i in range(0, len(self.rows), 2)]
            self.stride *= 2


def rows_from_windows(windows: Iterable[tuple[float, float, dict[str, int], dict[str, HistSnapshot]]],
                      max_rows: int = MAX_ROWS) -> list[dict[str, Any]]:
    """Rows from stored windows ``(t_start, t_end, outcomes, hists)``, oldest first; ``t`` is
    seconds from the first window's start (wall time: gaps between segments stay visible)."""
    rows: list[dict[str, Any]] = []
    origin: float | None = None
    for t0, t1, outcomes, hists in windows:
        origin = t0 if origin is None else origin
        rows.append(window_row(t1 - origin, t1 - t0, outcomes, hists))
    while len(rows) > max_rows:
        rows = [_merge_pair(*rows[i:i + 2]) if i + 1 < len(rows) else rows[i] for i in range(0, len(rows), 2)]
    return rows


def series(rows: list[dict[str, Any]], key: str, stage: str | None = None) -> list[float]:
    """One figure per window (NaN where a window has none): ``throughput_rps``, or a stage's
    percentile (``key`` = p50/p90/p99, ``stage`` = e2e...)."""
    out: list[float] = []
    for r in rows:
        v = r.get(key) if stage is None else r.get("latency_ms", {}).get(stage, {}).get(key)
        out.append(math.nan if v is None else float(v))
    return out
