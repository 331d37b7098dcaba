"""Phases: a linear ramp to the target load, steady state, probes; the engine follows load changes."""

from __future__ import annotations

import pytest

from soakd.config import ConfigError, load_config
from soakd.load.phases import PhaseScheduler, load_at, ramp_fraction
from tests.conftest import wait_for
from tests.test_faults import start_engine


class FakeLoad:
    def __init__(self) -> None:
        self.concurrency: list[int] = []
        self.rates: list[float] = []

    def set_concurrency(self, n: int) -> None:
        self.concurrency.append(n)

    def set_rate(self, rps: float) -> None:
        self.rates.append(rps)


def test_ramp_is_linear_from_the_start_share_to_the_target() -> None:
    """Halfway through a ramp from 10% the load is 55% of the target; closed loop never drops below 1."""
    assert ramp_fraction(5, 10) == 0.5 and ramp_fraction(20, 10) == 1.0 and ramp_fraction(0, 0) == 1.0
    assert load_at(100.0, 0.1, 0.5, closed_loop=False) == pytest.approx(55.0)
    assert load_at(4.0, 0.1, 0.0, closed_loop=True) == 1.0
    assert load_at(32.0, 0.25, 1.0, closed_loop=True) == 32.0


def test_scheduler_ramps_then_holds_steady_and_probes() -> None:
    """The ramp starts low, only rises, ends at the target in 'steady'; a probe steps up and back."""
    cfg = load_config(
        None,
        {
            "load.concurrency": 20,
            "phases.ramp": "600ms",
            "phases.ramp_from": 0.1,
            "phases.probe_factor": 2.0,
            "phases.probe_schedule": "0 * * * *",
        },
    )
    phases: list[str] = []
    load = FakeLoad()
    sched = PhaseScheduler(cfg, load, phases.append)
    assert sched.initial_load() == 2.0
    sched.start()
    try:
        wait_for(lambda: sched.phase == "steady", 20, interval=0.05, what="the ramp to finish")
        assert phases[:1] == ["ramp"] and phases[-1] == "steady"
        assert load.concurrency == sorted(load.concurrency) and load.concurrency[-1] == 20
        assert sched.probe_now() and sched.phase == "probe" and load.concurrency[-1] == 40
        sched.probe_end()
        assert sched.phase == "steady" and load.concurrency[-1] == 20 and phases[-2:] == ["probe", "steady"]
    finally:
        sched.stop()


def test_a_resumed_run_does_not_ramp_again() -> None:
    """A run that already spent longer than the ramp resumes at the target load, in steady state."""
    cfg = load_config(None, {"load.rate": 100, "phases.ramp": "10m"})
    load = FakeLoad()
    sched = PhaseScheduler(cfg, load, lambda p: None, elapsed_before=3600)
    assert not sched.ramping and sched.initial_load() == 100 and load.rates == []


def test_bad_probe_schedule_names_the_key() -> None:
    """A crontab that does not parse is a config error naming phases.probe_schedule."""
    with pytest.raises(ConfigError, match=r"phases\.probe_schedule"):
        load_config(None, {"phases.probe_schedule": "every hour"})


def test_engine_follows_set_concurrency_up_and_down() -> None:
    """Closed loop: raising the target adds requests in flight; lowering it lets them drain to the target."""
    engine, _ = start_engine("builtin:sleep", {"batch_ms": 1.0}, load__concurrency=2, batcher__max_batch_size=4)
    try:
        engine.set_concurrency(12)
        wait_for(lambda: engine.inflight == 12, 20, interval=0.01, what="12 in flight")
        engine.set_concurrency(1)
        wait_for(lambda: engine.inflight == 1, 20, interval=0.01, what="1 in flight")
    finally:
        assert engine.stop(drain_timeout=10)


def test_engine_follows_set_rate() -> None:
    """Open loop: after set_rate the arrivals come at the new rate (300 requests long before 20/s could)."""
    engine, _ = start_engine("builtin:noop", {}, load__rate=20, load__arrival="constant")
    try:
        engine.set_rate(1000)
        wait_for(lambda: engine.stats().completed["ok"] >= 300, 10, what="300 requests at the new rate")
        with pytest.raises(ValueError):
            engine.set_rate(0)
    finally:
        assert engine.stop(drain_timeout=10)
