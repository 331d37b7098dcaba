"""Report plots: matplotlib figures as inline SVG text, no external resources.

Each function returns an ``<svg>`` element ready to paste into HTML: the XML prolog and DOCTYPE
are stripped, text stays text (``svg.fonttype = none``), and a run-independent hash salt keeps
the output reproducible. Figures are made as bare ``Figure`` objects, not through pyplot: pyplot's
global figure manager keeps every figure alive until it is closed, and its backend set-up adds
import time at each soak's end (no display is ever needed; ``savefig`` picks the SVG canvas).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure

from soakd.record.types import BatchBucket, ReplayArrivals, WindowRow
from soakd.report import units
from soakd.report.window_rows import series
from soakd.telemetry.histogram import HistSnapshot
from soakd.verdicts.memory import trend_line

MAX_POINTS = 2000  # per plotted line; beyond this a plot is slower to draw and no clearer
STYLE: Any = {  # Any: matplotlib types rc keys as a Literal union
    "svg.fonttype": "none",
    "svg.hashsalt": "soakd",
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_PROLOG = re.compile(r"^.*?(?=<svg)", re.DOTALL)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
STAGE_COLOURS = {
    "e2e": "#1f77b4",
    "queue": "#ff7f0e",
    "inference": "#2ca02c",
    "preprocess": "#9467bd",
    "postprocess": "#8c564b",
}
# Lines that may coincide (e2e is inference plus a small queue) must still be told apart:
# e2e is a wide translucent band drawn first with hollow rings larger than the other stages'
# markers, so it shows around a line drawn on top of it; each stage has its own marker.
STAGE_STYLE: dict[str, dict[str, Any]] = {
    "e2e": {"lw": 5.0, "alpha": 0.5, "marker": "o", "ms": 8, "mfc": "none", "mew": 1.6, "zorder": 1},
    "queue": {"lw": 1.3, "marker": "^", "ms": 4, "zorder": 3},
    "inference": {"lw": 1.3, "marker": "s", "ms": 3.5, "zorder": 4},
    "preprocess": {"lw": 1.3, "marker": "D", "ms": 3.5, "zorder": 3},
    "postprocess": {"lw": 1.3, "marker": "v", "ms": 4, "zorder": 3},
}
_OTHER_STYLE: dict[str, Any] = {"lw": 1.3, "marker": "x", "ms": 4, "zorder": 3}
NINES = (0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999)


def _legend_outside(ax: Any) -> None:
    """The legend right of the axes: never over the start of the lines."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _markevery(n: int) -> int:
    return max(1, n // 30)  # a few dozen markers per line at most: shapes, not a solid smear


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = _METADATA.sub("", _PROLOG.sub("", buf.getvalue(), count=1))
    return text.strip()


def _figure(height: float = 2.8) -> tuple[Figure, Any]:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8.0, height))
        ax = fig.add_subplot()
    return fig, ax


def _thin(x: npt.NDArray[np.float64], *ys: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], ...]:
    if x.size <= MAX_POINTS:
        return (x, *ys)
    idx = np.unique(np.linspace(0, x.size - 1, MAX_POINTS).astype(np.int64))
    return (x[idx], *(y[idx] for y in ys))


def _minutes(rows: Sequence[WindowRow]) -> npt.NDArray[np.float64]:
    return np.asarray([(r.t or 0.0) / 60.0 for r in rows], dtype=np.float64)


def throughput_plot(rows: Sequence[WindowRow]) -> str:
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(2.4)
        x = _minutes(rows)
        ax.plot(
            x,
            series(list(rows), "throughput_rps"),
            marker="o",
            ms=3,
            markevery=_markevery(len(rows)),
            lw=1.2,
            color="#1f77b4",
            label="ok requests/s",
        )
        errs = np.asarray([(r.errors or 0) / r.seconds if r.seconds else 0.0 for r in rows])
        if errs.any():
            ax.plot(
                x, errs, color="#d62728", lw=1.0, marker="x", ms=3, markevery=_markevery(len(rows)), label="errors/s"
            )
        _legend_outside(ax)
        ax.set_xlabel("minutes since start")
        ax.set_ylabel("requests/s (ok)")
        ax.set_ylim(bottom=0)
        return _svg(fig)


def latency_over_time_plot(rows: Sequence[WindowRow], stages: Sequence[str]) -> str:
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(3.2)
        x = _minutes(rows)
        every = _markevery(len(rows))
        for stage in stages:
            colour = STAGE_COLOURS.get(stage)
            style = {**STAGE_STYLE.get(stage, _OTHER_STYLE), "markevery": every}
            ax.plot(x, series(list(rows), "p99", stage), color=colour, label=f"{stage} p99", **style)
            ax.plot(
                x,
                series(list(rows), "p50", stage),
                color=colour,
                ls="--",
                label=f"{stage} p50",
                **{**style, "lw": style["lw"] * 0.7, "marker": None},
            )
        ax.set_yscale("log")
        ax.set_xlabel("minutes since start")
        ax.set_ylabel("latency (ms)")
        _legend_outside(ax)
        return _svg(fig)


def latency_distribution_plot(hists: dict[str, HistSnapshot]) -> str:
    """Percentile curves on a 'nines' axis: the tail is where soaks differ."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(3.0)
        x = -np.log10(1 - np.asarray(NINES))
        for stage, h in hists.items():
            if not h.count:
                continue
            y = [h.percentile(q) * 1e3 for q in NINES]
            ax.plot(x, y, color=STAGE_COLOURS.get(stage), label=stage, **STAGE_STYLE.get(stage, _OTHER_STYLE))
        ax.set_xticks(x, [f"p{q * 100:g}" for q in NINES])
        ax.set_yscale("log")
        ax.set_xlabel("percentile")
        ax.set_ylabel("latency (ms)")
        _legend_outside(ax)
        return _svg(fig)


def batch_size_plot(buckets: Sequence[BatchBucket]) -> str:
    """Batches per size bucket (``le``: its upper bound, ``count``: batches)."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(2.4)
        labels = [f"≤{b.le:g}" for b in buckets]
        ax.bar(range(len(buckets)), [b.count for b in buckets], color="#1f77b4")
        ax.set_xticks(range(len(buckets)), labels)
        ax.set_xlabel("requests per batch")
        ax.set_ylabel("batches")
        return _svg(fig)


def memory_plot(name: str, t: npt.NDArray[np.float64], v: npt.NDArray[np.float64], t0: float) -> str:
    """A memory series in MiB with its Theil-Sen trend line."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(2.2)
        mib = float(1 << 20)
        xs, ys = _thin((t - t0) / 60.0, v / mib)
        ax.plot(xs, ys, lw=1.0, color="#1f77b4", label=name)
        line = trend_line(t, v)
        if line is not None and t.size:
            slope, intercept = line
            ends = np.asarray([t[0], t[-1]])
            ax.plot(
                (ends - t0) / 60.0,
                (slope * ends + intercept) / mib,
                color="#d62728",
                lw=1.2,
                ls="--",
                label=f"trend {units.with_unit(slope * 3600.0, 'MiB/h')}",
            )
        ax.set_xlabel("minutes since start")
        ax.set_ylabel("MiB")
        if not math.isclose(float(np.nanmax(ys)), float(np.nanmin(ys))):
            ax.ticklabel_format(axis="y", useOffset=False)
        _legend_outside(ax)
        return _svg(fig)


def arrivals_plot(arrivals: ReplayArrivals) -> str:
    """A replayed trace's arrivals per minute (by intended time) beside the achieved: sent and
    completed per minute. A gap between them is the server, or soakd, falling behind."""
    width = float(arrivals.bucket_seconds) or 60.0
    per_minute = 60.0 / width
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(2.6)
        n = max(len(arrivals.intended), len(arrivals.sent), len(arrivals.completed))
        x = np.arange(n, dtype=np.float64) * width / 60.0
        lines = (
            ("intended", "trace (intended)", {"color": "#7f7f7f", "lw": 4.0, "alpha": 0.5, "zorder": 1}),
            ("sent", "sent", {"color": "#1f77b4", "lw": 1.3, "marker": "o", "ms": 3, "zorder": 3}),
            ("completed", "completed", {"color": "#2ca02c", "lw": 1.3, "ls": "--", "marker": "s", "ms": 3}),
        )
        for key, label, style in lines:
            counts: list[int] = getattr(arrivals, key)
            y = np.zeros(n, dtype=np.float64)
            y[: len(counts)] = np.asarray(counts, dtype=np.float64) * per_minute
            xs, ys = _thin(x, y)
            ax.step(xs, ys, where="post", label=label, markevery=_markevery(xs.size), **style)
        ax.set_xlabel("minutes since start")
        ax.set_ylabel("requests per minute")
        ax.set_ylim(bottom=0)
        _legend_outside(ax)
        return _svg(fig)
