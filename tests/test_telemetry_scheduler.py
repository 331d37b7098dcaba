"""The sampler scheduler: each source on its own APScheduler job, time-bounded and isolated."""

from __future__ import annotations

import logging
import os
import threading
import time
from types import SimpleNamespace

import pytest

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.host import HostSampler
from soakd.telemetry.nvml import NvmlSampler
from soakd.telemetry.scheduler import SamplerScheduler, SourceUnavailable
from tests.conftest import wait_for
from tests.telemetry_fakes import FakeNvml


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


class Counting:
    """A sampler that counts its samples and can be told to fail."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples = 0
        self.fail: Exception | None = None
        self.closed = False

    def open(self) -> None:
        pass

    def sample(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.samples += 1

    def close(self) -> None:
        self.closed = True


class Absent(Counting):
    def open(self) -> None:
        raise SourceUnavailable("no such device here")


def test_hung_source_is_marked_down_and_the_others_keep_sampling() -> None:
    """An NVML call that blocks marks nvml down after sample_timeout; host keeps its schedule;
    the hung call is not re-entered, and nvml comes back once the call returns."""
    m = Metrics()
    release = threading.Event()
    nv = FakeNvml(os.getpid(), block=release)
    calls = 0
    original = nv.nvmlDeviceGetMemoryInfo

    def counted(h: int, version: int | None = None) -> SimpleNamespace:
        nonlocal calls
        calls += 1
        return original(h, version)

    nv.nvmlDeviceGetMemoryInfo = counted  # type: ignore[method-assign]
    other = Counting("other")
    sched = SamplerScheduler(m, sample_timeout=0.3)
    sched.add(NvmlSampler(m, None, nv), 0.1)
    sched.add(HostSampler(m, None), 0.1)
    sched.add(other, 0.1)
    sched.start()
    try:
        wait_for(lambda: sched.states()["nvml"] == "hung", 10, 0.05, "nvml to be marked hung")
        assert value(m, "soakd_collector_up", source="nvml") == 0
        n0 = other.samples
        time.sleep(1.0)
        assert other.samples >= n0 + 5  # ~10/s while nvml is stuck
        assert value(m, "soakd_collector_up", source="host") == 1
        assert value(m, "soakd_collector_up", source="nvml") == 0
        assert calls == 1  # never re-entered while hung
        release.set()
        wait_for(lambda: value(m, "soakd_collector_up", source="nvml") == 1, 10, 0.05, "nvml to recover")
        g = nv.answers["gpus"][0]  # a device's recorded answers where there are some (telemetry_fakes)
        assert value(m, "soakd_gpu_temperature_celsius", gpu="0", uuid=g["uuid"]) == g["temperature_c"]
    finally:
        release.set()
        sched.shutdown()


def test_collector_metrics_for_a_good_source() -> None:
    """A working source reports up 1, its sample duration, and the time of its last success."""
    m = Metrics()
    sched = SamplerScheduler(m, clock=lambda: 1234.5)
    src = Counting("src")
    sched.add(src, 60)
    assert sched.run_once("src")
    assert value(m, "soakd_collector_up", source="src") == 1
    assert value(m, "soakd_collector_last_success_timestamp_seconds", source="src") == 1234.5
    duration = value(m, "soakd_collector_duration_seconds", source="src")
    assert duration is not None and 0 <= duration < 1
    sched.shutdown()
    assert src.closed


def test_absent_source_reports_down_once_and_is_not_sampled(caplog: pytest.LogCaptureFixture) -> None:
    """An absent source: collector_up 0, one log line, no further attempts."""
    m = Metrics()
    sched = SamplerScheduler(m)
    absent = Absent("gpu_thing")
    sched.add(absent, 0.05)
    caplog.set_level(logging.DEBUG, logger="soakd.telemetry")
    sched.start()
    try:
        time.sleep(0.6)
    finally:
        sched.shutdown()
    assert value(m, "soakd_collector_up", source="gpu_thing") == 0
    assert sched.states()["gpu_thing"] == "absent"
    lines = [r for r in caplog.records if "gpu_thing" in r.getMessage()]
    assert len(lines) == 1 and "no such device here" in lines[0].getMessage()
    assert absent.samples == 0


def test_shutdown_while_a_source_finds_itself_absent_returns() -> None:
    """A source whose open() says "unavailable" while shutdown() is under way (a run that ends
    within its first sampling tick: a model that fails warm-up) must not hang the exit: the tick
    used to remove its own job, which waits for the lock shutdown holds while it joins the tick."""
    entered, release = threading.Event(), threading.Event()

    class SlowAbsent(Counting):
        def open(self) -> None:
            entered.set()
            release.wait(5)
            raise SourceUnavailable("no such device here")

    m = Metrics()
    sched = SamplerScheduler(m, sample_timeout=3.0)
    sched.add(SlowAbsent("gpu_thing"), 60)
    sched.start()
    assert entered.wait(5)
    stopper = threading.Thread(target=sched.shutdown, daemon=True)
    stopper.start()
    time.sleep(0.3)  # shutdown now holds the scheduler's locks and waits for the tick
    release.set()
    stopper.join(10)
    assert not stopper.is_alive(), "shutdown hung on the absent source's tick"
    assert sched.states()["gpu_thing"] == "absent"
    assert value(m, "soakd_collector_up", source="gpu_thing") == 0


def test_failing_source_logs_once_until_it_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """Repeated failures give one warning; recovery gives one info line and up 1 again."""
    m = Metrics()
    sched = SamplerScheduler(m)
    src = Counting("flaky")
    sched.add(src, 60)
    caplog.set_level(logging.INFO, logger="soakd.telemetry")
    src.fail = OSError("read failed")
    for _ in range(5):
        assert not sched.run_once("flaky")
    assert value(m, "soakd_collector_up", source="flaky") == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "read failed" in warnings[0].getMessage()
    src.fail = None
    assert sched.run_once("flaky")
    assert value(m, "soakd_collector_up", source="flaky") == 1
    assert any("sampling again" in r.getMessage() for r in caplog.records)
    sched.shutdown()


def test_interval_is_honoured() -> None:
    """A 0.1 s interval gives about ten samples a second."""
    m = Metrics()
    sched = SamplerScheduler(m)
    src = Counting("tick")
    sched.add(src, 0.1)
    sched.start()
    time.sleep(1.05)
    sched.shutdown()
    assert 7 <= src.samples <= 13


def test_open_that_overruns_is_used_once_it_returns() -> None:
    """A slow nvmlInit-like open marks the source hung; when it returns the source samples
    without opening a second time."""
    release = threading.Event()

    class SlowOpen(Counting):
        opens = 0

        def open(self) -> None:
            self.opens += 1
            release.wait()

    m = Metrics()
    sched = SamplerScheduler(m, sample_timeout=0.1)
    src = SlowOpen("slow")
    sched.add(src, 60)
    assert not sched.run_once("slow")
    assert sched.states()["slow"] == "hung"
    assert not sched.run_once("slow")  # still inside open(): not re-entered
    release.set()
    wait_for(lambda: sched.run_once("slow"), 5, 0.05, "the source to sample after its open returned")
    assert src.opens == 1 and src.samples == 1
    assert value(m, "soakd_collector_up", source="slow") == 1
    sched.shutdown()


def test_shutdown_does_not_wait_for_a_call_that_never_returns() -> None:
    """The end of a run is not held up by a driver call that is still hung (its thread is a daemon)."""
    never = threading.Event()

    class Stuck(Counting):
        def sample(self) -> None:
            never.wait()

    m = Metrics()
    sched = SamplerScheduler(m, sample_timeout=0.2)
    sched.add(Stuck("stuck"), 0.05)
    sched.add(Counting("fine"), 0.05)
    sched.start()
    wait_for(lambda: sched.states()["stuck"] == "hung", 5, 0.02, "stuck to be marked hung")
    t0 = time.monotonic()
    sched.shutdown()
    assert time.monotonic() - t0 < 2.0
    assert sched.states()["fine"] == "up"
