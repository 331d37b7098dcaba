"""What the state dir holds: where it is, the database's name and tables, and how a window's
histograms are stored in a row.

Tables: ``runs``, ``segments`` (one per process lifetime), ``windows`` (per-window request
counts and mergeable latency histograms, one row per stage set per window), ``samples``
(memory series) and ``events`` (phases, verdicts, restarts, errors).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from soakd.telemetry.histogram import HistSnapshot

DB_NAME = "soakd.db"
CURRENT_RUN = "current-run"
SCHEMA_VERSION = 1

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
