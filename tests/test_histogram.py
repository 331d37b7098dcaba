"""The log histogram: percentiles within 1% of the exact ones, windows by subtraction, bounded memory."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from soakd.telemetry.histogram import LATENCY_BUCKETS, PENDING, HistSnapshot, LogHistogram


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


def test_values_held_for_bucketing_are_counted_once_under_concurrent_snapshots() -> None:
    """Single values are held and bucketed in groups; writers on several threads and a reader taking
    snapshots meanwhile lose none and count none twice, and what is held stays bounded."""
    h = LogHistogram()
    per_thread, writers = 10_000, 3
    done = threading.Event()
    seen: list[int] = []

    def write(k: int) -> None:
        for i in range(per_thread):
            h.observe(0.001 * (1 + (i + k) % 7))

    def read() -> None:
        while not done.is_set():
            seen.append(h.snapshot().count)

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    snap = h.snapshot()
    assert snap.count == writers * per_thread
    assert seen == sorted(seen) and seen[-1] <= snap.count  # cumulative: never goes back
    expected = sum(0.001 * (1 + (i + k) % 7) for k in range(writers) for i in range(per_thread))
    assert snap.total == pytest.approx(expected)
    assert snap.maximum == pytest.approx(0.007)
    assert snap.percentile(0.5) == pytest.approx(0.004, rel=0.01)
    assert len(h._pending) == PENDING
