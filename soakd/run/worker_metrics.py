"""``/metrics`` of a ``--workers N`` soak: the workers' own pages merged into one soak's.

Counters and histogram buckets add across workers (one log-bucket grid everywhere: the sum is
exact, as the fleet report's is), so the page reads as one soakd's. A worker that restarts
starts its counters from 0; its last values are carried as an offset, so the merged counters
never go down (Prometheus would read a drop as a reset and count the whole soak again). Gauges
add too (requests in flight, memory), except a ratio (the mean) and an ``_info`` (the largest).
Per-worker health is the page's own: ``soakd_worker_up``, restarts, CPU and schedule lag p99.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Key = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels
ADDS = ("counter", "histogram", "summary")


class MergedMetrics(Collector):
    """The merged families of the workers' latest pages, and each worker's health."""

    def __init__(self, workers: int) -> None:
        self._lock = threading.Lock()
        self._families: list[dict[str, tuple[str, str]]] = [{} for _ in range(workers)]  # name: (type, help)
        self._values: list[dict[Key, float]] = [{} for _ in range(workers)]  # raw, as last scraped
        self._offsets: list[dict[Key, float]] = [{} for _ in range(workers)]  # what earlier lives counted
        self._kinds: dict[Key, tuple[str, str, dict[str, str]]] = {}  # key: family, type, labels as written
        self.up = [False] * workers
        self.restarts = [0] * workers
        self.cpu_seconds = [0.0] * workers
        self.lag_p99 = [float("nan")] * workers

    def update(self, worker: int, text: str) -> None:
        """A worker's page, just scraped (ValueError when it is not the text format)."""
        families: dict[str, tuple[str, str]] = {}
        values: dict[Key, float] = {}
        lag: list[tuple[float, float]] = []
        for fam in text_string_to_metric_families(text):
            families[fam.name] = (fam.type, fam.documentation)
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue  # a timestamp: nothing to add
                key = (s.name, tuple(sorted(s.labels.items())))
                values[key] = float(s.value)
                with self._lock:
                    # le and quantile last, as prometheus_client writes them (the parser sorts)
                    labels = sorted(s.labels.items(), key=lambda kv: kv[0] in ("le", "quantile"))
                    self._kinds[key] = (fam.name, fam.type, dict(labels))
                if s.name == "soakd_schedule_lag_seconds_bucket":
                    lag.append((float(s.labels["le"]), float(s.value)))
        with self._lock:
            old, offsets = self._values[worker], self._offsets[worker]
            for key, value in values.items():
                if self._kinds[key][1] in ADDS and value < old.get(key, 0.0):  # the worker restarted
                    offsets[key] = offsets.get(key, 0.0) + old[key]
            self._families[worker], self._values[worker] = families, values
            self.lag_p99[worker] = _quantile(0.99, sorted(lag))

    def total(self, sample: str, **labels: str) -> float:
        """One merged sample's value (what the page shows), for the summary and tests."""
        key = (sample, tuple(sorted(labels.items())))
        with self._lock:
            return sum(v.get(key, 0.0) + o.get(key, 0.0) for v, o in zip(self._values, self._offsets, strict=True))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families: dict[str, tuple[str, str]] = {}
            for fams in self._families:
                families.update(fams)
            merged: dict[str, Metric] = {n: Metric(n, doc, typ) for n, (typ, doc) in families.items()}
            sums: dict[Key, list[float]] = {}
            for values, offsets in zip(self._values, self._offsets, strict=True):
                for key in [*values, *(k for k in offsets if k not in values)]:
                    sums.setdefault(key, []).append(values.get(key, 0.0) + offsets.get(key, 0.0))
            for key, parts in sums.items():  # the pages' own order: buckets by le
                family, typ, labels = self._kinds[key]
                if family in merged:
                    merged[family].add_sample(key[0], labels, _combine(family, typ, parts))
        yield from merged.values()
        yield from self._health()

    def _health(self) -> Iterator[Metric]:
        up = Metric("soakd_worker_up", "1 while the driver process runs and answers its /metrics", "gauge")
        restarts = Metric("soakd_worker_restarts", "Times the driver process died and was started again", "counter")
        cpu = Metric("soakd_worker_cpu_seconds", "CPU time of the driver process", "counter")
        lag = Metric("soakd_worker_schedule_lag_p99_seconds", "The driver's schedule lag p99, whole run", "gauge")
        for i in range(len(self.up)):
            labels = {"worker": str(i)}
            up.add_sample("soakd_worker_up", labels, 1.0 if self.up[i] else 0.0)
            restarts.add_sample("soakd_worker_restarts_total", labels, float(self.restarts[i]))
            cpu.add_sample("soakd_worker_cpu_seconds_total", labels, self.cpu_seconds[i])
            lag.add_sample("soakd_worker_schedule_lag_p99_seconds", labels, self.lag_p99[i])
        yield from (up, restarts, cpu, lag)


def _combine(family: str, typ: str, parts: list[float]) -> float:
    if typ in ADDS or typ == "unknown":
        return sum(parts)
    if family.endswith("_ratio"):
        return sum(parts) / len(parts)
    if family.endswith("_info"):
        return max(parts)
    return sum(parts)


def _quantile(q: float, buckets: list[tuple[float, Any]]) -> float:
    """``histogram_quantile`` over cumulative (le, count) pairs: the bucket's upper bound."""
    if not buckets or buckets[-1][1] <= 0:
        return float("nan")
    rank = q * buckets[-1][1]
    return next((le for le, n in buckets if n >= rank), buckets[-1][0])
