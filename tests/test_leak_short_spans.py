"""#39, fourth round: after the first 2 h, the 15 and 30 min spans must still rise by more than
the swings the series has shown. Each leak-free trace below was paged by the code before it, on a
short span hours into the run (a wander's, a daily cycle's or a spike's rise); a strong leak that
starts late is still caught within the hour."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bench.leak import fresh_traces as fresh
from bench.leak import week_traces as week
from soakd.analysis.params import DEFAULT_FLOOR_BYTES_PER_HOUR, DetectorParams
from soakd.analysis.replay import replay

HOURS = 6 * 3600.0


SETS: dict[str, Callable[..., Any]] = {"fresh": fresh.generate, "week": week.generate}


@pytest.mark.parametrize(
    ("corpus", "shape", "seed"),
    [
        ("fresh", "wander_10", 6),  # 33.6 MiB/h over 15 min at 2.4 h, before
        ("fresh", "diurnal", 1),  # 32.5 MiB/h over 15 min at 3.9 h
        ("fresh", "diurnal", 7),
        ("fresh", "spikes", 0),
        ("week", "wander", 4),
        ("week", "wander", 5),
    ],
)
def test_a_short_rise_within_the_swings_seen_is_not_a_leak(corpus: str, shape: str, seed: int) -> None:
    tr = SETS[corpus](shape, seed, duration=HOURS)
    r = replay(tr.t, tr.v, DetectorParams(), DEFAULT_FLOOR_BYTES_PER_HOUR, step=300.0)
    assert r.flips == [], r.flips


def test_a_strong_leak_after_hours_of_swings_is_still_caught_within_the_hour() -> None:
    tr = fresh.generate("leak_late", 6, duration=HOURS)  # 3.1 h of swings, then 141 MiB/h
    r = replay(tr.t, tr.v, DetectorParams(), DEFAULT_FLOOR_BYTES_PER_HOUR, step=300.0)
    start = tr.leak_start
    assert start is not None and start > 3 * 3600.0
    after = [at for at, up in r.flips if up and at >= start]
    assert after and after[0] - start < 3600.0
