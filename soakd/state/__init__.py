"""Durable run state: SQLite (WAL) in the state dir, written off the hot path.

- :mod:`soakd.state.schema`: the state dir's place and files, the tables, a window's row
- :mod:`soakd.state.lock`: one writer per run (``flock`` on ``<state-dir>/<run-id>/.lock``)
- :mod:`soakd.state.db`: opening the database, moving a corrupt or stuck file aside
- :mod:`soakd.state.writer`: :class:`StateStore`, one writer thread, downsampling and retention
- :mod:`soakd.state.reader`: :class:`StateReader` and :class:`RunState`, what reports read
"""

from __future__ import annotations

from soakd.state.db import LOCK_TIMEOUT, open_db
from soakd.state.lock import LOCK_NAME, claim_run, live_holders, resolve_run_id, run_lock_path
from soakd.state.reader import MAX_REPORT_EVENTS, RunNotFound, RunState, StateReader, StoredWindow
from soakd.state.schema import (
    CURRENT_RUN,
    DB_NAME,
    SCHEMA,
    SCHEMA_VERSION,
    WindowRow,
    decode_hists,
    default_state_dir,
    encode_hists,
)
from soakd.state.writer import MAX_EVENTS_PER_RUN, QUEUE_MAX, SAMPLE_TIERS, WINDOW_TIERS, StateStore

__all__ = [
    "CURRENT_RUN",
    "DB_NAME",
    "LOCK_NAME",
    "LOCK_TIMEOUT",
    "MAX_EVENTS_PER_RUN",
    "MAX_REPORT_EVENTS",
    "QUEUE_MAX",
    "SAMPLE_TIERS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "WINDOW_TIERS",
    "RunNotFound",
    "RunState",
    "StateReader",
    "StateStore",
    "StoredWindow",
    "WindowRow",
    "claim_run",
    "decode_hists",
    "default_state_dir",
    "encode_hists",
    "live_holders",
    "open_db",
    "resolve_run_id",
    "run_lock_path",
]
