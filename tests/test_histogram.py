"""The log histogram: percentiles within 1% of the exact ones, windows by subtraction, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from soakd.telemetry.histogram import LATENCY_BUCKETS, HistSnapshot, LogHistogram


@pytest.mark.parametrize("batch", [1, 7, 500])
def test_percentiles_within_one_percent(batch: int) -> None:
    """p50..p99.9 and max agree with numpy's exact order statistics to within 1%."""
    rng = np.random.default_rng(1)
    values = rng.lognormal(mean=np.log(0.02), sigma=1.2, size=20_000)
    h = LogHistogram()
    for i in range(0, len(values), batch):
        h.observe_many(values[i : i + batch])
    snap = h.snapshot()
    assert snap.count == len(values)
    s = np.sort(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = s[int(np.ceil(q * len(s))) - 1]
        assert snap.percentile(q) == pytest.approx(exact, rel=0.01)
    assert snap.maximum == pytest.approx(values.max())
    assert snap.mean() == pytest.approx(values.mean())


def test_window_is_difference_of_snapshots() -> None:
    """Subtracting two snapshots gives the distribution of what was recorded in between."""
    h = LogHistogram()
    h.observe_many([0.001] * 1000)
    before = h.snapshot()
    h.observe_many([0.5] * 100)
    window = h.snapshot() - before
    assert window.count == 100
    assert window.percentile(0.5) == pytest.approx(0.5, rel=0.01)


def test_sparse_round_trip_and_merge() -> None:
    """Stored windows come back equal, and merging adds counts."""
    h = LogHistogram()
    h.observe_many(np.linspace(0.0001, 2.0, 300))
    snap = h.snapshot()
    back = HistSnapshot.from_sparse(snap.to_sparse(), snap.total, snap.maximum)
    assert np.array_equal(back.counts, snap.counts)
    merged = back + snap
    assert merged.count == 600
    assert merged.percentile(0.5) == pytest.approx(snap.percentile(0.5))


def test_prometheus_buckets_are_cumulative_and_exact() -> None:
    """Cumulative `le` counts match a direct count of values <= each bound."""
    rng = np.random.default_rng(2)
    values = rng.uniform(0.00005, 80, 5000)
    h = LogHistogram()
    h.observe_many(values)
    for bound, count in h.snapshot().le_counts():
        assert count == int((values <= bound).sum())
    assert LATENCY_BUCKETS[0] == 0.0001 and LATENCY_BUCKETS[-1] == 60.0


def test_empty_histogram_reports_nan() -> None:
    """An empty histogram has no percentiles rather than a made-up zero."""
    assert np.isnan(LogHistogram().snapshot().percentile(0.99))
