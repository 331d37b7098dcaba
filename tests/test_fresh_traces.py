"""The fresh held-out trace generator (bench/leak/fresh_traces.py): what grading relies on."""

from __future__ import annotations

import numpy as np
import pytest

from bench.leak import fresh_traces as fresh

MIB = float(1 << 20)
H = 3600.0
SEEDS = range(4)


@pytest.mark.parametrize("shape", list(fresh.SHAPES))
def test_a_shape_and_seed_give_the_same_trace_every_time(shape: str) -> None:
    a, b = fresh.generate(shape, 3), fresh.generate(shape, 3)
    assert np.array_equal(a.t, b.t) and np.array_equal(a.v, b.v)
    assert (a.leak_start, a.leak_rate, a.info) == (b.leak_start, b.leak_rate, b.info)


@pytest.mark.parametrize("shape", list(fresh.SHAPES))
def test_seeds_give_different_traces(shape: str) -> None:
    traces = [fresh.generate(shape, s) for s in SEEDS]
    for i, x in enumerate(traces):
        for y in traces[i + 1 :]:
            assert not np.array_equal(x.v, y.v)
            assert x.info != y.info


def test_sampling_covers_the_duration_at_the_interval() -> None:
    for shape in fresh.SHAPES:
        h = fresh.generate(shape, 0, duration=2 * H, interval=5.0)
        assert h.t[0] == 0.0 and h.t[-1] == pytest.approx(2 * H)
        assert np.allclose(np.diff(h.t), 5.0)
        assert h.v.shape == h.t.shape and np.all(np.isfinite(h.v))
    assert fresh.generate("white", 0).t.size == 6 * 360 + 1  # the default: 6 h at 10 s


def test_memory_is_whole_pages_at_a_realistic_level() -> None:
    for shape in fresh.SHAPES:
        v = fresh.generate(shape, 1).v
        assert np.all(v % 4096 == 0)
        assert v.min() > 250 * MIB and v.max() < 8192 * MIB


def test_leak_free_shapes_carry_no_leak() -> None:
    assert set(fresh.LEAK_FREE).isdisjoint(fresh.LEAKING)
    assert set(fresh.SHAPES) == set(fresh.LEAK_FREE) | set(fresh.LEAKING)
    for shape in fresh.LEAK_FREE:
        for seed in SEEDS:
            h = fresh.generate(shape, seed)
            assert not h.leaking and h.leak_start is None and h.leak_rate == 0.0
            assert "leak" not in fresh.components(shape, seed)


@pytest.mark.parametrize("shape", list(fresh.LEAKING))
def test_the_stated_leak_is_the_leak_in_the_trace(shape: str) -> None:
    """The leak part is zero before leak_start, only grows, and grows by leak_rate per hour
    from leak_start to the last sample; the trace is the sum of its parts (to a page)."""
    for duration in (6 * H, 24 * H):
        for seed in range(6):  # starts at 0 among them, for every shape but leak_late
            h = fresh.generate(shape, seed, duration=duration)
            parts = fresh.components(shape, seed, duration=duration)
            assert h.leaking and h.leak_start is not None
            assert 0.0 <= h.leak_start <= 4.5 * H
            assert np.abs(h.v - np.sum(list(parts.values()), axis=0)).max() <= 2048
            leak = parts["leak"]
            # Nothing of it before or at leak_start (the trace's sample 0 included, for a leak from 0).
            assert np.all(leak[h.t <= h.leak_start] == 0.0)
            assert np.all(np.diff(leak) >= -1e-6)
            span_h = (h.t[-1] - h.leak_start) / H
            assert leak[-1] / span_h == pytest.approx(h.leak_rate, rel=1e-9)
            assert 1 * MIB <= h.leak_rate <= 200 * MIB
            # The rest of the trace (noise, wander, cycles, warm-up) is what is left.
            rest = h.v - leak
            assert np.abs(rest - sum(p for k, p in parts.items() if k != "leak")).max() <= 2048


def test_leak_rates_and_starts_fall_in_each_shapes_range() -> None:
    for seed in range(12):
        assert 3 * MIB <= fresh.generate("leak_faint", seed).leak_rate <= 8 * MIB
        late = fresh.generate("leak_late", seed)
        assert late.leak_start is not None and 2 * H <= late.leak_start <= 4.5 * H
        steps = fresh.components("staircase", seed)["leak"]
        assert np.count_nonzero(np.diff(steps)) >= 3  # a staircase, not a single step
    starts = [fresh.generate("leak_white", s).leak_start for s in range(30)]
    assert 0.0 in starts and any(s is not None and s > 0 for s in starts)


def test_an_unknown_shape_is_named() -> None:
    with pytest.raises(KeyError, match="no_such_shape"):
        fresh.generate("no_such_shape", 0)
