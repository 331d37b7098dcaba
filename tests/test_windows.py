"""The per-window table in the summary and report: bounded, counts conserved across merges,
percentiles close to the data's, and no memory growth however long the soak runs."""

from __future__ import annotations

import json
import subprocess
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from soakd.report import window_rows
from soakd.report.window_rows import rows_from_windows
from soakd.run.windows import WindowRecorder, window_length
from soakd.telemetry.histogram import HistSnapshot, LogHistogram
from tests.conftest import free_port, soakd_cmd


@dataclass
class Stats:
    elapsed: float
    completed: dict[str, int] = field(default_factory=dict)
    stages: dict[str, HistSnapshot] = field(default_factory=dict)


class FakeEngine:
    """Cumulative stats as the engine keeps them: 100 ok and 1 error per 5 s tick, e2e
    latencies around ``level`` ms, no queue figures until ``queue_from``."""

    def __init__(self, seed: int = 0, queue_from: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.e2e, self.queue = LogHistogram(), LogHistogram()
        self.tick, self.ok, self.err, self.queue_from = 0, 0, 0, queue_from
        self.level = 10.0

    def step(self) -> Stats:
        self.tick += 1
        values = self.rng.uniform(0.9, 1.1, 100) * self.level / 1e3
        self.e2e.observe_many(values)
        if self.tick >= self.queue_from:
            self.queue.observe_many(values / 10)
        self.ok, self.err = self.ok + 100, self.err + 1
        return Stats(
            self.tick * 5.0,
            {"ok": self.ok, "error": self.err},
            {"e2e": self.e2e.snapshot(), "queue": self.queue.snapshot()},
        )


def test_rows_report_each_window_and_stay_bounded_with_counts_conserved() -> None:
    eng = FakeEngine(queue_from=3)
    rec = WindowRecorder(max_rows=16)
    rec.start(Stats(0.0, {}, {"e2e": eng.e2e.snapshot(), "queue": eng.queue.snapshot()}))
    for _ in range(5):
        rec.add(eng.step())
    rows = msgspec.to_builtins(rec.rows)  # as the summary's JSON holds them
    assert [r["t"] for r in rows] == [5.0, 10.0, 15.0, 20.0, 25.0]
    assert all(r["ok"] == 100 and r["errors"] == 1 and r["throughput_rps"] == 20.0 for r in rows)
    assert 9.0 <= rows[0]["latency_ms"]["e2e"]["p50"] <= 11.0
    assert "queue" not in rows[0]["latency_ms"]  # no queue figures in that window: no entry
    assert rows[2]["latency_ms"]["queue"]["p99"] < 1.2

    for _ in range(200):
        rec.add(eng.step())
    rows = msgspec.to_builtins(rec.rows)  # as the summary's JSON holds them
    assert len(rows) <= 16 and rec.stride > 1
    # Every tick up to the last row's end is in exactly one row; merged rows span several ticks.
    covered = sum(r["ok"] for r in rows)
    assert covered == 100 * round(rows[-1]["t"] / 5.0)
    assert 205 * 5.0 - rows[-1]["t"] < rec.stride * 5.0  # only the ticks of an unfinished row are pending
    assert sum(r["errors"] for r in rows) == covered // 100
    assert abs(sum(r["seconds"] for r in rows) - rows[-1]["t"]) < 1e-6
    assert all(9.0 <= r["latency_ms"]["e2e"]["p50"] <= 11.0 for r in rows)


def test_merged_rows_follow_a_latency_change() -> None:
    eng = FakeEngine()
    rec = WindowRecorder(max_rows=8)
    rec.start(Stats(0.0, {}, {"e2e": eng.e2e.snapshot(), "queue": eng.queue.snapshot()}))
    for i in range(64):
        eng.level = 10.0 if i < 32 else 40.0
        rec.add(eng.step())
    p50 = [r["latency_ms"]["e2e"]["p50"] for r in msgspec.to_builtins(rec.rows)]
    assert p50[0] < 12 and p50[-1] > 36  # the step survives the merges


def test_the_recorder_does_not_grow_over_a_long_soak() -> None:
    """Hours of 5 s ticks must not grow the daemon: the table is allocated once. Only memory
    allocated in the recorder's module counts, so other threads of the test process do not."""
    eng = FakeEngine()
    rec = WindowRecorder()
    rec.start(Stats(0.0, {}, {"e2e": eng.e2e.snapshot(), "queue": eng.queue.snapshot()}))
    only_windows = [tracemalloc.Filter(True, window_rows.__file__)]

    def held() -> int:
        return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(only_windows).traces)

    tracemalloc.start()  # before the first tick: what the table keeps is then all traced
    try:
        for _ in range(60):
            rec.add(eng.step())
        before = held()
        for _ in range(4000):  # 5.5 h of ticks, five merges
            rec.add(eng.step())
        grown = held() - before
    finally:
        tracemalloc.stop()
    assert grown < 4096, f"the recorder grew {grown} bytes over 4000 ticks"
    assert len(rec.rows) <= 720


def test_rows_from_stored_windows_group_runs_of_windows_exactly() -> None:
    rng = np.random.default_rng(1)
    windows = []
    for i in range(100):
        h = LogHistogram()
        h.observe_many(rng.uniform(0.009, 0.011, 50) if i < 50 else rng.uniform(0.036, 0.044, 50))
        windows.append((1000.0 + 60 * i, 1060.0 + 60 * i, {"ok": 50, "timeout": 1}, {"e2e": h.snapshot()}))
    rows = msgspec.to_builtins(rows_from_windows(windows, max_rows=30))
    assert len(rows) == 25  # groups of 4 stored windows
    assert sum(r["ok"] for r in rows) == 5000 and sum(r["errors"] for r in rows) == 100
    assert rows[0]["seconds"] == 240.0 and rows[-1]["t"] == 6000.0
    assert rows[0]["latency_ms"]["e2e"]["p50"] < 11.5 and rows[-1]["latency_ms"]["e2e"]["p50"] > 35
    assert rows_from_windows([]) == []


def test_stored_windows_follow_the_run_length() -> None:
    """A short soak gets a few dozen stored windows; a long or open-ended one the configured length."""
    assert window_length(60.0, 90.0, 2.0) * 40 <= 90.0  # the 90 s demo: dozens of points
    assert window_length(60.0, 24 * 3600.0, 2.0) == 60.0
    assert window_length(60.0, None, 2.0) == 60.0
    assert window_length(60.0, 10.0, 2.0) == 2.0  # never shorter than the flush that closes them


def test_a_short_soak_report_has_points_to_plot(tmp_path: Path) -> None:
    """A 12 s soak's report (built by `soakd report` from the state) has at least five windows."""
    state = tmp_path / "state"
    (tmp_path / "empty.toml").write_text("")
    run = subprocess.run(
        soakd_cmd(
            "run",
            "--model",
            "builtin:noop",
            "--rate",  # open loop: a closed loop on a model that does nothing spins a core for the 12 s
            "50",
            "--duration",
            "12s",
            "--metrics-addr",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            str(state),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rep = subprocess.run(
        soakd_cmd("report", "--state-dir", str(state), "--format", "json", "--config", str(tmp_path / "empty.toml")),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    assert len(json.loads(rep.stdout)["windows"]) >= 5
