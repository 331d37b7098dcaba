"""The state store: durable, WAL, bounded by downsampling, and never a crash loop on a bad file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from soakd.errors import StateError
from soakd.record.write import to_json_object
from soakd.report.data import load_run_report, load_series, load_timeline
from soakd.state import CURRENT_RUN, DB_NAME, StateStore, WindowRow, resolve_run_id
from soakd.telemetry.histogram import LogHistogram

DAY = 86400.0


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _window(t0: float, t1: float, ok: int, latencies_s: list[float]) -> WindowRow:
    h = LogHistogram()
    h.observe_many(latencies_s)
    return WindowRow(t0, t1, {"ok": ok, "error": 0}, {"e2e": h.snapshot()})


def test_store_uses_wal_and_commits_what_was_queued(tmp_path: Path) -> None:
    """After a flush, another connection sees the samples, events, windows and the segment, in WAL mode."""
    store = StateStore(tmp_path)
    seg = store.begin_segment("r1", {"model": "builtin:noop"})
    store.add_sample("r1", "host_rss", 1.0, 100.0)
    store.add_event("r1", seg, "phase", "warmup -> steady")
    store.write_window(seg, "r1", _window(0.0, 60.0, 3, [0.001, 0.002, 0.003]))
    store.flush()
    other = sqlite3.connect(tmp_path / DB_NAME)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 1
    assert other.execute("SELECT kind FROM events WHERE kind = 'phase'").fetchone() == ("phase",)
    assert other.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == 1
    assert (tmp_path / CURRENT_RUN).read_text().strip() == "r1"
    store.end_segment(seg, "completed", finished=True)
    store.close()
    assert not (tmp_path / CURRENT_RUN).exists()  # a finished run is not resumed
    report = to_json_object(load_run_report(tmp_path, "r1"))
    assert report["requests"]["ok"] == 3 and report["latency_ms"]["e2e"]["count"] == 3
    assert report["finished"] and report["run"] == {"model": "builtin:noop"}


def test_writer_thread_upserts_the_open_window(tmp_path: Path) -> None:
    """The writer commits the window source's latest row at every flush, replacing the earlier one."""
    store = StateStore(tmp_path, flush_interval=0.05)
    seg = store.begin_segment("r1", None)
    rows = iter([_window(0.0, 1.0, 1, [0.001]), _window(0.0, 2.0, 5, [0.001] * 5)])
    latest = {"row": next(rows)}
    store.window_source = lambda: (seg, "r1", latest["row"])
    store.flush()
    latest["row"] = next(rows)
    store.close()  # the writer was never started: close flushes once more
    assert to_json_object(load_run_report(tmp_path, "r1"))["requests"]["ok"] == 5
    assert len(load_timeline(tmp_path, "r1")) == 1


def test_corrupt_state_file_is_moved_aside_for_a_fresh_one(tmp_path: Path) -> None:
    """Garbage in the database file: the store says so, keeps the bad file aside, and starts fresh."""
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    store = StateStore(tmp_path)
    assert len(store.notices) == 1 and "corrupt" in store.notices[0]
    aside = list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    store.begin_segment("r1", None)
    store.close()
    assert to_json_object(load_run_report(tmp_path))["run_id"] == "r1"


def test_locked_state_file_is_moved_aside_after_the_lock_timeout(tmp_path: Path) -> None:
    """A database another process keeps locked: a clear notice and a fresh file, not a hang or a crash."""
    StateStore(tmp_path).close()
    holder = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        store = StateStore(tmp_path, lock_timeout=0.2)
        assert "locked" in store.notices[0] and "moved it to" in store.notices[0]
        assert list(tmp_path.glob(f"{DB_NAME}.locked-*"))
        store.begin_segment("r1", None)
        store.close()
    finally:
        holder.close()


def test_unusable_state_dir_is_a_config_error(tmp_path: Path) -> None:
    """A state dir that is a file is exit-2 material (StateError is a ConfigError), named in the message."""
    bad = tmp_path / "file"
    bad.write_text("x")
    with pytest.raises(StateError, match="state dir"):
        StateStore(bad)


def test_run_id_resolution(tmp_path: Path) -> None:
    """--run-id wins; when resuming, the unfinished run in current-run; otherwise a new id."""
    (tmp_path / CURRENT_RUN).write_text("old\n")
    assert resolve_run_id(tmp_path, "given", True, lambda: "new") == "given"
    assert resolve_run_id(tmp_path, None, True, lambda: "new") == "old"
    assert resolve_run_id(tmp_path, None, False, lambda: "new") == "new"
    (tmp_path / CURRENT_RUN).unlink()
    assert resolve_run_id(tmp_path, None, True, lambda: "new") == "new"


def test_downsampling_and_retention_keep_totals_and_bound_rows(tmp_path: Path) -> None:
    """Three days of samples and windows: old rows merge into coarse ones, counts and extremes are kept."""
    clock = Clock()
    store = StateStore(tmp_path, clock=clock, retention=30 * DAY)
    start = clock.t
    seg = store.begin_segment("r1", None)
    rng = np.random.default_rng(0)
    n_samples, n_windows = int(3 * DAY / 10), int(3 * DAY / 60)
    store._conn.executemany(  # bulk synthetic history straight into the table, as the writer would
        "INSERT INTO samples VALUES ('r1', 'host_rss', ?, ?, ?, ?, 1, 0)",
        [(start + 10 * i, float(i), float(i), float(i)) for i in range(n_samples)],
    )
    for i in range(n_windows):
        store.write_window(
            seg, "r1", _window(start + 60 * i, start + 60 * (i + 1), 10, list(rng.uniform(0.001, 0.002, 10)))
        )
    store.flush()
    before = to_json_object(load_run_report(tmp_path, "r1"))
    clock.t = start + 3 * DAY
    store.maintain()
    store.close()
    after = to_json_object(load_run_report(tmp_path, "r1"))
    assert after["requests"]["ok"] == before["requests"]["ok"] == 10 * n_windows
    assert after["latency_ms"]["e2e"]["p99"] == before["latency_ms"]["e2e"]["p99"]
    assert after["memory"]["host_rss"]["samples"] == n_samples
    assert after["memory"]["host_rss"]["max"] == n_samples - 1
    series = load_series(tmp_path, "r1", "host_rss")
    assert len(series) < n_samples / 5
    timeline = load_timeline(tmp_path, "r1")
    assert len(timeline) < n_windows / 2
    old = [w for w in timeline if w["t_end"] <= clock.t - DAY]
    assert old and all(w["resolution_seconds"] == 900 for w in old)


def test_retention_drops_data_past_the_horizon(tmp_path: Path) -> None:
    """Rows older than the retention period are deleted."""
    clock = Clock()
    store = StateStore(tmp_path, clock=clock, retention=DAY)
    store.begin_segment("r1", None)
    store.add_sample("r1", "host_rss", clock.t, 1.0)
    store.add_sample("r1", "host_rss", clock.t + 2 * DAY, 2.0)
    store.flush()
    clock.t += 2 * DAY
    store.maintain()
    store.close()
    assert [v for _, v, _, _ in load_series(tmp_path, "r1", "host_rss")] == [2.0]
