"""``soakd compare A.json B.json``: B against the baseline A, side by side, with regressions.

A change is a regression only when it is past the ``[compare]`` threshold *and* beyond noise:
the bootstrap interval of the difference in per-window means (``windows`` in the JSON) must
exclude zero on the bad side. Windows next to each other are correlated, so the resampling
draws blocks of neighbouring windows (circular block bootstrap), not single windows. Without
per-window data only the threshold applies, and the output says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

from soakd.config import CompareConfig
from soakd.report.slo import error_ratio
from soakd.report.windows import series

MIN_WINDOWS = 3  # fewer per side: no interval, threshold only
# Fingerprint keys a result is bound to: a difference means the runs are not like for like.
FINGERPRINT_KEYS = ("model", "model_sha256", "input", "device_name", "torch_version", "cuda_version",
                    "cudnn_version", "driver_version")
CONFIG_IGNORED = ("output", "state", "metrics", "otel")  # where a run writes, not what it measures
STAGE_ORDER = ("e2e", "queue", "inference", "preprocess", "postprocess")


@dataclass
class Row:
    metric: str
    a: float | None
    b: float | None
    unit: str
    change: str = ""
    interval: str = ""
    regression: bool = False
    note: str = ""


def block_bootstrap_ci(xa: npt.NDArray[np.float64], xb: npt.NDArray[np.float64], confidence: float,
                       resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    """Interval of mean(xb) - mean(xa), resampling circular blocks of about n^(1/3) windows."""

    def means(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        n = x.size
        block = max(1, round(n ** (1 / 3)))
        nblocks = math.ceil(n / block)
        starts = rng.integers(0, n, size=(resamples, nblocks))
        idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(resamples, -1)[:, :n] % n
        return np.asarray(x[idx].mean(axis=1), dtype=np.float64)

    diff = means(xb) - means(xa)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(diff, [tail, 100 - tail])
    return float(lo), float(hi)


def _windows(doc: dict[str, Any], key: str, stage: str | None = None) -> npt.NDArray[np.float64]:
    vals = np.asarray(series(doc.get("windows") or [], key, stage), dtype=np.float64)
    return vals[np.isfinite(vals)]


def _pct(a: float, b: float) -> str:
    return f"{(b - a) / a * 100:+.1f}%" if a else ("+0.0%" if a == b else "n/a")


class Comparison:
    def __init__(self, a: dict[str, Any], b: dict[str, Any], cfg: CompareConfig, seed: int = 0) -> None:
        self.a, self.b, self.cfg = a, b, cfg
        self.rng = np.random.default_rng(seed)
        self.rows: list[Row] = []
        self.warnings: list[str] = []

    # ------------------------------------------------------------ noise

    def _beyond_noise(self, key: str, stage: str | None, worse_if_higher: bool) -> tuple[bool | None, str]:
        xa, xb = _windows(self.a, key, stage), _windows(self.b, key, stage)
        if xa.size < MIN_WINDOWS or xb.size < MIN_WINDOWS:
            return None, ""
        lo, hi = block_bootstrap_ci(xa, xb, self.cfg.confidence, self.cfg.resamples, self.rng)
        text = f"{self.cfg.confidence:.0%} CI of diff [{lo:+.4g}, {hi:+.4g}]"
        return (lo > 0 if worse_if_higher else hi < 0), text

    def _judge(self, row: Row, past_threshold: bool, key: str, stage: str | None,
               worse_if_higher: bool) -> None:
        beyond, row.interval = self._beyond_noise(key, stage, worse_if_higher)
        if not past_threshold:
            return
        if beyond is None:
            row.regression, row.note = True, "past threshold (no per-window data: no noise estimate)"
        elif beyond:
            row.regression, row.note = True, "past threshold and beyond noise"
        else:
            row.note = "past threshold but within noise"

    # ------------------------------------------------------------ metrics

    def throughput(self) -> None:
        a, b = self.a.get("throughput_rps"), self.b.get("throughput_rps")
        row = Row("throughput", a, b, "req/s")
        if a is not None and b is not None:
            row.change = _pct(a, b)
            past = a > 0 and (a - b) / a > self.cfg.max_throughput_drop
            self._judge(row, past, "throughput_rps", None, worse_if_higher=False)
        self.rows.append(row)

    def latency(self) -> None:
        la: dict[str, dict[str, Any]] = self.a.get("latency_ms", {})
        lb: dict[str, dict[str, Any]] = self.b.get("latency_ms", {})
        extra = sorted((set(la) | set(lb)) - set(STAGE_ORDER))
        stages = [s for s in STAGE_ORDER if s in la or s in lb] + extra
        for stage in stages:
            for q in ("p50", "p90", "p99", "p999"):
                a, b = la.get(stage, {}).get(q), lb.get(stage, {}).get(q)
                row = Row(f"{q} {stage}", a, b, "ms")
                if a is not None and b is not None:
                    row.change = _pct(a, b)
                    if q == "p99":  # the gated percentile; the others are context
                        past = a > 0 and (b - a) / a > self.cfg.max_p99_increase
                        self._judge(row, past, "p99", stage, worse_if_higher=True)
                self.rows.append(row)

    def errors(self) -> None:
        ra, rb = self.a.get("requests", {}), self.b.get("requests", {})
        a, b = error_ratio(ra), error_ratio(rb)
        row = Row("error ratio", a, b, "")
        if a is not None and b is not None:
            row.change = f"{b - a:+.4g}"
            na, nb = sum(ra.values()), sum(rb.values())
            if b - a > self.cfg.max_error_ratio_increase:
                # Two-proportion z-test: requests are the samples here, not windows.
                pooled = (a * na + b * nb) / (na + nb)
                se = math.sqrt(pooled * (1 - pooled) * (1 / na + 1 / nb)) if 0 < pooled < 1 else 0.0
                p = float(norm.sf((b - a) / se)) if se > 0 else 0.0
                row.interval = f"one-sided p={p:.3g}"
                if p < 1 - self.cfg.confidence:
                    row.regression, row.note = True, "past threshold and beyond noise"
                else:
                    row.note = "past threshold but within noise"
        self.rows.append(row)

    def memory(self) -> None:
        ma: dict[str, dict[str, Any]] = self.a.get("memory", {})
        mb: dict[str, dict[str, Any]] = self.b.get("memory", {})
        for name in sorted(set(ma) | set(mb)):
            sa, sb = ma.get(name, {}), mb.get(name, {})

            def slope(s: dict[str, Any]) -> float | None:
                v = s.get("slope_bytes_per_hour")
                return v if v is not None else s.get("trend_bytes_per_hour")

            a, b = slope(sa), slope(sb)
            row = Row(f"memory slope {name}", a, b, "MiB/h")
            if a is not None and b is not None:
                row.change = f"{(b - a) / (1 << 20):+.2f}M"
            if sb.get("leak_suspected") and not sa.get("leak_suspected"):
                row.note = "leak suspected in B, not in A"
                row.regression = self.cfg.leak
            self.rows.append(row)

    def fingerprints(self) -> None:
        fa: dict[str, Any] = self.a.get("run", {}) or {}
        fb: dict[str, Any] = self.b.get("run", {}) or {}
        for key in FINGERPRINT_KEYS:
            if fa.get(key) != fb.get(key):
                self.warnings.append(f"fingerprints differ in {key}: {fa.get(key)!r} vs {fb.get(key)!r}")
        ca, cb = _flatten(fa.get("config") or {}), _flatten(fb.get("config") or {})
        changed = sorted(k for k in set(ca) | set(cb)
                         if ca.get(k) != cb.get(k) and k.split(".", 1)[0] not in CONFIG_IGNORED)
        if changed:
            self.warnings.append("config differs in: " + ", ".join(
                f"{k} ({ca.get(k)!r} -> {cb.get(k)!r})" for k in changed[:12])
                + (f" and {len(changed) - 12} more" if len(changed) > 12 else ""))

    def run(self) -> Comparison:
        self.fingerprints()
        self.throughput()
        self.latency()
        self.errors()
        self.memory()
        return self

    @property
    def regressions(self) -> list[str]:
        return [r.metric for r in self.rows if r.regression]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key.count(".") < 1:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "":
        return f"{v:.4g}"
    if unit == "MiB/h":
        return f"{v / (1 << 20):.2f}M"
    return f"{v:.2f}"


def print_comparison(cmp: Comparison, a_name: str, b_name: str, out: TextIO) -> None:
    for w in cmp.warnings:
        print(f"warning: {w}", file=out)
    print(f"A = {a_name}\nB = {b_name}", file=out)
    width = max(len(r.metric) for r in cmp.rows) + 2 if cmp.rows else 20
    print(f"{'metric':<{width}}{'unit':<7}{'A':>14}{'B':>14}{'change':>10}  verdict", file=out)
    for r in cmp.rows:
        verdict = "REGRESSION" if r.regression else ("ok" if r.change else "")
        detail = "; ".join(x for x in (r.note, r.interval) if x)
        print(f"{r.metric:<{width}}{r.unit:<7}{_fmt(r.a, r.unit):>14}{_fmt(r.b, r.unit):>14}{r.change:>10}  "
              f"{verdict}{f' ({detail})' if detail else ''}", file=out)
    regs = cmp.regressions
    if regs:
        print(f"regression: {', '.join(regs)}", file=out)
    else:
        print("no regression", file=out)


def load_result(path: str) -> dict[str, Any]:
    """A summary (``--summary-json``) or a report (``report --format json``)."""
    with Path(path).open() as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or "latency_ms" not in doc:
        raise ValueError("not a soakd summary or report (no latency_ms)")
    return doc
