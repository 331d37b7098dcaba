"""A bounded-memory log-bucket histogram with exact-within-1% percentiles.

One counts array on a geometric grid (2% wide buckets; reporting the geometric middle of a
bucket is within 1% of any value in it), with the Prometheus bucket bounds spliced in as
exact edges, so the same counts feed both the summary percentiles and the Prometheus
histogram. Large batches are bucketed with numpy in one go; single values and short lists are
held and bucketed a few hundred at a time (``LogHistogram``), which keeps the per-request cost
on a model thread to a store. Counts are cumulative, so a window is the difference of two
snapshots, and windows merge by addition.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Prometheus `le` bounds for latency: fine from 100 µs, up to 60 s (heatmap-friendly).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip

LOWEST = 1e-6
HIGHEST = 3600.0
BUCKET_GROWTH = 1.02


def _grid(extra: Sequence[float]) -> npt.NDArray[np.float64]:
    n = math.ceil(math.log(HIGHEST / LOWEST) / math.log(BUCKET_GROWTH))
    geo = LOWEST * BUCKET_GROWTH ** np.arange(n + 1)
    return np.unique(np.concatenate([geo, np.asarray(extra, dtype=np.float64)]))


_EDGES = _grid(LATENCY_BUCKETS)
_EDGE_LIST = _EDGES.tolist()
_PROM_INDEX = np.searchsorted(_EDGES, np.asarray(LATENCY_BUCKETS))
# Value reported for a bucket: geometric middle of its edges (first/last: the edge itself).
_MIDS = np.concatenate([[_EDGES[0]], np.sqrt(_EDGES[:-1] * _EDGES[1:]), [_EDGES[-1]]])
NBINS = len(_EDGES) + 1  # bucket i holds (edges[i-1], edges[i]]; the last one is overflow
_SMALL_BATCH = 24  # shorter lists are held like single values; longer ones are bucketed at once
PENDING = 256  # values held before they are bucketed (bounded; bucketing them takes ~12 us)


@dataclass
class HistSnapshot:
    """Counts at one moment; subtract two to get the window between them."""

    counts: npt.NDArray[np.int64]
    total: float
    maximum: float

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def __sub__(self, older: HistSnapshot) -> HistSnapshot:
        # The window's max is not recoverable from cumulative data; the newer max bounds it.
        return HistSnapshot(self.counts - older.counts, self.total - older.total, self.maximum)

    def __add__(self, other: HistSnapshot) -> HistSnapshot:
        return HistSnapshot(self.counts + other.counts, self.total + other.total, max(self.maximum, other.maximum))

    def percentile(self, q: float) -> float:
        """Value at quantile ``q`` (0..1), within 1% of the true sample quantile; NaN when empty."""
        n = self.count
        if n == 0:
            return math.nan
        rank = max(1, math.ceil(q * n))
        idx = int(np.searchsorted(np.cumsum(self.counts), rank))
        value = float(_MIDS[idx])
        return min(value, self.maximum) if self.maximum > 0 else value

    def mean(self) -> float:
        n = self.count
        return self.total / n if n else math.nan

    def le_counts(self) -> list[tuple[float, int]]:
        """Cumulative counts at the Prometheus bounds, for exposition."""
        cum = np.cumsum(self.counts)
        return [(b, int(cum[i])) for b, i in zip(LATENCY_BUCKETS, _PROM_INDEX, strict=True)]

    def to_sparse(self) -> dict[str, list[int]]:
        nz = np.nonzero(self.counts)[0]
        return {"i": nz.tolist(), "c": self.counts[nz].tolist()}

    @classmethod
    def from_sparse(cls, data: dict[str, list[int]], total: float, maximum: float) -> HistSnapshot:
        counts = np.zeros(NBINS, dtype=np.int64)
        counts[np.asarray(data["i"], dtype=np.int64)] = np.asarray(data["c"], dtype=np.int64)
        return cls(counts, total, maximum)

    @classmethod
    def empty(cls) -> HistSnapshot:
        return cls(np.zeros(NBINS, dtype=np.int64), 0.0, 0.0)


class LogHistogram:
    """Thread-safe cumulative histogram of seconds.

    A value observed one at a time (or in a short list) is not bucketed then: it is stored in a
    preallocated slot, and ``PENDING`` of them are bucketed at once with numpy, or whatever is
    held when a snapshot is taken. Bucketing one value is a binary search over ~1,100 float
    objects; on a model thread, right after a model call, it runs on cold caches: three of them
    took 11.6 us a request behind a TorchScript encoder at batch 1 (about 0.9% of its call;
    docs/model-threads.md). Storing allocates nothing, so the model thread's heap sees no traffic
    per request. Large batches (numpy arrays, long lists) are bucketed at once with numpy, and a
    batch's single value (``observe_n``) with one bisect: both once per batch."""

    __slots__ = ("_counts", "_held", "_lock", "_max", "_pending", "_sum")

    def __init__(self) -> None:
        self._counts = np.zeros(NBINS, dtype=np.int64)
        self._pending = [0.0] * PENDING  # values not bucketed yet: the first ``_held`` slots
        self._held = 0
        self._sum = 0.0
        self._max = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            held = self._held
            self._pending[held] = value
            self._held = held + 1
            if held + 1 == PENDING:
                self._bucket_pending()

    def observe_n(self, value: float, n: int) -> None:
        """``n`` requests with the same value (a batch's inference time): one bucket lookup."""
        if n == 1:
            self.observe(value)
            return
        idx = bisect.bisect_left(_EDGE_LIST, value)
        with self._lock:
            self._counts[idx] += n
            self._sum += value * n
            if value > self._max:
                self._max = value

    def observe_many(self, values: Iterable[float] | npt.NDArray[np.float64]) -> None:
        vals = values if isinstance(values, list) else None
        if vals is None or len(vals) >= _SMALL_BATCH:
            arr = np.asarray(values, dtype=np.float64)
            if arr.size >= _SMALL_BATCH:
                idx = np.searchsorted(_EDGES, arr, side="left")
                total, top = float(arr.sum()), float(arr.max())
                with self._lock:
                    np.add.at(self._counts, idx, 1)
                    self._sum += total
                    self._max = max(self._max, top)
                return
            vals = arr.tolist()
        with self._lock:
            pending, held = self._pending, self._held
            for v in vals:
                pending[held] = v
                held += 1
                if held == PENDING:
                    self._held = held
                    self._bucket_pending()
                    held = 0
            self._held = held

    def _bucket_pending(self) -> None:
        """Count the held values into their buckets (the lock is held): numpy, about 12 us for
        256 values where a bisect each took 50 us, so the completion that fills the slots stalls
        the next batch briefly. The two arrays it makes live only for the call."""
        held = self._held
        if held == 0:
            return
        vals = np.fromiter(itertools.islice(self._pending, held), dtype=np.float64, count=held)
        np.add.at(self._counts, np.searchsorted(_EDGES, vals, side="left"), 1)
        self._sum += float(vals.sum())
        self._max = max(self._max, float(vals.max()))
        self._held = 0

    def snapshot(self) -> HistSnapshot:
        with self._lock:
            self._bucket_pending()
            return HistSnapshot(self._counts.copy(), self._sum, self._max)
