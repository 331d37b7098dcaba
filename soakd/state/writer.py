"""The writer of the state database: :class:`StateStore`.

Writes go through a queue to one writer thread that commits every ``flush_interval``; the
open window is upserted at each commit, so a ``kill -9`` loses at most one interval. Old rows
are merged into coarser ones and, past ``retention``, deleted, so a week-long soak stays in
the tens of megabytes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from soakd.state.db import LOCK_TIMEOUT, open_db
from soakd.state.schema import CURRENT_RUN, DB_NAME, WindowRow, decode_hists, encode_hists

log = logging.getLogger("soakd.store")

# Downsampling tiers: (older than seconds, merged bucket seconds). Raw samples come every
# ~10 s and windows every minute; a week at these tiers is a few thousand rows per series.
SAMPLE_TIERS = ((6 * 3600.0, 60.0), (2 * 86400.0, 600.0))
WINDOW_TIERS = ((86400.0, 900.0),)
MAX_EVENTS_PER_RUN = 20_000  # a flapping verdict must not grow the file without bound
QUEUE_MAX = 50_000  # samples/events waiting for the writer; beyond this they are dropped


class StateStore:
    """One state database. Writes from any thread go through :meth:`enqueue`-style calls to the
    writer thread; reads (reports) use their own connection."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        flush_interval: float = 2.0,
        retention: float = 30 * 86400.0,
        lock_timeout: float = LOCK_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / DB_NAME
        self.flush_interval = flush_interval
        self.retention = retention
        self.clock = clock
        self._conn, self.notices = open_db(self.dir, lock_timeout)
        self._lock = threading.Lock()  # one statement stream on the shared connection
        self._flush_lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]]] = queue.Queue(QUEUE_MAX)
        self.dropped = 0
        self.write_errors = 0
        self.window_source: Callable[[], tuple[int, str, WindowRow] | None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_maintain = 0.0
        self.segment_id: int | None = None  # this process's segment: its heartbeat is ``last_seen``

    # ------------------------------------------------------------------ lifecycle

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def start_writer(self) -> None:
        self._thread = threading.Thread(target=self._writer_loop, name="soakd-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the writer after a last flush, then close the database."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        else:
            self.flush()
        with self._lock:
            self._conn.close()

    # ------------------------------------------------------------------ runs and segments

    def begin_segment(self, run_id: str, fingerprint: dict[str, Any] | None, pid: int | None = None) -> int:
        """Record a process lifetime of ``run_id`` (creating the run); returns the segment id."""
        now = self.clock()
        fp = json.dumps(fingerprint, default=str) if fingerprint is not None else None
        with self._tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO runs (run_id, created_at, fingerprint) VALUES (?, ?, ?)", (run_id, now, fp)
            )
            if fp is not None:
                c.execute("UPDATE runs SET fingerprint = ? WHERE run_id = ?", (fp, run_id))
            c.execute("UPDATE runs SET finished_at = NULL WHERE run_id = ?", (run_id,))
            cur = c.execute(
                "INSERT INTO segments (run_id, pid, started_at, last_seen, fingerprint) VALUES (?, ?, ?, ?, ?)",
                (run_id, os.getpid() if pid is None else pid, now, now, fp),
            )
            seg = int(cur.lastrowid or 0)
            self.segment_id = seg
            prior = c.execute("SELECT COUNT(*) FROM segments WHERE run_id = ? AND id < ?", (run_id, seg)).fetchone()[0]
            kind, detail = (
                ("restart", f"segment {seg}: resumed after {prior} earlier segment(s)")
                if prior
                else ("start", f"segment {seg}")
            )
            c.execute(
                "INSERT INTO events (run_id, segment_id, t, kind, detail) VALUES (?, ?, ?, ?, ?)",
                (run_id, seg, now, kind, detail),
            )
        try:
            (self.dir / CURRENT_RUN).write_text(run_id + "\n")
        except OSError as exc:
            log.warning("cannot write %s: %s", self.dir / CURRENT_RUN, exc.strerror)
        return seg

    def end_segment(self, segment_id: int, reason: str, *, finished: bool = False) -> None:
        """Mark the segment ended (``reason``: completed, signal name, error); ``finished``: the
        run reached its end, so a restart begins a new run."""
        now = self.clock()
        with self._tx() as c:
            c.execute(
                "UPDATE segments SET ended_at = ?, last_seen = ?, end_reason = ? WHERE id = ?",
                (now, now, reason, segment_id),
            )
            if finished:
                c.execute(
                    "UPDATE runs SET finished_at = ? WHERE run_id = (SELECT run_id FROM segments WHERE id = ?)",
                    (now, segment_id),
                )
        if finished:
            (self.dir / CURRENT_RUN).unlink(missing_ok=True)

    def previous_active_seconds(self, run_id: str, before_segment: int) -> float:
        """Time the run already spent in earlier segments (to honour a duration across restarts)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT COALESCE(SUM(last_seen - started_at), 0) FROM segments WHERE run_id = ? AND id < ?",
                (run_id, before_segment),
            ).fetchone()
        return float(row[0])

    # ------------------------------------------------------------------ writes (any thread)

    def _put(self, kind: str, args: tuple[Any, ...]) -> None:
        try:
            self._queue.put_nowait((kind, args))
        except queue.Full:
            self.dropped += 1  # the writer is stuck; losing samples beats growing memory

    def add_sample(self, run_id: str, series: str, t: float, value: float) -> None:
        self._put("sample", (run_id, series, t, value, value, value, 1, 0.0))

    def add_event(self, run_id: str, segment_id: int | None, kind: str, detail: str, t: float | None = None) -> None:
        self._put("event", (run_id, segment_id, self.clock() if t is None else t, kind, detail))

    def write_window(self, segment_id: int, run_id: str, row: WindowRow, resolution: float = 0.0) -> None:
        self._put(
            "window",
            (segment_id, run_id, row.t_start, row.t_end, resolution, json.dumps(row.outcomes), encode_hists(row.hists)),
        )

    # ------------------------------------------------------------------ writer

    def _writer_loop(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self._flush_logged()
            if self.clock() - self._last_maintain > 600:
                self._maintain_logged()
        self._flush_logged()

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # a full disk (or a bad row) must not stop the soak or the writer
            self.write_errors += 1
            if self.write_errors in (1, 10, 100) or self.write_errors % 1000 == 0:
                log.error("state store write failed (%d so far): %s", self.write_errors, exc)

    def _maintain_logged(self) -> None:
        self._last_maintain = self.clock()
        try:
            self.maintain()
        except Exception as exc:
            log.error("state store maintenance failed: %s", exc)

    def flush(self) -> None:
        """Commit what is queued, the open window and the segments' heartbeat, in one transaction."""
        with self._flush_lock:  # writer and shutdown may both flush: never commit an older window last
            self._flush()

    def _flush(self) -> None:
        items: list[tuple[str, tuple[Any, ...]]] = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        window = self.window_source() if self.window_source is not None else None
        if window is not None:
            seg, run_id, row = window
            items.append(
                (
                    "window",
                    (seg, run_id, row.t_start, row.t_end, 0.0, json.dumps(row.outcomes), encode_hists(row.hists)),
                )
            )
        now = self.clock()
        with self._tx() as c:
            samples = [a for k, a in items if k == "sample"]
            if samples:
                c.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?)", samples)
            events = [a for k, a in items if k == "event"]
            if events:
                c.executemany("INSERT INTO events (run_id, segment_id, t, kind, detail) VALUES (?, ?, ?, ?, ?)", events)
            windows = [a for k, a in items if k == "window"]
            if windows:
                c.executemany("INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?, ?, ?, ?)", windows)
            if self.segment_id is not None:
                c.execute("UPDATE segments SET last_seen = ? WHERE id = ? AND ended_at IS NULL", (now, self.segment_id))

    # ------------------------------------------------------------------ retention

    def maintain(self, now: float | None = None) -> None:
        """Downsample old samples and windows, drop data past retention, cap events."""
        now = self.clock() if now is None else now
        with self._tx() as c:
            horizon = now - self.retention
            for table, col in (("samples", "t"), ("windows", "t_end"), ("events", "t")):
                c.execute(f"DELETE FROM {table} WHERE {col} < ?", (horizon,))
            for age, bucket in SAMPLE_TIERS:
                cutoff = (now - age) // bucket * bucket
                c.execute(
                    "INSERT INTO samples SELECT run_id, series, CAST(t / :b AS INTEGER) * :b AS bt,"
                    " SUM(value * n) / SUM(n), MIN(vmin), MAX(vmax), SUM(n), :b FROM samples"
                    " WHERE t < :cut AND resolution < :b GROUP BY run_id, series, bt",
                    {"b": bucket, "cut": cutoff},
                )
                c.execute("DELETE FROM samples WHERE t < :cut AND resolution < :b", {"b": bucket, "cut": cutoff})
            for age, bucket in WINDOW_TIERS:
                self._merge_windows(c, (now - age) // bucket * bucket, bucket)
            self._cap_events(c)

    @staticmethod
    def _cap_events(c: sqlite3.Connection) -> None:
        for (run_id,) in c.execute(
            "SELECT run_id FROM events GROUP BY run_id HAVING COUNT(*) > ?", (MAX_EVENTS_PER_RUN,)
        ).fetchall():
            c.execute(
                "DELETE FROM events WHERE run_id = ? AND id NOT IN "
                "(SELECT id FROM events WHERE run_id = ? ORDER BY id DESC LIMIT ?)",
                (run_id, run_id, MAX_EVENTS_PER_RUN),
            )

    @staticmethod
    def _merge_windows(c: sqlite3.Connection, cutoff: float, bucket: float) -> None:
        rows = c.execute(
            "SELECT segment_id, run_id, t_start, t_end, outcomes, hists FROM windows"
            " WHERE t_end <= ? AND resolution < ? ORDER BY segment_id, t_start",
            (cutoff, bucket),
        ).fetchall()
        merged: dict[tuple[int, float], list[Any]] = {}
        for seg, run_id, t0, t1, outcomes, blob in rows:
            key = (seg, t0 // bucket * bucket)
            m = merged.get(key)
            hists = decode_hists(blob)
            counts = json.loads(outcomes)
            if m is None:
                merged[key] = [run_id, t0, t1, counts, hists]
                continue
            m[1], m[2] = min(m[1], t0), max(m[2], t1)
            for k, v in counts.items():
                m[3][k] = m[3].get(k, 0) + v
            for s, h in hists.items():
                m[4][s] = m[4][s] + h if s in m[4] else h
        c.execute("DELETE FROM windows WHERE t_end <= ? AND resolution < ?", (cutoff, bucket))
        c.executemany(
            "INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(seg, m[0], m[1], m[2], bucket, json.dumps(m[3]), encode_hists(m[4])) for (seg, _), m in merged.items()],
        )

    # ------------------------------------------------------------------ reads

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()
