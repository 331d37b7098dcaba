"""A rise pages once it has gone on as long as the time-to-verdict goals allow for its rate (a
swing's rise stops before then, a leak goes on); until then it is a finding, "early", and the end
of a run judges it without the hold (soakd/analysis/pages.py, #39)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from soakd.analysis.judgement import Judgement
from soakd.analysis.monitor import LeakMonitor, Verdict
from soakd.analysis.pages import beyond_horizon, early_page_rate, goal_rate, held_early, rise_age
from soakd.analysis.params import DetectorParams
from soakd.analysis.replay import replay
from soakd.config import LeakConfig
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.series import SeriesStore

MIB = float(1 << 20)
H = 3600.0
T0 = 1_700_000_000.0
HEADROOM = 8 * 1024 * MIB  # 30 days at 11.4 MiB/h


def test_the_hold_follows_the_time_to_verdict_goals() -> None:
    """100 MiB/h must page within 1 h and 20 MiB/h within 3 h; an accelerated run (its hour
    1/scale of one) needs the same rise in its own time, at scale times the rate."""
    assert goal_rate(H) == pytest.approx(100 * MIB)
    assert goal_rate(3 * H) == pytest.approx(20 * MIB)
    assert early_page_rate(0.5 * H) > early_page_rate(H) > early_page_rate(2 * H)
    assert early_page_rate(H / 480, 480.0) == pytest.approx(480 * early_page_rate(H))


def test_a_rise_is_as_old_as_its_height_allows_at_its_rate() -> None:
    """A swing's rise of 30 MiB over 30 points, read at 1 MiB a point, goes back about 30 points
    however long the flat stretch before it; the same rate steady over all the history goes back
    to the run's start, whatever the noise does to the oldest points."""
    rng = np.random.default_rng(4)
    flat_then_rise = np.concatenate([np.zeros(150), np.arange(1.0, 31.0)]) * MIB + rng.normal(0, 0.2 * MIB, 180)
    assert 28 <= rise_age(flat_then_rise, 1.0 * MIB, run_points=200) <= 33
    # Read at half the rate, the same rise is twice as old: the age follows the rate, not the data's length.
    assert 56 <= rise_age(flat_then_rise, 0.5 * MIB, run_points=200) <= 65
    steady = np.arange(180.0) * MIB + rng.normal(0, 0.2 * MIB, 180)
    assert rise_age(steady, 0.995 * MIB, run_points=200) == 200
    assert rise_age(steady, 0.0, run_points=200) == 200  # no rate: nothing to hold it by


def rise(rate_mib_per_h: float, start: float, end: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """10 s samples of a quiet series (0.3 MiB jitter) that rises steadily from ``start``."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, end, 10.0)
    v = 2e9 + rng.normal(0.0, 0.3 * MIB, t.size) + np.clip(t - start, 0.0, None) / H * rate_mib_per_h * MIB
    return t, v


def watch(
    t: np.ndarray, v: np.ndarray, until: float, step: float = 300.0
) -> tuple[LeakMonitor, Metrics, list[tuple[str, dict[str, Any]]]]:
    """The live monitor over the samples up to ``until``, a look every ``step`` s, 8 GiB of headroom."""
    store, metrics, events = SeriesStore(), Metrics(), []

    def on_event(kind: str, detail: dict[str, Any]) -> None:
        events.append((kind, detail))

    monitor = LeakMonitor(store, metrics, LeakConfig(), lambda s: HEADROOM, on_event, since=T0)
    fed = 0
    for now in np.arange(step, until + 1e-9, step):
        hi = int(np.searchsorted(t, now, side="right"))
        for a, b in zip(t[fed:hi], v[fed:hi], strict=True):
            store.append("host_rss", T0 + float(a), float(b))
        fed = hi
        monitor.evaluate(T0 + now)
    return monitor, metrics, events


def finding(metrics: Metrics, kind: str) -> float | None:
    return metrics.registry.get_sample_value("soakd_leak_finding", {"series": "host_rss", "finding": kind})


def test_a_rise_pages_once_it_has_gone_on_as_long_as_the_goals_allow() -> None:
    """15 MiB/h from the start: a GC sawtooth's ramp or a load cycle's rise looks just so. At 1 h
    the trend test is sure of it, but the goals allow a rise that slow 3.6 h before its page:
    an "early" finding, no page. Rising on, it pages once it has gone on that long."""
    t, v = rise(15.0, 0.0, 3.5 * H)
    monitor, metrics, events = watch(t, v, 1.0 * H)
    verdict = monitor.verdicts()["host_rss"]
    assert (verdict.state, verdict.finding) == ("ok", "early"), verdict.reason
    assert "not paged yet" in verdict.reason and "if it goes on" in verdict.reason
    assert metrics.registry.get_sample_value("soakd_leak_suspected", {"series": "host_rss"}) == 0
    assert finding(metrics, "early") == 1 and [k for k, _ in events] == ["leak_finding"]

    monitor, metrics, events = watch(t, v, 3.5 * H)
    verdict = monitor.verdicts()["host_rss"]
    assert verdict.state == "leak" and verdict.finding == "", verdict.reason
    assert finding(metrics, "early") == 0
    assert events[0][0] == "leak_finding" and events[0][1]["finding"] == "early"
    assert [k for k, _ in events].count("leak_suspected") == 1 and events[-1][0] == "leak_suspected"

    # A replay (the benches, soakd analyze) pages at the same look: where the goals' rate for the
    # run's age (the rise goes back to its start), times EARLY_SHARE, falls to the rise's.
    r = replay(t, v, DetectorParams(), 2 * MIB, step=300.0, page_above=HEADROOM / (30 * 24.0))
    assert r.first_suspected_at is not None and r.first_suspected_at <= 1.0 * H
    assert r.first_paged_at is not None and 2.25 * H <= r.first_paged_at <= 3 * H
    assert early_page_rate(r.first_paged_at) <= 15 * MIB < early_page_rate(r.first_paged_at - 1800.0)


def test_a_rise_that_stops_hours_into_a_run_is_a_finding_the_same_rise_going_on_pages() -> None:
    """Flat for 2.5 h, then 30 MiB over 30 min (a load cycle's high phase, a wander's excursion,
    bigger than any swing before it): the trend test flags it, but a rise that young at 60 MiB/h
    is not paged, and it stops before the goals would need it paged. The same rise going on is a
    60 MiB/h leak: paged within the 85 min the goals allow for its rate."""
    t, v = rise(60.0, 2.5 * H, 5 * H, seed=3)
    stops = np.minimum(v, v[0] + np.clip(t - 2.5 * H, 0.0, 0.5 * H) / H * 60.0 * MIB + 2 * MIB)
    page_above = HEADROOM / (30 * 24.0)
    swing = replay(t, stops, DetectorParams(), 2 * MIB, step=300.0, page_above=page_above)
    assert swing.first_suspected_at is not None and swing.first_paged_at is None
    leak = replay(t, v, DetectorParams(), 2 * MIB, step=300.0, page_above=page_above)
    assert leak.first_paged_at is not None and 2.5 * H + 30 * 60 < leak.first_paged_at <= 2.5 * H + 85 * 60


def test_a_fast_rise_pages_at_once() -> None:
    """300 MiB/h from 20 min in outruns what the goals allow waiting for: paged within the hour."""
    t, v = rise(300.0, 20 * 60.0, 1.0 * H, seed=1)
    monitor, _, events = watch(t, v, 1.0 * H)
    assert monitor.verdicts()["host_rss"].state == "leak"
    assert [k for k, _ in events] == ["leak_suspected"]


def test_the_end_of_a_run_has_no_later() -> None:
    """The run's closing look judges the held rise without the hold: a 1 h soak with a 40 MiB/h
    leak ends "leak" in its summary, as `soakd analyze` of its series says."""
    t, v = rise(40.0, 0.0, 1.0 * H, seed=2)
    monitor, _, _ = watch(t, v, 1.0 * H)
    assert monitor.verdicts()["host_rss"].finding == "early"
    closing = monitor.evaluate(T0 + 1.0 * H, final=True)["host_rss"]
    assert closing.state == "leak", closing.reason
    assert replay(t, v, DetectorParams(), 2 * MIB, step=300.0).suspected


def test_a_gauge_in_its_own_unit_is_not_held() -> None:
    """The goals price a rise in bytes per hour; a scraped server gauge (a ratio, a count) has no
    such rate, so, as with its unknown headroom, a rise the test is sure of pages."""
    young = Judgement(True, 0.5, 0.0, "troughs rise", slope_se_bytes_per_hour=0.01, early_page_bytes_per_hour=60 * MIB)
    assert held_early(young) and not held_early(young, in_bytes=False) and not held_early(young, final=True)


def test_a_held_finding_never_reads_as_no_leak() -> None:
    """A rise still held by its signs whose 90% lower bound is no longer above zero: the finding
    says its rate may be nil, not that the headroom lasts "inf d"."""
    held = Judgement(False, 0.7 * MIB, 0.5, "no leak above 5.91 MiB/h after 1.22 h", slope_se_bytes_per_hour=MIB)
    why = beyond_horizon(held, HEADROOM, 30 * 86400.0)
    assert "may be nil" in why and "inf" not in why
    verdict = Verdict.of("host_rss", False, held, float("inf"), "creep", why)
    assert "no leak above" not in verdict.reason and "still holding: troughs rise 0.70 MiB/h" in verdict.reason
