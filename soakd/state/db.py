"""Opening the state database: WAL, an integrity check, the schema; a corrupt file, or one that
stays locked while no live soakd holds a run lock in the state dir, is moved aside for a fresh one."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from soakd.errors import StateError
from soakd.state.lock import live_holders
from soakd.state.schema import DB_NAME, SCHEMA, SCHEMA_VERSION

LOCK_TIMEOUT = 5.0


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
