"""Before the series could have shown its slow swings (2 h of judging), a rise pages only when it
is fast enough that the time-to-verdict goals need it paged now; a slower one is a finding,
"early", until 2 h of judging confirm it, and the end of a run judges it without the hold
(soakd/analysis/pages.py, #39)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from soakd.analysis.judgement import Judgement
from soakd.analysis.monitor import LeakMonitor, Verdict
from soakd.analysis.pages import beyond_horizon, early_page_rate, goal_rate
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


def test_a_rise_the_first_swing_may_be_is_a_finding_until_two_hours_of_judging() -> None:
    """15 MiB/h from the start: a GC sawtooth's first ramp or a load cycle's first rise looks
    just so. At 1 h the trend test is sure of it, but it is under the early rate (75 MiB/h
    then): an "early" finding, no page. Rising on, it pages once 2 h are judged (2.25 h in,
    after the 15 min warm-up), where the early rate (23 MiB/h by then) would still hold it."""
    t, v = rise(15.0, 0.0, 3 * H)
    monitor, metrics, events = watch(t, v, 1.0 * H)
    verdict = monitor.verdicts()["host_rss"]
    assert (verdict.state, verdict.finding) == ("ok", "early"), verdict.reason
    assert "not paged yet" in verdict.reason
    assert metrics.registry.get_sample_value("soakd_leak_suspected", {"series": "host_rss"}) == 0
    assert finding(metrics, "early") == 1 and [k for k, _ in events] == ["leak_finding"]

    monitor, metrics, events = watch(t, v, 3 * H)
    verdict = monitor.verdicts()["host_rss"]
    assert verdict.state == "leak" and verdict.finding == "", verdict.reason
    assert finding(metrics, "early") == 0
    assert events[0][0] == "leak_finding" and events[0][1]["finding"] == "early"
    assert [k for k, _ in events].count("leak_suspected") == 1 and events[-1][0] == "leak_suspected"

    # A replay (the benches, soakd analyze) pages at the same look, after 2 h of judging.
    r = replay(t, v, DetectorParams(), 2 * MIB, step=300.0, page_above=HEADROOM / (30 * 24.0))
    assert r.first_suspected_at is not None and r.first_suspected_at <= 1.0 * H
    assert r.first_paged_at is not None and 2.25 * H <= r.first_paged_at <= 2.5 * H


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


def test_a_held_finding_never_reads_as_no_leak() -> None:
    """A rise still held by its signs whose 90% lower bound is no longer above zero: the finding
    says its rate may be nil, not that the headroom lasts "inf d"."""
    held = Judgement(False, 0.7 * MIB, 0.5, "no leak above 5.91 MiB/h after 1.22 h", slope_se_bytes_per_hour=MIB)
    why = beyond_horizon(held, HEADROOM, 30 * 86400.0)
    assert "may be nil" in why and "inf" not in why
    verdict = Verdict.of("host_rss", False, held, float("inf"), "creep", why)
    assert "no leak above" not in verdict.reason and "still holding: troughs rise 0.70 MiB/h" in verdict.reason
