"""Leak detector: verdicts on generated traces of each pattern, and the trend primitives."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pymannkendall as mk
import pytest
from scipy.stats import theilslopes

from soakd.analysis.corpus import LEAK_FREE, LEAKING, ar1_noise, generate
from soakd.analysis.detector import judge
from soakd.analysis.params import MIB, DetectorParams, floor_for
from soakd.analysis.replay import Persistence, replay
from soakd.analysis.trend import (
    lower_envelope,
    mann_kendall,
    ols_slope,
    slope_variance,
    take_out_step,
    theil_sen,
    trailing_min,
    warmup_end,
)
from soakd.config import ConfigError, load_config

PARAMS = DetectorParams()
FLOOR = floor_for("host_rss", {})
# A few traces per pattern, checked exactly; the rates over hundreds of traces (a few leak-free
# traces in 100 do raise a verdict) are bench/leak/detection.py's to measure.
SEEDS = range(10)
# Shapes the detector is known to find less often than 8 in 10 within 6 h (issue #14's
# goal of 90% is not met on them; docs/leak-verdicts.md has the rates): at least this many.
WEAK_LEAKS = {"faint_wander": 3, "rare_staircase": 7}
# Leak-free shapes still judged leaking at the end of some traces: a 24 h load swing rises for
# hours of a 6 h trace, as a leak does (docs/leak-verdicts.md). At most this many of 10.
WEAK_FREE = {"diurnal": 1}


@pytest.mark.parametrize("pattern", sorted(LEAK_FREE))
def test_leak_free_patterns_are_not_leaks(pattern: str) -> None:
    """Warm-up plateaus, single steps, sawtooth, slow swings and noise: no verdict at the end of
    any of 10 traces (diurnal: one), and at most 2 of 10 ever flagged on the way (the bench measures the rate)."""
    replays = [replay(tr.t, tr.v, PARAMS, FLOOR) for tr in (generate(pattern, s) for s in SEEDS)]
    at_end = [r.final.reason for r in replays if r.suspected]
    assert len(at_end) <= WEAK_FREE.get(pattern, 0), at_end
    assert sum(r.first_suspected_at is not None for r in replays) <= 2


@pytest.mark.parametrize("pattern", sorted(LEAKING))
def test_leak_patterns_are_suspected_by_the_end(pattern: str) -> None:
    """Creep under noise or sawtooth, staircases and late leaks: 8 of 10 or more flagged after
    they start (fewer for the weak shapes) and still suspected at the end, at about the leak's
    slope."""
    found = 0
    for seed in SEEDS:
        tr = generate(pattern, seed)
        r = replay(tr.t, tr.v, PARAMS, FLOOR)
        if not r.suspected:
            continue
        found += 1
        assert r.first_suspected_at is not None and r.first_suspected_at >= (tr.leak_start or 0.0)
        # The slope reported is the leak's order of magnitude (staircases lose a step).
        assert 0.3 * tr.leak_rate < r.final.slope_bytes_per_hour < 3 * tr.leak_rate, (pattern, seed)
    assert found >= WEAK_LEAKS.get(pattern, 8)


def test_slow_creep_at_five_mib_per_hour_under_autocorrelated_noise() -> None:
    """The slowest leak the defaults promise to catch: 5 MiB/h under 2 MiB AR(1) noise."""

    rng = np.random.default_rng(7)
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    v = 2e9 + 5 * MIB * t / 3600.0 + ar1_noise(rng, t.size, 2 * MIB, 0.95)
    assert replay(t, v, PARAMS, FLOOR).suspected


def test_a_strong_leak_is_flagged_within_the_hour() -> None:
    """100 MiB/h from the start under 2 MiB of AR(1) noise: flagged under an hour in, not at
    the old floor of warm-up + 1 h of data + 30 min of persistence."""

    rng = np.random.default_rng(3)
    t = np.arange(0.0, 3 * 3600.0, 10.0)
    v = 2e9 + 100 * MIB * t / 3600.0 + ar1_noise(rng, t.size, 2 * MIB, 0.95)
    r = replay(t, v, PARAMS, FLOOR, step=60.0)
    assert r.first_suspected_at is not None and r.first_suspected_at <= 3600.0


def test_a_staircase_is_a_leak_an_allocator_settling_or_a_level_given_back_is_not() -> None:
    """Five 30 MiB steps at irregular gaps, none given back: flagged once the third is in. The
    same steps at ever longer gaps (a caching allocator settling), or three steps with one
    given back: never flagged."""
    rng = np.random.default_rng(21)
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    base = 2e9 + rng.normal(0, MIB, t.size)

    def steps(minutes: list[float]) -> Any:
        return sum(30 * MIB * (t >= m * 60.0) for m in minutes)

    stairs = replay(t, base + steps([40, 110, 150, 230, 290]), PARAMS, FLOOR)
    assert stairs.suspected and stairs.first_suspected_at is not None
    assert 150 * 60.0 < stairs.first_suspected_at <= 4 * 3600.0
    assert "step up 5 times" in stairs.final.reason
    assert 15 * MIB < stairs.final.slope_bytes_per_hour < 45 * MIB
    settling = replay(t, base + steps([30, 60, 110, 200, 350]), PARAMS, FLOOR)
    assert settling.first_suspected_at is None, settling.final.reason
    back = replay(t, base + steps([60, 150, 260]) - 30 * MIB * (t >= 200 * 60.0), PARAMS, FLOOR)
    assert back.first_suspected_at is None, back.final.reason

    # Three 4 MiB chunks over 3 h (an arena's rare chunks, 4 MiB/h on their face) are not a
    # leak's rate: three Poisson steps are consistent with 1.1, i.e. under the 2 MiB/h floor.
    chunks = replay(t, base + sum(4 * MIB * (t >= m * 60.0) for m in (150, 220, 270)), PARAMS, FLOOR)
    assert chunks.first_suspected_at is None, chunks.final.reason


def test_steps_lower_is_the_poisson_chi_square_bound() -> None:
    from scipy.stats import chi2

    from soakd.analysis.jumps import steps_lower

    for k in (3, 5, 10, 40):
        exact = chi2.ppf(0.1, 2 * k) / 2  # P(count >= k | mean) = 0.1 at this mean
        assert steps_lower(k, 1.2815515655446004) == pytest.approx(exact, rel=0.01)


def test_detectable_slope_shrinks_with_data_and_grows_with_wander() -> None:
    """The smallest leak the data could show: lower after 6 h than after 1 h, and higher
    under slow wander than under white jitter of the same size."""
    from bench.leak.heldout_traces import ou

    rng = np.random.default_rng(11)
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    white = 2e9 + rng.normal(0, 2 * MIB, t.size)
    wander = 2e9 + ou(rng, t.size, 10.0, 2 * MIB, 1800.0)
    early = judge(t[t < 2.5 * 3600], white[t < 2.5 * 3600], PARAMS, FLOOR)
    late, slow = judge(t, white, PARAMS, FLOOR), judge(t, wander, PARAMS, FLOOR)
    assert not early.positive and not late.positive and not slow.positive
    assert FLOOR < late.detectable_bytes_per_hour < early.detectable_bytes_per_hour
    # (30 min wander forgets within 6 h, so it too is judged over the whole history: 1.3x, not more)
    assert slow.detectable_bytes_per_hour > 1.3 * late.detectable_bytes_per_hour
    assert late.reason.startswith("no leak above ") and late.judged_seconds > 4 * 3600


def test_a_suspected_verdict_clears_only_after_the_hold() -> None:
    """Creep for 3 h, then flat: suspected while it grows, cleared once the growth has been
    gone for the persistence hold, never flipping back and forth."""
    rng = np.random.default_rng(5)
    t = np.arange(0.0, 8 * 3600.0, 10.0)
    v = 2e9 + 40 * MIB * np.minimum(t, 3 * 3600.0) / 3600.0 + rng.normal(0, MIB, t.size)
    r = replay(t, v, PARAMS, FLOOR)
    assert [up for _, up in r.flips] == [True, False]
    assert r.flips[1][0] > 3 * 3600.0 + PARAMS.persistence


@pytest.mark.parametrize("seed", range(4))  # a day each: one test per seed spreads over the unit tier's workers
def test_brief_dips_below_the_floor_are_not_growth(seed: int) -> None:
    """Memory that dips for a moment (pages trimmed and faulted back, a cache block freed and
    taken again) and then returns: a trough envelope that held the dip would rise as it left,
    a step up read as a leak. Flat memory with 1 MiB jitter and a dip of 8-20 MiB, one or two
    samples long, every 1-2 h for a day: never suspected."""
    rng = np.random.default_rng(100 + seed)
    t = np.arange(0.0, 24 * 3600.0, 10.0)
    v = 2e9 + rng.normal(0, MIB, t.size)
    at = 1800.0
    while at < t[-1]:
        i = int(at / 10.0)
        v[i : i + int(rng.integers(1, 3))] -= rng.uniform(8, 20) * MIB
        at += rng.uniform(3600.0, 7200.0)
    r = replay(t, v, PARAMS, FLOOR, step=300.0)
    assert r.flips == [], (seed, r.final.reason)


def test_slope_below_the_floor_is_not_a_leak() -> None:
    """A clean 1 MiB/h rise is significant, but under the 2 MiB/h default floor."""
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    v = 1e9 + 1 * MIB * t / 3600.0
    j = judge(t, v, PARAMS, FLOOR)
    assert not j.positive and "below the floor" in j.reason
    assert j.slope_bytes_per_hour == pytest.approx(1 * MIB, rel=0.05)
    assert judge(t, v, PARAMS, 0.5 * MIB).positive  # a per-series floor lower than the growth


def test_not_judged_during_warmup() -> None:
    t = np.arange(0.0, 1200.0, 10.0)
    j = judge(t, 1e9 + t * 1e4, PARAMS, FLOOR)
    assert not j.positive and j.reason == "warming up" and np.isnan(j.slope_bytes_per_hour)
    assert np.isnan(j.detectable_bytes_per_hour)


def test_warmup_that_keeps_decelerating_extends_past_the_floor() -> None:
    """A 1 GiB fill with a 12 min time constant is still growing at the 15 min floor: the
    data-found end of warm-up holds judgement back, and the plateau is never called a leak."""
    rng = np.random.default_rng(2)
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    v = 2e9 + 1024 * MIB * (1 - np.exp(-t / 720.0)) + rng.normal(0, MIB, t.size)
    r = replay(t, v, PARAMS, FLOOR, step=60.0)
    assert r.first_suspected_at is None, r.final.reason


def test_persistence_flips_up_at_once_and_clears_after_the_hold() -> None:
    p = Persistence(hold=1800.0)
    assert not p.update(0.0, False) and not p.suspected
    assert p.update(60.0, True) and p.suspected  # the threshold already spent the run's alpha
    assert not p.update(600.0, False)  # one judgement that no longer holds does not clear it
    assert not p.update(1200.0, True)  # and one that holds resets the clock
    assert not p.update(1800.0, False) and p.suspected
    assert p.update(3600.0, False) and not p.suspected


def test_floor_table_per_series_and_default() -> None:
    table = {"host_rss": 8 * MIB, "default": 4 * MIB}
    assert floor_for("host_rss", table) == 8 * MIB
    assert floor_for("gpu_memory_used", table) == 4 * MIB
    assert floor_for("gpu_memory_used", {}) == 2 * MIB


# ------------------------------------------------------------------ primitives


def test_slope_variance_matches_the_spread_of_slopes_under_ar1_noise() -> None:
    """The variogram-based variance of a 60-point slope matches Monte Carlo under strongly
    autocorrelated noise (where the white-noise formula is several times too small)."""

    rng = np.random.default_rng(4)
    x = np.arange(60.0)
    c = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    slopes = [float(np.dot(c, ar1_noise(rng, 60, 1.0, 0.9))) for _ in range(3000)]
    history = ar1_noise(rng, 1200, 1.0, 0.9)
    est = slope_variance(history, 60)
    assert est == pytest.approx(np.var(slopes), rel=0.35)
    assert est > 4 * float(np.sum(c * c))  # what white noise of the same variance would give


def test_take_out_step_removes_one_shift_and_not_a_creep() -> None:
    rng = np.random.default_rng(8)
    noise = rng.normal(0, 1.0, 200)
    step = noise + 50.0 * (np.arange(200) >= 120)
    out = take_out_step(step[-60:], step, max_lag=5)
    assert np.ptp(out) < 10.0
    creep = noise + 0.5 * np.arange(200)
    assert np.array_equal(take_out_step(creep[-60:], creep, max_lag=5), creep[-60:])


def test_theil_sen_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 100, 40))
    y = 3 * x + rng.standard_t(2, 40) * 10
    assert theil_sen(x, y) == pytest.approx(theilslopes(y, x).slope)


def test_mann_kendall_is_hamed_rao_never_narrower() -> None:
    """Same S as pymannkendall; the variance is Hamed-Rao's when it widens, never smaller."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        y = np.cumsum(rng.normal(size=30)) + rng.normal(size=30)
        ours = mann_kendall(y)
        hr, plain = mk.hamed_rao_modification_test(y), mk.original_test(y)
        assert ours.s == hr.s
        assert abs(ours.z) <= abs(plain.z) + 1e-9
        if hr.var_s >= plain.var_s:
            assert ours.z == pytest.approx(hr.z)


def test_lower_envelope_rides_out_a_sawtooth() -> None:
    """A 10-minute GC sawtooth of 100 MiB leaves a flat envelope; rising troughs show through."""
    t = np.arange(0.0, 3 * 3600.0, 10.0)
    saw = 100 * MIB * ((t % 600.0) / 600.0)
    _, flat = lower_envelope(t, 1e9 + saw, 1200.0, 300.0)
    assert np.ptp(flat) < 0.05 * MIB
    x, rising = lower_envelope(t, 1e9 + saw + 10 * MIB * t / 3600, 1200.0, 300.0)
    assert theil_sen(x, rising) * 3600 == pytest.approx(10 * MIB, rel=0.05)


def test_trough_envelope_starts_with_its_first_full_window() -> None:
    """A minimum of fewer points reads higher: an envelope that took the minimum so far would
    fall over its first window on every history (leak-free AR(1) at 1-min bins, a 30-point
    window: -0.31 standard errors on average, a bias against every leak). Full windows only: none."""
    k, n, phi = 30, 240, math.exp(-1.0 / 5.0)
    z_so_far: list[float] = []
    z_full: list[float] = []
    for seed in range(200):
        y = ar1_noise(np.random.default_rng(seed), n, 1.0, phi)
        for full, zs in ((False, z_so_far), (True, z_full)):
            env = trailing_min(y, k, full=full)
            env = env[np.isfinite(env)]
            zs.append(ols_slope(env) / math.sqrt(slope_variance(env - env.mean(), env.size)))
    assert np.all(np.isnan(trailing_min(np.arange(10.0), 4, start=2, full=True)[:3]))
    assert trailing_min(np.arange(10.0), 4, start=2, full=True)[3:].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert np.mean(z_so_far) < -0.2  # the bias this removes (-0.31, 4.4 standard errors of the mean)
    assert abs(np.mean(z_full)) < 0.15  # 200 histories: the mean's standard error is about 0.07


def test_warmup_end_finds_the_knee_of_a_fill_then_plateau() -> None:
    x = np.arange(30, dtype=float)
    y = np.minimum(x, 10.0) * 5 + np.sin(x) * 0.1
    assert 9 <= warmup_end(x, y) <= 11
    assert warmup_end(x, x * 2.0) == 0  # a straight line has no knee
    assert warmup_end(x, np.maximum(x - 10, 0.0)) == 0  # acceleration is not warm-up


def test_leak_settings_are_validated_with_their_key_path() -> None:
    cfg = load_config(None, {"leak.persistence": "10m", "leak.min_slope_bytes_per_hour": {"host_rss": 1e6}})
    assert cfg.leak.persistence == 600.0 and DetectorParams.from_config(cfg.leak).persistence == 600.0
    bad: list[tuple[dict[str, Any], str]] = [
        ({"leak.alpha": "0.9"}, "leak.alpha"),
        ({"leak.min_slope_bytes_per_hour": {"rss": 1.0}}, "leak.min_slope_bytes_per_hour.rss"),
        ({"leak.min_slope_bytes_per_hour": {"host_rss": -1.0}}, "leak.min_slope_bytes_per_hour.host_rss"),
        ({"leak.bin": "40m"}, "leak.trough_span"),
        ({"leak.cuda_history": "sometimes"}, "leak.cuda_history"),
        ({"leak.cuda_history_max_entries": "0"}, "leak.cuda_history_max_entries"),
        ({"leak.min_span": "1m"}, "leak.min_span"),
    ]
    for overrides, key in bad:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, overrides)
    # A short window (an accelerated run) is valid: the other time scales shrink with it.
    fast = load_config(None, {"leak.window": "45s", "leak.warmup": "10s"}).leak
    p = DetectorParams.from_config(fast)
    assert (p.bin, p.min_span, p.trough_span, p.persistence) == (1.5, 15.0, 15.0, 15.0)
    assert fast.evaluate_interval == 1.5 and p.floor_scale == 480.0


def test_a_faint_leak_under_noise_that_forgets_in_minutes_is_found() -> None:
    """#39's case: 4 MiB/h under AR(1) noise of 6 MiB with a 5 min correlation time. Over 6 h
    its least-squares slope stands far above the noise; once the noise is seen to level off,
    the whole judged history is one span and the leak is found. The same noise without the
    leak is not flagged at any look."""
    from bench.leak.heldout_traces import ou

    t = np.arange(0.0, 6 * 3600.0, 10.0)
    found = 0
    for seed in range(3):
        noise = ou(np.random.default_rng(100 + seed), t.size, 10.0, 6 * MIB, 300.0)
        found += replay(t, 2e9 + 4 * MIB * t / 3600.0 + noise, PARAMS, FLOOR).suspected
        assert replay(t, 2e9 + noise, PARAMS, FLOOR).first_suspected_at is None
    assert found >= 2


def test_a_slow_gc_sawtooth_is_not_a_leak_once_it_has_turned() -> None:
    """A GC sawtooth of 100 MiB every 70 min rises at 85 MiB/h between collections: after its
    first collection the ramps are noise (the noise's trend is one line for all the data, not
    one per block), so no look from 1.5 h on flags it."""
    rng = np.random.default_rng(4)
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    v = 2e9 + 100 * MIB * ((t + 1800.0) % 4200.0) / 4200.0 + rng.normal(0, 0.5 * MIB, t.size)
    r = replay(t, v, PARAMS, FLOOR)
    assert all(at < 1.5 * 3600 for at, up in r.flips if up), r.flips


def test_early_looks_flag_only_rises_far_beyond_the_noise() -> None:
    """In the first 2 h of judged data a span needs twice its threshold z: a ramp of 60 MiB/h
    under 3 MiB of jitter 44 min in (a load cycle's rise, or a leak: the data cannot tell yet)
    is "not judged yet"; 200 MiB/h is a leak at once."""
    rng = np.random.default_rng(9)
    t = np.arange(0.0, 3600.0, 10.0)
    jitter = rng.normal(0, 3 * MIB, t.size)
    ramp = judge(t, 2e9 + 60 * MIB * t / 3600.0 + jitter, PARAMS, FLOOR)
    assert not ramp.positive and "not judged yet" in ramp.reason
    assert judge(t, 2e9 + 200 * MIB * t / 3600.0 + jitter, PARAMS, FLOOR).positive


def test_hinge_residual_takes_out_a_line_that_bends_once() -> None:
    from soakd.analysis.trend import hinge_residual

    x = np.arange(400, dtype=np.float64)
    bent = 5.0 + 0.1 * x + 0.4 * np.maximum(0.0, x - 250)
    assert np.max(np.abs(hinge_residual(bent))) < 0.5  # the knot grid is 1/16th of the span
    wave = np.sin(x / 20.0)
    assert np.std(hinge_residual(wave)) > 0.5  # a swing is not a bend: it stays as noise
