"""Durable run state: SQLite (WAL) in the state dir, written off the hot path.

Tables: ``runs``, ``segments`` (one per process lifetime), ``windows`` (per-window request
counts and mergeable latency histograms, one row per stage set per window), ``samples``
(memory series) and ``events`` (phases, verdicts, restarts, errors).

Writes go through a queue to one writer thread that commits every ``flush_interval``; the
open window is upserted at each commit, so a ``kill -9`` loses at most one interval. Old rows
are merged into coarser ones and, past ``retention``, deleted, so a week-long soak stays in
the tens of megabytes.

One writer per run: :func:`claim_run` takes an exclusive ``flock`` on ``<state-dir>/<run-id>/.lock``
(the run's folder, beside its summary and report) for the process's life; the kernel drops it
when the process dies, even by ``kill -9``. A second soakd on the same run refuses, naming the
holder's pid, and a database that stays locked is moved aside only when no live soakd holds a
run lock in that state dir.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakd.config import check_run_id
from soakd.errors import ConfigError, StateError
from soakd.telemetry.histogram import HistSnapshot

log = logging.getLogger("soakd.store")

DB_NAME = "soakd.db"
CURRENT_RUN = "current-run"
SCHEMA_VERSION = 1
LOCK_TIMEOUT = 5.0
# Downsampling tiers: (older than seconds, merged bucket seconds). Raw samples come every
# ~10 s and windows every minute; a week at these tiers is a few thousand rows per series.
SAMPLE_TIERS = ((6 * 3600.0, 60.0), (2 * 86400.0, 600.0))
WINDOW_TIERS = ((86400.0, 900.0),)
MAX_EVENTS_PER_RUN = 20_000  # a flapping verdict must not grow the file without bound
QUEUE_MAX = 50_000  # samples/events waiting for the writer; beyond this they are dropped

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, created_at REAL NOT NULL, finished_at REAL, fingerprint TEXT);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, pid INTEGER,
    started_at REAL NOT NULL, last_seen REAL NOT NULL, ended_at REAL, end_reason TEXT, fingerprint TEXT);
CREATE INDEX IF NOT EXISTS segments_run ON segments (run_id);
CREATE TABLE IF NOT EXISTS windows (
    segment_id INTEGER NOT NULL, run_id TEXT NOT NULL, t_start REAL NOT NULL, t_end REAL NOT NULL,
    resolution REAL NOT NULL, outcomes TEXT NOT NULL, hists BLOB NOT NULL,
    PRIMARY KEY (segment_id, t_start));
CREATE INDEX IF NOT EXISTS windows_run ON windows (run_id, t_start);
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT NOT NULL, series TEXT NOT NULL, t REAL NOT NULL, value REAL NOT NULL,
    vmin REAL NOT NULL, vmax REAL NOT NULL, n INTEGER NOT NULL, resolution REAL NOT NULL);
CREATE INDEX IF NOT EXISTS samples_run ON samples (run_id, series, t);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, segment_id INTEGER,
    t REAL NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, t);
"""


@dataclass
class WindowRow:
    """One window of one segment: request counts by outcome and a histogram per stage."""

    t_start: float
    t_end: float
    outcomes: dict[str, int]
    hists: dict[str, HistSnapshot]


def encode_hists(hists: dict[str, HistSnapshot]) -> bytes:
    data = {s: {**h.to_sparse(), "sum": h.total, "max": h.maximum} for s, h in hists.items() if h.count}
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 6)


def decode_hists(blob: bytes) -> dict[str, HistSnapshot]:
    data = json.loads(zlib.decompress(blob))
    return {s: HistSnapshot.from_sparse(d, d["sum"], d["max"]) for s, d in data.items()}


def default_state_dir(configured: str | None) -> Path:
    """``--state-dir``, else systemd's ``$STATE_DIRECTORY`` (first entry), else ./soakd-state."""
    if configured:
        return Path(configured)
    env = os.environ.get("STATE_DIRECTORY")
    if env:
        return Path(env.split(":")[0])
    return Path("soakd-state")


# --------------------------------------------------------------------------- opening


def _connect(path: Path, lock_timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=lock_timeout, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
        # A small fixed page cache (256 KiB): the writer only appends and the 10-minute upkeep
        # rereads from the OS page cache. The cache keeps every page it touches up to its size,
        # so a larger one would read as the daemon's RSS creeping through the first hours.
        conn.execute("PRAGMA cache_size=-256")
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {check}")
        conn.execute("BEGIN IMMEDIATE")  # proves we can write now, not at the first flush
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn


# --------------------------------------------------------------------------- run locks

LOCK_NAME = ".lock"
_HELD: dict[Path, int] = {}  # lock file -> its descriptor, open (and locked) until the process exits


def run_lock_path(state_dir: Path, run_id: str) -> Path:
    return state_dir / run_id / LOCK_NAME


def _lock_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def claim_run(state_dir: Path, run_id: str) -> Path:
    """Take the run's lock for the rest of this process's life (again: a no-op); StateError when
    another process holds it, naming its pid. The lock file holds the holder's pid."""
    path = run_lock_path(state_dir, run_id)
    key = path.resolve()
    if key in _HELD:
        return path
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)  # the run's folder: its summary and report go here too
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateError(f"{path}: cannot create the run's lock file: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _lock_pid(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateError(f"{path}: cannot lock: {exc.strerror}") from None
        raise StateError(
            f"run {run_id!r} in {state_dir} is being recorded by another soakd (pid {pid}, lock {path}); "
            "stop that one first, or give this one another --run-id"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd
    return path


def live_holders(state_dir: Path) -> list[tuple[str, str]]:
    """(pid, run id) of every other process holding a run lock in ``state_dir``."""
    out: list[tuple[str, str]] = []
    for path in sorted(state_dir.glob(f"*/{LOCK_NAME}")):
        if path.resolve() in _HELD:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            out.append((_lock_pid(fd), path.parent.name))
        finally:
            os.close(fd)  # closing drops the probe's own shared lock, if it got one
    return out


def _move_aside(path: Path, why: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.{why}-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(path) + suffix)
        if src.exists():
            os.replace(src, Path(str(aside) + suffix))
    return aside


def open_db(state_dir: Path, lock_timeout: float = LOCK_TIMEOUT) -> tuple[sqlite3.Connection, list[str]]:
    """Open (creating) the state database; a corrupt or locked file is moved aside for a fresh one.

    Returns the connection and the notices to log and record (what was moved where). Raises
    StateError only when the directory itself is unusable: a restart would not help then.
    """
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"state dir {state_dir}: cannot create it: {exc.strerror}") from None
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise StateError(f"state dir {state_dir}: not writable by this user")
    path = state_dir / DB_NAME
    notices: list[str] = []
    try:
        return _connect(path, lock_timeout), notices
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            why, detail = "corrupt", str(exc)
        else:
            holders = live_holders(state_dir)
            if holders:  # a live soak's history: never move it aside, whatever the wait
                who = ", ".join(f"pid {pid} (run {run})" for pid, run in holders)
                raise StateError(
                    f"{path}: still locked after {lock_timeout:.0f}s, and soakd {who} is recording in this "
                    "state dir: not moving its state aside; use another --state-dir"
                ) from None
            why, detail = "locked", f"still locked by another process after {lock_timeout:.0f}s"
    except sqlite3.DatabaseError as exc:
        why, detail = "corrupt", str(exc)
    try:
        aside = _move_aside(path, why)
    except OSError as exc:
        raise StateError(f"{path}: {why} ({detail}) and cannot be moved aside: {exc.strerror}") from None
    notices.append(f"state file {path} is {why} ({detail}); moved it to {aside} and started a fresh one")
    try:
        return _connect(path, lock_timeout), notices
    except sqlite3.Error as exc:
        raise StateError(f"{path}: cannot create a fresh state file: {exc}") from None


def resolve_run_id(state_dir: Path, requested: str | None, resume: bool, new_id: Callable[[], str]) -> str:
    """The run to record into, claimed (:func:`claim_run`) for this process: ``--run-id``, else
    (when resuming) the state dir's unfinished run named in ``current-run``, else a new id.
    StateError when another soakd is recording that run."""
    run_id = requested or (_current_run(state_dir) if resume else "") or new_id()
    claim_run(state_dir, run_id)
    return run_id


def _current_run(state_dir: Path) -> str:
    try:
        current = (state_dir / CURRENT_RUN).read_text().strip()
    except OSError:
        return ""
    try:
        return check_run_id(current, f"{state_dir / CURRENT_RUN}")
    except ConfigError:  # an edited marker is not a path to write reports to
        log.warning("%s: ignoring %r: not a run id", state_dir / CURRENT_RUN, current)
        return ""


# --------------------------------------------------------------------------- the store


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


# --------------------------------------------------------------------------- reading


class RunNotFound(StateError):
    """No such state database or run; the message says which."""


StoredWindow = tuple[float, float, dict[str, int], dict[str, HistSnapshot]]
MAX_REPORT_EVENTS = 500  # most recent events in a report; the database keeps more


@dataclass
class RunState:
    """Everything the state database holds about one run, read in one go (reports are pure
    functions of this and the run's summary)."""

    run_id: str
    created_at: float
    finished_at: float | None
    fingerprint: dict[str, Any]
    segments: list[tuple[int, int | None, float, float, float | None, str | None]]  # id, pid, start, seen, end, why
    windows: list[StoredWindow]  # clipped to their segment's end, oldest first
    segment_outcomes: dict[int, dict[str, int]]
    events: list[tuple[float, int | None, str, str]]  # oldest first, the most recent MAX_REPORT_EVENTS
    series_stats: dict[str, tuple[float, float, float, float, int]]  # first, last, min, max, samples
    samples: dict[str, list[tuple[float, float, float, float]]]  # t, mean, min, max; oldest first

    @property
    def ended_at(self) -> float | None:
        """When the run's last segment ended (None: still running or died without a recorded end)."""
        return self.segments[-1][4] if self.segments else None


class StateReader:
    """The one reader of the state database; every report query goes through it. Read-only, so
    a live soak can be reported on while it runs."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / DB_NAME
        if not self.path.is_file():
            raise RunNotFound(f"{self.path}: no state database (is --state-dir right?)")
        try:
            self._conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
            self._conn.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise StateError(f"{self.path}: cannot read the state database: {exc}") from None

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def latest_run_id(self) -> str | None:
        row = self._conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def resolve(self, run_id: str | None) -> tuple[str, float, float | None, str | None]:
        c = self._conn
        rid = run_id or self.latest_run_id()
        row = (
            None
            if rid is None
            else c.execute(
                "SELECT run_id, created_at, finished_at, fingerprint FROM runs WHERE run_id = ?", (rid,)
            ).fetchone()
        )
        if rid is None or row is None:
            known = [r[0] for r in c.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 5")]
            hint = f" (recent: {', '.join(known)})" if known else " (no runs)"
            raise RunNotFound(f"run {rid!r} not found{hint}")
        return str(row[0]), float(row[1]), row[2], row[3]

    def load_run(self, run_id: str | None = None) -> RunState:
        """The whole run, across its segments. ``run_id`` None: the most recent run."""
        try:
            return self._load_run(run_id)
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{self.path}: the state database is damaged: {exc}") from None

    def _load_run(self, run_id: str | None) -> RunState:
        c = self._conn
        rid, created, finished, fp = self.resolve(run_id)
        segs = [
            tuple(r)
            for r in c.execute(
                "SELECT id, pid, started_at, last_seen, ended_at, end_reason FROM segments"
                " WHERE run_id = ? ORDER BY id",
                (rid,),
            )
        ]
        per_seg: dict[int, dict[str, int]] = {}
        for seg, outcomes in c.execute("SELECT segment_id, outcomes FROM windows WHERE run_id = ?", (rid,)):
            counts = per_seg.setdefault(seg, {})
            for k, v in json.loads(outcomes).items():
                counts[k] = counts.get(k, 0) + int(v)
        # A segment's writer may keep upserting its window between the segment's end and the
        # process exit (stretching it, or adding empty ones): that time is not part of the run.
        windows = [
            (t0, t1, json.loads(o), decode_hists(blob))
            for t0, t1, o, blob in c.execute(
                "SELECT w.t_start, MIN(w.t_end, COALESCE(s.ended_at, w.t_end)), w.outcomes, w.hists FROM windows w"
                " JOIN segments s ON s.id = w.segment_id"
                " WHERE w.run_id = ? AND (s.ended_at IS NULL OR w.t_start < s.ended_at) ORDER BY w.t_start",
                (rid,),
            )
        ]
        events = c.execute(
            "SELECT t, segment_id, kind, detail FROM events WHERE run_id = ? ORDER BY t DESC, id DESC LIMIT ?",
            (rid, MAX_REPORT_EVENTS),
        ).fetchall()
        stats: dict[str, tuple[float, float, float, float, int]] = {}
        samples: dict[str, list[tuple[float, float, float, float]]] = {}
        for (name,) in c.execute(
            "SELECT DISTINCT series FROM samples WHERE run_id = ? ORDER BY series", (rid,)
        ).fetchall():
            stats[name] = tuple(
                c.execute(
                    "SELECT (SELECT value FROM samples WHERE run_id = ?1 AND series = ?2 ORDER BY t LIMIT 1),"
                    " (SELECT value FROM samples WHERE run_id = ?1 AND series = ?2 ORDER BY t DESC LIMIT 1),"
                    " MIN(vmin), MAX(vmax), SUM(n) FROM samples WHERE run_id = ?1 AND series = ?2",
                    (rid, name),
                ).fetchone()
            )
            samples[name] = [
                tuple(r)
                for r in c.execute(
                    "SELECT t, value, vmin, vmax FROM samples WHERE run_id = ? AND series = ? ORDER BY t", (rid, name)
                )
            ]
        return RunState(
            run_id=rid,
            created_at=created,
            finished_at=finished,
            fingerprint=json.loads(fp) if fp else {},
            segments=segs,
            windows=windows,
            segment_outcomes=per_seg,
            events=[tuple(e) for e in reversed(events)],
            series_stats=stats,
            samples=samples,
        )

    def timeline(
        self, run_id: str | None = None
    ) -> list[tuple[int, float, float, float, dict[str, int], dict[str, HistSnapshot]]]:
        """Every stored window as written (segment, start, end, resolution, outcomes, hists)."""
        rid, *_ = self.resolve(run_id)
        return [
            (seg, t0, t1, res, json.loads(o), decode_hists(blob))
            for seg, t0, t1, res, o, blob in self._conn.execute(
                "SELECT segment_id, t_start, t_end, resolution, outcomes, hists FROM windows"
                " WHERE run_id = ? ORDER BY t_start",
                (rid,),
            )
        ]
