"""``soakd compare A.json B.json``: B against the baseline A, side by side, with regressions.

A change is a regression only when it is past the ``[compare]`` threshold *and* beyond noise
(see :mod:`soakd.report.noise`): with a few per-window figures a side, the bootstrap interval
of the difference in window means must exclude zero on the bad side; a short run without them
is judged on its own counts (the sampling error of a percentile from its histogram, the
Poisson error of a throughput). A change past the threshold with no noise estimate at all is
reported as "cannot tell" and does not fail the comparison: a gate that fails on noise is
soon ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

from soakd.config import CompareConfig
from soakd.record.read import load_record
from soakd.record.types import FleetRecord, LlmBlock, MemorySeries, Percentiles, RunRecord
from soakd.record.write import LLM_TIMINGS
from soakd.report import units
from soakd.report.noise import block_bootstrap_ci, difference, quantile_interval, rate_interval
from soakd.report.window_rows import series
from soakd.verdicts.slo import error_ratio

__all__ = ["Comparison", "Row", "block_bootstrap_ci", "comparison_table", "load_result", "print_comparison"]

MIN_WINDOWS = 3  # fewer per side: the counts behind the summary give the noise estimate
# Fingerprint keys a result is bound to: a difference means the runs are not like for like.
FINGERPRINT_KEYS = (
    "model",
    "model_sha256",
    "input",
    "device_name",
    "torch_version",
    "cuda_version",
    "cudnn_version",
    "driver_version",
)
# A served model's driver runs no model: its CUDA build is not part of what was measured (served
# runs record none since soakd stopped importing torch for them; older ones recorded the driver's).
DRIVER_SIDE = ("cuda_version", "cudnn_version")
CONFIG_IGNORED = ("output", "state", "metrics", "otel")  # where a run writes, not what it measures
STAGE_ORDER = ("e2e", "queue", "inference", "preprocess", "postprocess")

Interval = tuple[float, float]
NONE = Percentiles()  # a stage one side does not have


@dataclass
class Row:
    metric: str
    a: float | None
    b: float | None
    unit: str
    change: str = ""
    interval: str = ""
    regression: bool = False
    cannot_tell: bool = False  # past the threshold, but no noise estimate to judge it by
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.regression:
            return "REGRESSION"
        if self.cannot_tell:
            return "cannot tell"
        return "ok" if self.change else ""


def _windows(doc: RunRecord, key: str, stage: str | None = None) -> npt.NDArray[np.float64]:
    vals = np.asarray(series(doc.rows, key, stage), dtype=np.float64)
    return vals[np.isfinite(vals)]


def _per_sample(doc: RunRecord) -> float:
    """Requests per independent latency sample: the mean batch size, or the mean number of
    requests in flight together (Little's law: throughput x mean e2e) where that is larger.
    Requests in one batch share its call; requests in flight together share the server's
    stalls (a GC pause, a busy event loop moves all of them at once), so n requests hold about
    n / that many independent latencies. Taking every overlap as fully shared is the cautious
    end: it can call a real change noise, never noise a change."""
    mean = doc.mean_batch
    batch = mean if mean is not None and mean >= 1 else 1.0
    e2e = doc.latency_ms.get("e2e")
    rps, e2e_mean = doc.throughput_rps, None if e2e is None else e2e.mean
    in_flight = 1.0
    if rps is not None and e2e_mean is not None and rps > 0 and e2e_mean > 0:
        in_flight = rps * e2e_mean / 1000.0
    return max(1.0, batch, in_flight)


def _signed(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return "+inf" if v > 0 else "-inf"
    text = units.fmt(v, unit)
    return text if text.startswith(("+", "-")) else f"+{text}"


class Comparison:
    def __init__(self, a: RunRecord, b: RunRecord, cfg: CompareConfig, seed: int = 0) -> None:
        self.a, self.b, self.cfg = a, b, cfg
        self.rng = np.random.default_rng(seed)
        self.rows: list[Row] = []
        self.warnings: list[str] = []

    # ------------------------------------------------------------ noise

    def _beyond_noise(
        self,
        key: str | None,
        stage: str | None,
        unit: str,
        worse_if_higher: bool,
        counts: tuple[Interval | None, Interval | None],
    ) -> tuple[bool | None, str]:
        """Whether B differs from A on the bad side beyond noise (None: no estimate), and how
        that was estimated. ``key``: the figure in the windows (None: they do not carry it);
        ``counts``: each side's interval from its own counts, the fallback."""
        if key is not None:
            xa, xb = _windows(self.a, key, stage), _windows(self.b, key, stage)
        else:
            xa = xb = np.empty(0)
        if xa.size >= MIN_WINDOWS and xb.size >= MIN_WINDOWS:
            lo, hi = block_bootstrap_ci(xa, xb, self.cfg.confidence, self.cfg.resamples, self.rng)
            source = f"{xa.size}+{xb.size} windows"
        elif counts[0] is not None and counts[1] is not None:
            lo, hi = difference(counts[0], counts[1])
            source = "histogram sampling error" if unit == "ms" else "Poisson error of the ok counts"
        else:
            return None, ""
        text = f"{self.cfg.confidence:.0%} CI of diff [{_signed(lo, unit)}, {_signed(hi, unit)}] {unit}, {source}"
        return (lo > 0 if worse_if_higher else hi < 0), text

    def _judge(
        self,
        row: Row,
        past_threshold: bool,
        key: str | None,
        stage: str | None,
        worse_if_higher: bool,
        counts: tuple[Interval | None, Interval | None],
    ) -> None:
        beyond, row.interval = self._beyond_noise(key, stage, row.unit, worse_if_higher, counts)
        if not past_threshold:
            return
        if beyond is None:
            row.cannot_tell = True
            row.note = (
                f"past threshold, but no noise estimate: fewer than {MIN_WINDOWS} windows a side "
                "and no counts to estimate it from"
            )
        elif beyond:
            row.regression, row.note = True, "past threshold and beyond noise"
        else:
            row.note = "past threshold but within noise"

    # ------------------------------------------------------------ metrics

    def throughput(self) -> None:
        a, b = self.a.throughput_rps, self.b.throughput_rps
        row = Row("throughput", a, b, "req/s")
        if a is not None and b is not None:
            row.change = units.change(a, b, row.unit)
            past = a > 0 and (a - b) / a > self.cfg.max_throughput_drop
            ia = rate_interval(self.a.requests.get("ok"), a, self.cfg.confidence)
            ib = rate_interval(self.b.requests.get("ok"), b, self.cfg.confidence)
            self._judge(row, past, "throughput_rps", None, worse_if_higher=False, counts=(ia, ib))
        self.rows.append(row)

    def _percentile_rows(
        self,
        label: str,
        sa: Percentiles,
        sb: Percentiles,
        stage: str | None,
        per_sample: tuple[float, float],
    ) -> None:
        """p50..p999 of one timing, A against B; p99 is the gated percentile, the others are
        context. ``stage``: its name in the windows (None: the windows do not carry it, so its
        histogram's counts estimate the noise); ``per_sample``: samples per independent one."""
        for q in ("p50", "p90", "p99", "p999"):
            a, b = getattr(sa, q), getattr(sb, q)
            row = Row(f"{q} {label}", a, b, "ms")
            if a is not None and b is not None:
                row.change = units.change(a, b, row.unit)
                if q == "p99":
                    past = a > 0 and (b - a) / a > self.cfg.max_p99_increase
                    counts = (
                        quantile_interval(sa, q, self.cfg.confidence, per_sample[0]),
                        quantile_interval(sb, q, self.cfg.confidence, per_sample[1]),
                    )
                    key = "p99" if stage is not None else None
                    self._judge(row, past, key, stage, worse_if_higher=True, counts=counts)
            self.rows.append(row)

    def latency(self) -> None:
        la, lb = self.a.latency_ms, self.b.latency_ms
        extra = sorted((set(la) | set(lb)) - set(STAGE_ORDER))
        per = (_per_sample(self.a), _per_sample(self.b))
        for stage in [s for s in STAGE_ORDER if s in la or s in lb] + extra:
            self._percentile_rows(stage, la.get(stage, NONE), lb.get(stage, NONE), stage, per)

    def llm(self) -> None:
        """Per-token timings and goodput of two LLM soaks (``--api openai``); nothing otherwise.
        The inter-token gaps of one request share its server batch and its decode, so the
        independent samples are requests, and requests in flight together share the server's
        stalls: gaps per request times requests per sample is the design effect."""
        if self.a.llm_block is None and self.b.llm_block is None:
            return
        la, lb = self.a.llm_block or LlmBlock(), self.b.llm_block or LlmBlock()

        def gaps_per_request(llm: LlmBlock) -> float:
            gaps = None if llm.itl_ms is None else llm.itl_ms.count
            requests = None if llm.ttft_ms is None else llm.ttft_ms.count
            if isinstance(gaps, int) and isinstance(requests, int) and requests > 0:
                return gaps / requests
            return 1.0

        requests = (_per_sample(self.a), _per_sample(self.b))
        gaps = (requests[0] * gaps_per_request(la), requests[1] * gaps_per_request(lb))
        for name, key in LLM_TIMINGS:
            sa, sb = getattr(la, key), getattr(lb, key)
            if sa is not None or sb is not None:
                self._percentile_rows(name, sa or NONE, sb or NONE, None, gaps if key == "itl_ms" else requests)
        a, b = la.goodput_rps, lb.goodput_rps
        row = Row("goodput", a, b, "req/s")
        if a is not None and b is not None:
            row.change = units.change(a, b, row.unit)
            past = a > 0 and (a - b) / a > self.cfg.max_throughput_drop
            ia = rate_interval(la.goodput_requests, a, self.cfg.confidence)
            ib = rate_interval(lb.goodput_requests, b, self.cfg.confidence)
            self._judge(row, past, None, None, worse_if_higher=False, counts=(ia, ib))
        self.rows.append(row)

    def errors(self) -> None:
        ra, rb = self.a.requests, self.b.requests
        a, b = error_ratio(ra), error_ratio(rb)
        row = Row("error ratio", a, b, "ratio")
        if a is not None and b is not None:
            row.change = units.change(a, b, row.unit)
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
        ma, mb = self.a.series, self.b.series
        for name in sorted(set(ma) | set(mb)):
            sa, sb = ma.get(name, MemorySeries()), mb.get(name, MemorySeries())
            a, b = sa.slope, sb.slope
            row = Row(f"memory slope {name}", a, b, "MiB/h")
            if a is not None and b is not None:
                row.change = units.change(a, b, row.unit)
            if sb.leak and not sa.leak:
                row.note = "leak suspected in B, not in A"
                row.regression = self.cfg.leak
            self.rows.append(row)

    def fingerprints(self) -> None:
        fa, fb = self.a.fingerprint, self.b.fingerprint
        served = fa.get("device") == fb.get("device") == "remote"
        for key in FINGERPRINT_KEYS:
            if served and key in DRIVER_SIDE:
                continue
            if fa.get(key) != fb.get(key):
                self.warnings.append(f"fingerprints differ in {key}: {fa.get(key)!r} vs {fb.get(key)!r}")
        ca, cb = _flatten(fa.get("config") or {}), _flatten(fb.get("config") or {})
        changed = sorted(
            k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k) and k.split(".", 1)[0] not in CONFIG_IGNORED
        )
        if changed:
            self.warnings.append(
                "config differs in: "
                + ", ".join(f"{k} ({ca.get(k)!r} -> {cb.get(k)!r})" for k in changed[:12])
                + (f" and {len(changed) - 12} more" if len(changed) > 12 else "")
            )

    def run(self) -> Comparison:
        self.fingerprints()
        self.throughput()
        self.latency()
        self.llm()
        self.errors()
        self.memory()
        return self

    @property
    def regressions(self) -> list[str]:
        return [r.metric for r in self.rows if r.regression]

    @property
    def undecided(self) -> list[str]:
        """Past the threshold with no noise estimate: neither a regression nor cleared."""
        return [r.metric for r in self.rows if r.cannot_tell]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key.count(".") < 1:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


COLUMNS = ("metric", "unit", "A", "B", "change", "verdict")
_RIGHT = frozenset({"A", "B", "change"})  # numbers align on the right


def comparison_table(cmp: Comparison) -> list[str]:
    """The rows as fixed-width columns sized to their widest cell, two spaces apart, so no two
    figures run together however long they are; the verdict's reasons follow the last column."""
    cells = [[r.metric, r.unit, units.fmt(r.a, r.unit), units.fmt(r.b, r.unit), r.change, r.verdict] for r in cmp.rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(COLUMNS)]

    def line(row: list[str] | tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if h in _RIGHT else c.ljust(w) for h, c, w in zip(COLUMNS, row, widths, strict=True)
        )

    out = [line(COLUMNS).rstrip()]
    for r, c in zip(cmp.rows, cells, strict=True):
        detail = "; ".join(x for x in (r.note, r.interval) if x)
        out.append((line(c) + (f"  ({detail})" if detail else "")).rstrip())
    return out


def print_comparison(cmp: Comparison, a_name: str, b_name: str, out: TextIO) -> None:
    for w in cmp.warnings:
        print(f"warning: {w}", file=out)
    print(f"A = {a_name}\nB = {b_name}", file=out)
    for text in comparison_table(cmp):
        print(text, file=out)
    regs, undecided = cmp.regressions, cmp.undecided
    if regs:
        print(f"regression: {', '.join(regs)}", file=out)
    elif undecided:
        print(
            f"no regression found; cannot tell for {', '.join(undecided)} (no noise estimate: runs with "
            f"{MIN_WINDOWS}+ windows, or summaries with request counts, can tell)",
            file=out,
        )
    else:
        print("no regression", file=out)


def load_result(path: str) -> RunRecord | FleetRecord:
    """A summary (``--summary-json``), a report (``report --format json``) or a fleet JSON, from
    any soakd version: ValueError naming the key that is not what a run writes (exit 2 naming the file)."""
    return load_record(path)
