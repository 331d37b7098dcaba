"""Leak monitor: gauges per series, persistence, events, exhaustion ETA and evidence."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis.evidence import Evidence
from soakd.analysis.monitor import LeakMonitor
from soakd.config import LeakConfig
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.series import SeriesStore

MIB = float(1 << 20)
T0 = 1_700_000_000.0


def fast_leak_config(**kw: Any) -> LeakConfig:
    """Minutes instead of hours, so a test feeds a few hundred samples."""
    base: dict[str, Any] = dict(
        warmup=60.0, window=1800.0, bin=10.0, trough_span=20.0, min_span=120.0, persistence=60.0, evaluate_interval=10.0
    )
    base.update(kw)
    return LeakConfig(**base)


def feed(store: SeriesStore, series: str, t: np.ndarray, v: np.ndarray) -> None:
    for a, b in zip(t, v, strict=True):
        store.append(series, float(a), float(b))


def gauge(metrics: Metrics, name: str, series: str) -> float:
    value = metrics.registry.get_sample_value(f"soakd_{name}", {"series": series})
    assert value is not None, (name, series)
    return value


def finding_gauges(metrics: Metrics, series: str) -> dict[str, float | None]:
    """soakd_leak_finding per kind: what the info alert SoakdMemoryGrowthFinding reads."""
    get = metrics.registry.get_sample_value
    return {k: get("soakd_leak_finding", {"series": series, "finding": k}) for k in ("creep", "allocator_retention")}


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, detail: dict[str, Any]) -> None:
        self.items.append((kind, detail))


def run_until(monitor: LeakMonitor, store: SeriesStore, series: dict[str, Any], end: float, step: float = 10.0) -> None:
    """Feed each series' samples up to each evaluation time, evaluating every ``step`` s."""
    fed = dict.fromkeys(series, 0)
    for now in np.arange(T0 + step, T0 + end + 1e-9, step):
        for name, (t, v) in series.items():
            hi = int(np.searchsorted(t, now, side="right"))
            feed(store, name, t[fed[name] : hi], v[fed[name] : hi])
            fed[name] = hi
        monitor.evaluate(now)


@pytest.fixture
def traces() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    t = T0 + np.arange(0.0, 900.0, 1.0)
    leak = 1e9 + 3600 * MIB * (t - T0) / 3600.0 + rng.normal(0, 0.2 * MIB, t.size)  # 1 MiB/s
    flat = 2e9 + rng.normal(0, 0.2 * MIB, t.size)
    return {"host_rss": (t, leak), "torch_cuda_allocated": (t, flat)}


def test_gauges_events_and_eta(traces: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """A leaking series flips to suspected once (an event), with slope, p and ETA exported;
    a flat series stays clear with an infinite ETA."""
    store, metrics, events = SeriesStore(), Metrics(), Events()
    headroom = {"host_rss": 3600 * MIB, "torch_cuda_allocated": 1e9}
    monitor = LeakMonitor(store, metrics, fast_leak_config(), headroom.get, events, since=T0)
    run_until(monitor, store, traces, 900.0)
    assert gauge(metrics, "leak_suspected", "host_rss") == 1
    assert gauge(metrics, "leak_slope_bytes_per_hour", "host_rss") == pytest.approx(3600 * MIB, rel=0.05)
    # Every verdict says how faint a leak it could have seen; the flat series' is far below the leak.
    assert 0 < gauge(metrics, "leak_detectable_slope_bytes_per_hour", "torch_cuda_allocated") < 3600 * MIB / 10
    v = monitor.verdicts()
    assert (v["host_rss"].state, v["torch_cuda_allocated"].state) == ("leak", "ok")
    assert v["torch_cuda_allocated"].judged_seconds > 0 and v["torch_cuda_allocated"].eta_seconds == math.inf
    assert gauge(metrics, "leak_p_value", "host_rss") < 0.01
    # 3600 MiB of headroom at 3600 MiB/h: an hour.
    assert gauge(metrics, "memory_exhaustion_eta_seconds", "host_rss") == pytest.approx(3600, rel=0.05)
    assert gauge(metrics, "leak_suspected", "torch_cuda_allocated") == 0
    assert math.isinf(gauge(metrics, "memory_exhaustion_eta_seconds", "torch_cuda_allocated"))
    assert [k for k, d in events.items] == ["leak_suspected"]
    detail = events.items[0][1]
    assert detail["series"] == "host_rss" and detail["slope_bytes_per_hour"] > 0
    # Series with no samples have no gauges at all (nothing to judge, nothing to claim).
    assert metrics.registry.get_sample_value("soakd_leak_suspected", {"series": "gpu_memory_used"}) is None


def test_verdict_clears_after_the_leak_stops() -> None:
    store, events = SeriesStore(), Events()
    t = T0 + np.arange(0.0, 1800.0, 1.0)
    v = 1e9 + np.minimum(t - T0, 600.0) * MIB  # grows for 10 minutes, then holds
    monitor = LeakMonitor(store, None, fast_leak_config(window=300.0), lambda s: None, events, since=T0)
    run_until(monitor, store, {"host_rss": (t, v)}, 1800.0)
    assert [k for k, _ in events.items] == ["leak_suspected", "leak_cleared"]
    assert not monitor.verdicts()["host_rss"].suspected


def test_verdicts_are_not_judged_during_warmup() -> None:
    """Before the warm-up floor has passed a series is "not_judged" (never "ok"), NaN on /metrics."""
    store, metrics = SeriesStore(), Metrics()
    t = T0 + np.arange(0.0, 50.0, 1.0)
    monitor = LeakMonitor(store, metrics, fast_leak_config(), lambda s: None, since=T0)
    run_until(monitor, store, {"host_rss": (t, 1e9 + 0 * t)}, 50.0)
    v = monitor.verdicts()["host_rss"]
    assert v.state == "not_judged" and not v.suspected and math.isnan(v.detectable_slope_bytes_per_hour)
    assert math.isnan(gauge(metrics, "leak_detectable_slope_bytes_per_hour", "host_rss"))
    assert v.as_dict()["detectable_slope_bytes_per_hour"] is None and v.as_dict()["state"] == "not_judged"


def test_unknown_limit_gives_nan_eta(traces: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    store = SeriesStore()
    monitor = LeakMonitor(store, Metrics(), fast_leak_config(), lambda s: None, since=T0)
    run_until(monitor, store, {"host_rss": traces["host_rss"]}, 900.0)
    assert math.isnan(monitor.verdicts()["host_rss"].eta_seconds)


class FakeCudaHistory:
    """Stands in for torch's allocation-history ring; records what the evidence did."""

    def __init__(self) -> None:
        self.recording = False
        self.unavailable: str | None = None  # the native allocator: history can be recorded
        self.calls: list[str] = []

    def start(self) -> None:
        if not self.recording:
            self.calls.append("start")
        self.recording = True

    def stop(self) -> None:
        if self.recording:
            self.calls.append("stop")
        self.recording = False

    def dump(self, path: Path) -> None:
        self.calls.append("dump")
        path.write_bytes(b"snapshot")


def test_cuda_history_records_only_while_suspicion_builds(tmp_path: Path) -> None:
    """auto: the ring runs through warm-up and while judgements near a leak, the snapshot is dumped on the flip,
    then the ring stops."""
    store, events, cuda = SeriesStore(), Events(), FakeCudaHistory()
    evidence = Evidence(tmp_path, cuda_history="auto", cuda=cuda)  # type: ignore[arg-type]
    t = T0 + np.arange(0.0, 900.0, 1.0)
    v = 1e9 + (t - T0) * MIB
    monitor = LeakMonitor(store, None, fast_leak_config(), lambda s: 1e12, events, evidence=evidence, since=T0)
    run_until(monitor, store, {"torch_cuda_allocated": (t, v)}, 900.0)
    assert cuda.calls == ["start", "dump", "stop"]
    ((kind, detail),) = events.items
    assert kind == "leak_suspected" and detail["allocation_history"] is True
    assert Path(detail["snapshot"]).parent == tmp_path and Path(detail["snapshot"]).exists()


def test_cuda_history_modes() -> None:
    always = FakeCudaHistory()
    Evidence(None, cuda_history="always", cuda=always)  # type: ignore[arg-type]
    assert always.recording
    off = FakeCudaHistory()
    ev = Evidence(None, cuda_history="off", cuda=off)  # type: ignore[arg-type]
    ev.building("torch_cuda_allocated", True)
    assert not off.recording and off.calls == []


def test_host_evidence_tells_allocator_retention_from_a_leak() -> None:
    rss = iter([500 * MIB, 420 * MIB, 500 * MIB, 499 * MIB])
    trims: list[int] = []

    def trim() -> int:
        trims.append(1)
        return 1

    ev = Evidence(None, malloc_trim=trim, rss=lambda: next(rss))
    held = ev.collect("host_rss", growth_bytes=100 * MIB)
    assert held == {"malloc_trim_released_bytes": 80 * MIB, "allocator_retention": True}
    leaked = ev.collect("host_rss", growth_bytes=100 * MIB)
    assert leaked["allocator_retention"] is False and len(trims) == 2


@pytest.fixture
def tracing() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def test_host_evidence_lists_growing_allocation_sites(tracing: None) -> None:
    """tracemalloc started after the monitor opened (as the telemetry source does) still counts."""
    ev = Evidence(None, malloc_trim=False)
    tracemalloc.stop()
    ev.open()
    tracemalloc.start()
    ev.tick()
    hoard = [bytearray(4096) for _ in range(500)]  # noqa: F841 - the growth to find
    sites = ev.collect("host_uss", growth_bytes=2e6)["top_growing_sites"]
    assert sites and "test_leak_monitor.py" in sites[0]["site"] and sites[0]["size_diff_bytes"] >= 2e6


def test_real_malloc_trim_probe_runs() -> None:
    """On glibc the probe calls malloc_trim(0) for real and reports what came back."""
    ev = Evidence(None)
    if ev.malloc_trim is None:
        pytest.skip("no glibc malloc_trim here")
    out = ev.collect("malloc_in_use", growth_bytes=1e12)
    assert out["malloc_trim_released_bytes"] >= 0 and out["allocator_retention"] is False


def test_creep_beyond_the_horizon_is_a_finding_not_a_page(traces: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """The same 1 MiB/s rise against 100x the headroom it would exhaust in an hour: 100 h to
    exhaustion is beyond a 1 h horizon, so nothing pages; the verdict says creep, the ETA
    stays finite (the info alert's input) and one leak_finding event records it."""
    store, metrics, events = SeriesStore(), Metrics(), Events()
    monitor = LeakMonitor(store, metrics, fast_leak_config(horizon=3600.0), lambda s: 360000 * MIB, events, since=T0)
    run_until(monitor, store, {"host_rss": traces["host_rss"]}, 900.0)
    v = monitor.verdicts()["host_rss"]
    assert (v.state, v.suspected, v.finding) == ("ok", False, "creep")
    assert "beyond the" in v.reason and v.as_dict()["finding"] == "creep"
    assert gauge(metrics, "leak_suspected", "host_rss") == 0
    assert gauge(metrics, "memory_exhaustion_eta_seconds", "host_rss") == pytest.approx(100 * 3600, rel=0.05)
    assert finding_gauges(metrics, "host_rss") == {"creep": 1.0, "allocator_retention": 0.0}
    assert [k for k, _ in events.items] == ["leak_finding"]
    # Within the horizon the same rise pages.
    store2, events2 = SeriesStore(), Events()
    paged = LeakMonitor(store2, None, fast_leak_config(horizon=200 * 3600.0), lambda s: 360000 * MIB, events2, since=T0)
    run_until(paged, store2, {"host_rss": traces["host_rss"]}, 900.0)
    assert paged.verdicts()["host_rss"].state == "leak" and [k for k, _ in events2.items] == ["leak_suspected"]


def test_growth_that_malloc_trim_gives_back_is_not_paged(traces: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Host growth the trim probe gives back is allocator retention: reported once (with the
    evidence), never paged, and the probe is not rerun every evaluation while the rise lasts."""
    rss = iter([1000 * MIB, 200 * MIB] * 10)
    trims: list[int] = []

    def trim() -> int:
        trims.append(1)
        return 1

    evidence = Evidence(None, malloc_trim=trim, rss=lambda: next(rss))
    store, metrics, events = SeriesStore(), Metrics(), Events()
    monitor = LeakMonitor(store, metrics, fast_leak_config(), lambda s: 3600 * MIB, events, evidence=evidence, since=T0)
    run_until(monitor, store, {"host_rss": traces["host_rss"]}, 900.0)
    v = monitor.verdicts()["host_rss"]
    assert (v.state, v.finding) == ("ok", "allocator_retention") and "malloc_trim gave back" in v.reason
    assert gauge(metrics, "leak_suspected", "host_rss") == 0
    assert finding_gauges(metrics, "host_rss") == {"creep": 0.0, "allocator_retention": 1.0}
    ((kind, detail),) = events.items
    assert kind == "leak_finding" and detail["allocator_retention"] is True and len(trims) == 1


def test_a_suspected_verdict_never_shows_a_falling_slope() -> None:
    """A leak that stops and gives its memory back: while suspected the slope shown rises and
    the reason says the verdict holds; once the troughs fall the verdict clears at once,
    without waiting out the persistence."""
    store, events = SeriesStore(), Events()
    t = T0 + np.arange(0.0, 1500.0, 1.0)
    up = np.minimum(t - T0, 600.0) * MIB
    v = 1e9 + np.where(t - T0 < 900.0, up, up - (t - T0 - 900.0) * 2 * MIB)
    monitor = LeakMonitor(
        store, None, fast_leak_config(window=300.0, persistence=3600.0), lambda s: None, events, since=T0
    )
    seen: list[tuple[str, float]] = []
    for now in np.arange(T0 + 10.0, T0 + 1500.0 + 1e-9, 10.0):
        hi = int(np.searchsorted(t, now, side="right"))
        lo = int(np.searchsorted(t, now - 10.0, side="right"))
        feed(store, "host_rss", t[lo:hi], v[lo:hi])
        verdict = monitor.evaluate(now).get("host_rss")
        if verdict is not None and verdict.state == "leak":
            seen.append((verdict.reason, verdict.slope_bytes_per_hour))
    assert seen and all(slope > 0 for _, slope in seen), [s for s in seen if s[1] <= 0]
    assert [k for k, _ in events.items] == ["leak_suspected", "leak_cleared"]
    assert not monitor.verdicts()["host_rss"].suspected


@pytest.mark.parametrize("pattern", ["creep", "sawtooth"])
def test_the_live_verdict_and_soakd_analyze_agree(pattern: str, tmp_path: Path) -> None:
    """The same recorded 3 h series, judged live (a look a minute, headroom unknown) and by
    `soakd analyze` (a replay every 5 min): one state, one slope sign, and the live flag no
    later than the replay's (its looks are a superset)."""
    from soakd.analysis.corpus import generate
    from soakd.analysis.offline import TraceData, judge_trace
    from soakd.analysis.params import DetectorParams

    tr = generate(pattern, 1, duration=3 * 3600.0)
    t, v = T0 + tr.t, tr.v
    cfg = LeakConfig()
    store = SeriesStore(capacity=t.size + 10)
    monitor = LeakMonitor(store, None, cfg, lambda s: None, since=T0)
    first_live = None
    fed = 0
    for now in np.arange(T0 + 60.0, T0 + 3 * 3600.0 + 1e-9, 60.0):
        hi = int(np.searchsorted(t, now, side="right"))
        feed(store, "host_rss", t[fed:hi], v[fed:hi])
        fed = hi
        got = monitor.evaluate(float(now))["host_rss"]
        if got.suspected and first_live is None:
            first_live = now - T0
    live = monitor.verdicts()["host_rss"]
    offline = judge_trace(TraceData(tmp_path / "host_rss.csv", t, v), DetectorParams.from_config(cfg), {}, 300.0)
    assert live.state == offline["state"], (live.reason, offline["reason"])
    if live.state == "leak":
        assert live.slope_bytes_per_hour > 0 and offline["slope_bytes_per_hour"] > 0
        assert first_live is not None and first_live <= offline["first_suspected_seconds"] + 1e-6
    assert (pattern == "creep") == (live.state == "leak")


def test_a_closing_look_judges_the_samples_after_the_last_scheduled_one(tmp_path: Path) -> None:
    """A warm-up that levels off slowly (200 MiB, 15 min time constant): a look a minute says
    "ok" at 54 min, and the samples of the next minute move the data-found end of warm-up later.
    The run's closing look (the summary's verdict, soakd/run/session.py) then reads what
    `soakd analyze` of the same recorded series reads, not the stale "ok"."""
    from soakd.analysis.offline import TraceData, judge_trace
    from soakd.analysis.params import DetectorParams

    rng = np.random.default_rng(1)
    t = np.arange(0.0, 3300.0 + 1e-9, 10.0)
    v = 60e6 + 200 * MIB * (1 - np.exp(-t / 900.0)) + rng.normal(0, 0.3 * MIB, t.size)
    t = T0 + t
    cfg = LeakConfig()
    store = SeriesStore(capacity=t.size + 10)
    monitor = LeakMonitor(store, None, cfg, lambda s: None, since=T0)
    fed = 0
    for now in np.arange(T0 + 60.0, T0 + 3240.0 + 1e-9, 60.0):
        hi = int(np.searchsorted(t, now, side="right"))
        feed(store, "host_rss", t[fed:hi], v[fed:hi])
        fed = hi
        monitor.evaluate(float(now))
    assert monitor.verdicts()["host_rss"].state == "ok"
    feed(store, "host_rss", t[fed:], v[fed:])
    closing = monitor.evaluate(float(t[-1]))["host_rss"]
    offline = judge_trace(TraceData(tmp_path / "host_rss.csv", t, v), DetectorParams.from_config(cfg), {}, 300.0)
    assert closing.state == offline["state"] == "not_judged"
    assert closing.reason == "warming up (growth is levelling off)" and closing.reason in offline["reason"]


def test_the_live_looks_and_a_replay_agree_long_after_warm_up(tmp_path: Path) -> None:
    """Past the warm-up search (2 h after the floor), the live monitor's looks (a new grid each
    time, every sample up to then) and a replay's (one grid) find the same end of warm-up: at
    7 h a settling warm-up under noise is judged over the same span by both."""
    from soakd.analysis.detector import Grid, judge
    from soakd.analysis.params import DetectorParams

    rng = np.random.default_rng(3)
    t = np.arange(0.0, 7 * 3600.0 + 1e-9, 10.0)
    v = 60e6 + 200 * MIB * (1 - np.exp(-t / 1500.0)) + rng.normal(0, 2 * MIB, t.size)
    params = DetectorParams()
    grid = Grid(t, v, params, 0.0, float(t[-1]))
    for end in (3 * 3600.0, 5 * 3600.0, 7 * 3600.0):
        keep = t <= end
        live = judge(t[keep], v[keep], params, 2 * MIB, now=end, since=0.0)
        replayed = grid.look(round(end / params.bin), 2 * MIB)
        assert (live.start, live.judged_seconds, live.reason) == (
            replayed.start,
            replayed.judged_seconds,
            replayed.reason,
        )
