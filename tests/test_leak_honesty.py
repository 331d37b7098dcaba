"""The printed "no leak above X" is true: a leak at soakd's own detectable slope is caught (#39's
eleventh round, bench/leak/honesty.py). A spike is not a step, and a leak does not change what
the noise is read as."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.leak import week_traces as week
from soakd.analysis.detector import judge
from soakd.analysis.params import DEFAULT_FLOOR_BYTES_PER_HOUR, MIB, DetectorParams
from soakd.analysis.trend import despiked, forgets, slope_variance, take_out_step

pytestmark = pytest.mark.unit
N = 344  # a 6 h window's judged troughs at 1-min bins
H = 3600.0


def _flat(seed: int) -> np.ndarray:
    return 1000 * MIB + np.random.default_rng(seed).normal(0, 0.5 * MIB, N)


def test_despiked_drops_a_spike_and_keeps_a_step_and_a_line() -> None:
    y = np.arange(N, dtype=np.float64)
    y[100:102] += 50.0  # a spike two points long
    y[250:] += 80.0  # a step that stays
    d = despiked(y)
    assert d[99:103].max() < 110.0  # the 50 gone
    assert d[260] == pytest.approx(340.0) and d[40] == pytest.approx(40.0)


def test_a_down_outlier_s_recovery_is_not_taken_out_as_a_step() -> None:
    """One sample 40 sd low (heavy-tailed jitter): taking its recovery out as the largest step left
    a lasting 20 MiB fall in the noise, and the slope's error read 57x its size without the outlier."""
    y = _flat(1)
    y[200] -= 20 * MIB
    quiet = take_out_step(y, y, 15)
    assert np.array_equal(quiet, y)
    ratio = math.sqrt(slope_variance(quiet, N) / slope_variance(np.delete(y, 200), N - 1))
    assert ratio < 4.0
    step = _flat(1)
    step[200:] += 20 * MIB
    assert take_out_step(step, step, 15)[-1] == pytest.approx(step[-1] - 20 * MIB, abs=2 * MIB)


def test_forgets_reads_the_noise_not_a_leak_s_rise() -> None:
    """The trailing minimum of heavy-tailed noise, with and without a 3.6 MiB/h rise: whether its
    noise forgets (the whole history one span) is the noise's property. Read on the raw troughs,
    the rise made the envelope's jumps "rise more than they fall" in 8 of these 30."""
    for s in range(30):
        z = np.random.default_rng(100 + s).standard_t(2.5, N + 29) * MIB
        env = np.lib.stride_tricks.sliding_window_view(z, 30).min(axis=1)
        assert forgets(env, 360, 15) == forgets(env + 0.06 * MIB * np.arange(N), 360, 15)


def test_a_leak_at_the_printed_slope_is_caught_under_heavy_tailed_jitter() -> None:
    """Week `jitter` (Student-t noise, 5-40 MiB spikes about once an hour): each replica's printed
    "no leak above X", then a leak of X added to it. Before, 30% of these were caught: a
    down-outlier's recovery, taken out as a step, made the noise read several times too large
    once a leak was added."""
    t = week.times(6 * H)
    params, floor = DetectorParams(), DEFAULT_FLOOR_BYTES_PER_HOUR
    caught = 0
    for r in range(10):
        v = week.noise("jitter", 1, r)
        x = judge(t, v, params, floor).detectable_bytes_per_hour
        assert math.isfinite(x) and x < 20 * MIB
        caught += judge(t, v + x * t / H, params, floor).positive
    assert caught >= 8


@pytest.mark.parametrize(("corpus", "shape"), [("week", "ar1"), ("fresh", "white")])
def test_the_honesty_bench_reads_each_replica_s_own_claim(corpus: str, shape: str) -> None:
    """bench/leak/honesty.py on both sets it reads: a printed slope per judged replica, and a leak
    of it caught where one of half of it is not (on these replicas, as on most: an honest claim
    is not twice too cautious either)."""
    from bench.leak.honesty import one

    got, printed, caught = one((corpus, shape, 0, 2, 6.0))
    assert got == shape and len(printed) == len(caught) == 2
    assert all(2.0 <= x < 20.0 for x in printed)  # MiB/h: at or above the 2 MiB/h floor
    assert caught == [[False, True], [False, True]]
