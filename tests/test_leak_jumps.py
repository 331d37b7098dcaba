"""A rise made of a few jumps is as sure as their count (soakd/analysis/settling.py: jumps):
the page's consequence is judged on the count's Poisson bound, not on the noise between the
jumps, which says nothing of when the next one comes (#39)."""

from __future__ import annotations

import numpy as np

from soakd.analysis.detector import judge
from soakd.analysis.judgement import Z90
from soakd.analysis.jumps import jumps, steps_lower
from soakd.analysis.params import DetectorParams

MIB = float(1 << 20)
LAG = 15  # 15 min at 1 min bins: the detector's STEP_SETTLE


def quiet_history(rng: np.random.Generator, n: int = 240) -> np.ndarray:
    return 1e9 + rng.normal(0.0, 0.2 * MIB, n)


def test_two_jumps_with_flat_stretches_between_are_counted() -> None:
    rng = np.random.default_rng(0)
    span = quiet_history(rng, 120)
    span[40:] += 10 * MIB
    span[90:] += 8 * MIB
    history = np.concatenate([quiet_history(rng), span])
    assert jumps(span, history, LAG) == 2


def test_a_ramp_of_the_same_rise_is_not_jumps() -> None:
    """A leak's rise comes in every stretch: its changes are back to back, not jumps."""
    rng = np.random.default_rng(1)
    span = quiet_history(rng, 120) + np.linspace(0.0, 18 * MIB, 120)
    history = np.concatenate([quiet_history(rng), span])
    assert jumps(span, history, LAG) == 0


def test_a_leak_s_onset_is_not_a_jump_until_a_flat_stretch_follows() -> None:
    """A rise in the newest 10 min may be a leak that has just begun: no jump yet. The same
    rise 20 min before the end, flat since, is one."""
    rng = np.random.default_rng(3)
    onset = quiet_history(rng, 120)
    onset[110:] += np.linspace(2.0, 20.0, 10) * MIB
    history = np.concatenate([quiet_history(rng), onset])
    assert jumps(onset, history, LAG) == 0
    done = quiet_history(rng, 120)
    done[98:] += 20 * MIB
    assert jumps(done, np.concatenate([quiet_history(rng), done]), LAG) == 1


def test_a_step_that_is_over_counts_before_it_is_15_min_old() -> None:
    """A step made within a minute and flat for 6 min since is over: an allocator's new
    segment, not a leak's onset (which keeps rising every minute). It counts as one jump, so a
    15 min span that holds it is judged on one jump's count; 2 min after it, it may still go on."""
    rng = np.random.default_rng(4)
    for age, counted in ((7, 1), (3, 0)):
        span = quiet_history(rng, 15)
        span[15 - age :] += 6 * MIB
        history = np.concatenate([quiet_history(rng), span])
        assert jumps(span, history, LAG) == counted, age


def test_noise_alone_is_not_jumps() -> None:
    rng = np.random.default_rng(2)
    span = quiet_history(rng, 120)
    assert jumps(span, np.concatenate([quiet_history(rng), span]), LAG) == 0


def test_a_staircase_pages_on_its_count_and_a_leak_on_its_noise() -> None:
    """Three steps of 12 MiB an hour apart after 2.5 h are flagged as a staircase; the rate the
    page is judged on is the steps' trend scaled by three steps' 90% Poisson bound (0.37x), so
    8 GiB of headroom over 30 days (11.4 MiB/h) is not paged on three steps. A steady leak of
    10 MiB/h from 2.5 h is paged on its slope's normal bound."""
    rng = np.random.default_rng(5)
    t = np.arange(0.0, 5 * 3600.0 + 1, 10.0)
    stairs = 1e9 + rng.normal(0.0, 0.2 * MIB, t.size)
    for at in (2.5, 3.3, 4.1):
        stairs[t >= at * 3600.0] += 12 * MIB
    j = judge(t, stairs, DetectorParams(), 2 * MIB, now=float(t[-1]), since=0.0)
    assert j.positive and "step up 3 times" in j.reason, j.reason
    assert abs(j.slope_lower_bytes_per_hour - j.slope_bytes_per_hour * steps_lower(3, Z90) / 3) < 1e-6 * MIB
    assert j.slope_lower_bytes_per_hour < 11.4 * MIB < j.slope_bytes_per_hour

    ramp = 1e9 + rng.normal(0.0, 0.2 * MIB, t.size) + np.clip(t - 2.5 * 3600.0, 0.0, None) / 3600.0 * 20 * MIB
    j = judge(t, ramp, DetectorParams(), 2 * MIB, now=float(t[-1]), since=0.0)
    assert j.positive and not np.isfinite(j.jumps_lower_bytes_per_hour)
    assert j.slope_lower_bytes_per_hour > 11.4 * MIB
