"""The week held-out trace generator (bench/leak/week_traces.py): what grading and its oracle rely on."""

from __future__ import annotations

import numpy as np
import pytest

from bench.leak import week_traces as week

H = 3600.0
pytestmark = pytest.mark.unit  # pure generation (the tier reader takes a helper name for a process call)


@pytest.mark.parametrize("shape", list(week.SHAPES))
def test_traces_are_reproducible_and_leak_as_labelled(shape: str) -> None:
    a, b = week.generate(shape, 3, duration=2 * H), week.generate(shape, 3, duration=2 * H)
    assert np.array_equal(a.v, b.v) and a.t.size == 720
    assert a.leaking == (shape in week.LEAKING) and (a.leak_rate > 0) == a.leaking
    assert not np.array_equal(a.v, week.generate(shape, 4, duration=2 * H).v)


def test_oracle_replicas_share_parameters_and_leak_not_noise() -> None:
    """A replica is the same trace's parameters with other noise; the leak part is the trace's
    own in every replica, so noise(None) + leak rebuilds the trace."""
    own = week.noise("leak_ar1_faint", 1, None)
    other = week.noise("leak_ar1_faint", 1, 0)
    leak, start, rate = week.leak_part("leak_ar1_faint", 1)
    assert start == 0.0 and 2.5 * week.MIB <= rate <= 5 * week.MIB
    assert abs(float(np.median(own - other))) < 8 * week.MIB  # same base level
    assert not np.array_equal(own, other)
    tr = week.generate("leak_ar1_faint", 1)
    assert np.array_equal(tr.v, week.pages(own + leak))


def test_arena_settles_below_the_floor_by_six_hours() -> None:
    """The issue's arena: growth at 2.5-10 MiB/h at 1 h, under 2 MiB/h by 6 h (seed-averaged)."""
    late = []
    for seed in range(20):
        tr = week.generate("arena", seed, duration=6 * H)
        tail = tr.t >= 5 * H
        late.append(float(np.polyfit(tr.t[tail] / H, tr.v[tail], 1)[0]) / week.MIB)
    assert float(np.mean(late)) < 2.0
