"""A known load cycle (#39): with the period of a repeating load schedule, memory is judged at
the same point of each cycle, so the cycle's own rise is never a leak, and a leak under it still
is; the period comes from an evenly spaced probe schedule, ``[leak] cycle`` or ``--cycle``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bench.leak import week_traces as week
from soakd.analysis.cycles import find_period
from soakd.analysis.detector import Grid
from soakd.analysis.monitor import LeakMonitor, monitor_for_run
from soakd.analysis.params import MIB, DetectorParams, floor_for
from soakd.analysis.replay import replay
from soakd.analysis.trend import bin_minima, trailing_min
from soakd.cli import main
from soakd.config import LeakConfig, load_config
from soakd.load.phases import cron_period, schedule_cycle
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.series import SeriesStore

pytestmark = pytest.mark.unit

FLOOR = floor_for("host_rss", {})
H = 3600.0
# Week "cycle" traces (4-8 h load schedules, 20-80 MiB swings) that the detector flags when it
# does not know the period (each at some look of its first 12 h). Seed 8 left the list in #39's
# fourth round: its flag was a 30 min span's rise within the cycle's own range. Seeds 1 and 3 left
# it in the sixth, when the trough envelope stopped starting high; 7 and 9 came in (seeds 0-11 looked at).
FLAGGED_BLIND = (4, 7, 9)


def _cycle(seed: int, hours: float = 12.0, leak_mib_per_h: float = 0.0) -> tuple[np.ndarray, np.ndarray, float]:
    tr = week.generate("cycle", seed, duration=hours * H)
    assert tr.cycle_seconds is not None
    return tr.t, tr.v + leak_mib_per_h * MIB * tr.t / H, tr.cycle_seconds


@pytest.mark.parametrize(
    ("expr", "period"),
    [
        ("0 * * * *", H),
        ("0 */6 * * *", 6 * H),
        ("*/15 * * * *", 900.0),
        ("0 0 * * *", 24 * H),
        ("0 9,17 * * *", None),  # 8 h then 16 h: not one period
        ("0 */5 * * *", None),  # 5 h gaps, then 4 h over midnight
        ("", None),
    ],
)
def test_cron_period(expr: str, period: float | None) -> None:
    assert cron_period(expr) == period


@pytest.mark.parametrize(
    ("schedule", "duration", "cycle"),
    [
        ("0 * * * *", "24h", 3600.0),  # hourly probes over a day: judged cycle by cycle
        ("0 * * * *", None, 3600.0),  # until stopped
        ("0 * * * *", "2h", None),  # two cycles in the run: judged as usual
        ("0 0 * * *", "72h", None),  # nightly: a day with no verdict is too long to wait
        ("0 */6 * * *", "24h", 21600.0),
        ("0 9,17 * * *", "24h", None),
    ],
)
def test_a_schedule_gives_the_run_a_cycle_it_can_see_several_times(
    tmp_path: Path, schedule: str, duration: str | None, cycle: float | None
) -> None:
    conf = tmp_path / "soak.toml"
    conf.write_text(
        f'[phases]\nprobe_schedule = "{schedule}"\n' + (f'[load]\nduration = "{duration}"\n' if duration else "")
    )
    assert schedule_cycle(load_config(str(conf))) == cycle


def test_week_trace_period_is_the_generators() -> None:
    """The period the bench passes is the trace's: memory one period apart differs by noise only."""
    t, v, period = _cycle(0, hours=24.0)
    k = round(period / float(t[1] - t[0]))
    assert np.std(v[k:] - v[:-k]) < 4 * MIB < np.std(v)


@pytest.mark.parametrize("seed", FLAGGED_BLIND)
def test_leak_free_cycle_is_never_suspected_with_its_period(seed: int) -> None:
    t, v, period = _cycle(seed)
    blind = replay(t, v, DetectorParams(), FLOOR, step=300.0)
    assert any(up for _, up in blind.flips), "flagged without the period: the false alarm this fixes"
    known = replay(t, v, DetectorParams(cycle_seconds=period), FLOOR, step=300.0)
    assert known.flips == [] and not known.suspected, known.final.reason


@pytest.mark.parametrize(("seed", "rate"), [(0, 10.0), (2, 15.0), (5, 20.0)])
def test_leak_under_a_known_cycle_is_flagged(seed: int, rate: float) -> None:
    t, v, period = _cycle(seed, hours=16.0, leak_mib_per_h=rate)
    r = replay(t, v, DetectorParams(cycle_seconds=period), FLOOR, step=300.0)
    assert r.suspected and r.first_suspected_at is not None
    assert r.first_suspected_at <= 2 * period + 2 * H
    assert 0.5 * rate < r.final.slope_bytes_per_hour / MIB < 2 * rate


def test_strong_leak_is_caught_within_a_cycle_and_a_bit() -> None:
    """100 MiB/h under a 4-8 h cycle: flagged once one cycle has been seen (the same point of the
    cycle before is far below), not two."""
    for seed in range(3):
        t, v, period = _cycle(seed, leak_mib_per_h=100.0)
        r = replay(t, v, DetectorParams(cycle_seconds=period), FLOOR, step=300.0)
        assert r.first_suspected_at is not None and r.first_suspected_at <= period + 1.25 * H, (seed, period)


def test_first_cycle_is_not_judged_and_says_why() -> None:
    t, v, _ = _cycle(1)
    grid = Grid(t, v, DetectorParams(cycle_seconds=6 * H), 0.0, float(t[-1]))
    j = grid.look(round(3 * H / 60), FLOOR)
    assert not j.judged and not j.positive
    assert j.reason.startswith("not judged yet: a load cycle of 6 h needs 12 h")


def test_cycle_from_config() -> None:
    leak = load_config(None, {"leak.cycle": "6h"}).leak
    assert DetectorParams.from_config(leak).cycle_seconds == 6 * H
    assert DetectorParams.from_config(load_config(None, {}).leak).cycle_seconds is None


def test_analyze_cycle_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``soakd analyze --cycle``: the same trace, a rise that cleared, then none at all."""
    t, v, period = _cycle(FLAGGED_BLIND[0])
    path = tmp_path / "host_rss.csv"
    path.write_text("timestamp_seconds,bytes\n" + "".join(f"{a:.1f},{b:.0f}\n" for a, b in zip(t, v, strict=True)))
    assert main(["analyze", "--json", str(path)]) == 0
    blind = json.loads(capsys.readouterr().out)
    assert blind["first_suspected_seconds"] is not None
    assert main(["analyze", "--json", "--cycle", f"{period:.0f}s", str(path)]) == 0
    known = json.loads(capsys.readouterr().out)
    assert known["first_suspected_seconds"] is None and known["state"] == "ok"


@pytest.mark.parametrize(
    ("leak_cycle", "schedule", "judged_by"), [(None, 3600.0, 3600.0), ("2h", 3600.0, 7200.0), (None, None, None)]
)
def test_the_run_monitor_judges_by_the_schedule_unless_leak_cycle_is_set(
    tmp_path: Path, leak_cycle: str | None, schedule: float | None, judged_by: float | None
) -> None:
    """`soakd run`'s monitor takes the schedule's period (schedule_cycle), and `[leak] cycle` wins."""
    conf = tmp_path / "soak.toml"
    conf.write_text(
        f'[state]\ndir = "{tmp_path / "state"}"\n' + (f'[leak]\ncycle = "{leak_cycle}"\n' if leak_cycle else "")
    )
    monitor = monitor_for_run(load_config(str(conf)), Metrics(), SeriesStore(), None, cycle=schedule)
    assert monitor.params.cycle_seconds == judged_by


def _troughs(shape: str, seed: int, hours: float = 24.0) -> tuple[np.ndarray, float | None]:
    """A week trace's 5-min troughs of 1-min bin minima from 15 min on, and its load period."""
    tr = week.generate(shape, seed, duration=hours * H)
    b = bin_minima(tr.t, tr.v, 0.0, 60.0, int(hours * 60))
    return trailing_min(b[15:], 5), tr.cycle_seconds


@pytest.mark.parametrize(("shape", "seed"), [("cycle", 0), ("cycle", 8), ("leak_cycle", 2), ("leak_cycle", 9)])
def test_a_repeating_load_shows_its_period(shape: str, seed: int) -> None:
    y, period = _troughs(shape, seed)
    assert period is not None
    found = find_period(y, 60, 720)
    assert found is not None and found * 60.0 == pytest.approx(period, rel=0.03)


@pytest.mark.parametrize("shape", ["wander", "ar1", "jitter", "sawtooth", "arena", "warmup"])
def test_memory_that_does_not_repeat_shows_no_period(shape: str) -> None:
    for seed in range(3):
        y, _ = _troughs(shape, seed)
        assert find_period(y, 60, 720) is None, (shape, seed)


def test_three_cycles_are_needed_to_read_a_period() -> None:
    y, period = _troughs("cycle", 6)  # 4.3 h
    assert period is not None
    assert find_period(y[: round(2.5 * period / 60)], 60, 720) is None
    assert find_period(y[: round(3.2 * period / 60)], 60, 720) is not None


@pytest.mark.parametrize(("seed", "rate"), [(2, 5.8), (9, 7.9)])
def test_a_faint_leak_under_a_cycle_nobody_named_is_found(seed: int, rate: float) -> None:
    """5.8 and 7.9 MiB/h under a 6-7.4 h load cycle, no period given: under a swing of 20-80 MiB
    the rise is not told from it until the cycle is read from the data (three cycles), and is
    found then, judged cycle by cycle."""
    tr = week.generate("leak_cycle", seed, duration=24 * H)
    assert tr.leak_rate / MIB == pytest.approx(rate, abs=0.05)
    r = replay(tr.t, tr.v, DetectorParams(), FLOOR, step=300.0)
    assert r.suspected, r.final.reason
    assert "judged cycle by cycle: the load repeats every" in r.final.reason
    assert 0.5 * rate < r.final.slope_bytes_per_hour / MIB < 2 * rate


@pytest.mark.parametrize("seed", FLAGGED_BLIND)
def test_a_leak_free_cycle_read_from_the_data_stays_clear(seed: int) -> None:
    """Once its period is read, a leak-free cycle is judged cycle by cycle and never flagged,
    whatever its first rise did before that."""
    t, v, period = _cycle(seed, hours=24.0)
    r = replay(t, v, DetectorParams(), FLOOR, step=600.0)
    late = [at for at, up in r.flips if up and at >= 3 * period + 900.0]
    assert late == [] and not r.suspected, r.final.reason
    assert "judged cycle by cycle" in r.final.reason


def test_the_live_monitor_reads_the_cycle_as_a_replay_does() -> None:
    """A day of 7.9 MiB/h under a 6.7 h load cycle nobody named, fed to the live monitor a look
    every 30 min: at the end it suspects the leak, judged cycle by cycle, as `soakd analyze`'s
    replay does; too slow to exhaust 8 GiB within the 30-day horizon, it is a finding, not a page."""
    tr = week.generate("leak_cycle", 9, duration=24 * H)
    store, t0 = SeriesStore(), 1_700_000_000.0
    monitor = LeakMonitor(store, Metrics(), LeakConfig(), lambda s: 8 * 1024 * MIB, lambda k, d: None, since=t0)
    fed = 0
    for now in np.arange(1800.0, 24 * H + 1.0, 1800.0):
        hi = int(np.searchsorted(tr.t, now, side="right"))
        for a, b in zip(tr.t[fed:hi], tr.v[fed:hi], strict=True):
            store.append("host_rss", t0 + float(a), float(b))
        fed = hi
        monitor.evaluate(t0 + now)
    live = monitor.verdicts()["host_rss"]
    assert live.finding == "creep" and not live.suspected, live.reason  # a finding: suspected, never paged
    read = re.search(r"judged cycle by cycle: the load repeats every ([\d.]+) h", live.reason)
    assert read is not None and tr.cycle_seconds is not None
    assert float(read.group(1)) * H == pytest.approx(tr.cycle_seconds, rel=0.03)
    r = replay(tr.t, tr.v, DetectorParams(), FLOOR, step=1800.0, page_above=8 * 1024 * MIB / 30 / 24)
    assert r.suspected and not r.paged
    # the replay ends at the last sample, 10 s before the live look: one bin less
    assert r.final.slope_bytes_per_hour == pytest.approx(live.slope_bytes_per_hour, rel=0.01)
