"""Memory series in a summary or report: range, robust trend and the leak verdict per series.

The verdict is the live leak monitor's when it has one (it applies persistence over many
judgements); otherwise one judgement by the same detector over the recorded samples. A series
the detector cannot judge yet (warm-up, too few samples) has ``leak_suspected`` None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from soakd.analysis.detector import judge
from soakd.analysis.params import DetectorParams, floor_for
from soakd.analysis.trend import theil_sen
from soakd.config import LeakConfig
from soakd.record.types import MemorySeries

Array = npt.NDArray[np.float64]
TREND_POINTS = 1000  # Theil-Sen is quadratic in points; an even subsample keeps it well under a second


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def trend_line(t: Array, v: Array) -> tuple[float, float] | None:
    """Theil-Sen (slope per second, intercept) of ``v`` over ``t``; None with under 3 points.

    As ``scipy.stats.theilslopes(v, t)`` (its default "separate" intercept: median(v) - slope *
    median(t)), without importing scipy.stats: that import costs every ``soakd run`` ~0.6 s."""
    if t.size < 3:
        return None
    idx = np.unique(np.linspace(0, t.size - 1, min(t.size, TREND_POINTS)).astype(np.int64))
    x, y = t[idx], v[idx]
    slope = theil_sen(x, y)
    return slope, float(np.median(y) - slope * np.median(x))


def series_summary(
    name: str, t: Array, v: Array, leak: LeakConfig, live: Mapping[str, Any] | None = None
) -> MemorySeries:
    return msgspec.convert(_series_figures(name, t, v, leak, live), MemorySeries)


def _series_figures(name: str, t: Array, v: Array, leak: LeakConfig, live: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": int(t.size)}
    if t.size == 0:
        return {**out, "leak_suspected": None, "verdict": "no data"}
    out.update(
        first=float(v[0]),
        last=float(v[-1]),
        min=float(v.min()),
        max=float(v.max()),
        seconds=round(float(t[-1] - t[0]), 3),
    )
    line = trend_line(t, v)
    out["trend_bytes_per_hour"] = None if line is None else round(line[0] * 3600.0, 3)
    # The live monitor's verdict (it applies persistence over many looks) when it has one; a series
    # it has not judged yet (warm-up, too little data) is "not judged", never "no leak".
    if live is not None and live.get("state") in ("leak", "ok"):
        suspected = bool(live["suspected"])
        out.update(
            leak_state=live["state"],
            leak_suspected=suspected,
            slope_bytes_per_hour=_finite(live.get("slope_bytes_per_hour")),
            p_value=_finite(live.get("p_value")),
            detectable_slope_bytes_per_hour=_finite(live.get("detectable_slope_bytes_per_hour")),
            judged_seconds=live.get("judged_seconds"),
            exhaustion_eta_seconds=_finite(live.get("exhaustion_eta_seconds")),
            verdict_source="leak monitor",
            verdict=("leak suspected: " if suspected else "no leak: ") + str(live.get("reason", "")),
        )
        return out
    j = judge(t, v, DetectorParams.from_config(leak), floor_for(name, leak.min_slope_bytes_per_hour))
    judged = math.isfinite(j.slope_bytes_per_hour)
    prefix = "leak suspected: " if j.positive else "no leak: " if judged else "not judged: "
    out.update(
        leak_state="leak" if j.positive else "ok" if judged else "not_judged",
        leak_suspected=j.positive if judged else None,
        slope_bytes_per_hour=_finite(j.slope_bytes_per_hour),
        p_value=_finite(j.p_value) if judged else None,
        detectable_slope_bytes_per_hour=_finite(j.detectable_bytes_per_hour) if judged else None,
        judged_seconds=round(j.judged_seconds, 1),
        verdict_source="detector on recorded samples",
        verdict=prefix + j.reason,
    )
    return out


def memory_block(
    samples: Mapping[str, tuple[Array, Array]], leak: LeakConfig, live: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, MemorySeries]:
    """``{series: summary}`` for every series with samples (``t`` unix seconds, ``v`` bytes)."""
    live = live or {}
    return {
        name: series_summary(
            name, np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64), leak, live.get(name)
        )
        for name, (t, v) in sorted(samples.items())
    }
