"""The one reader of the state database (:class:`StateReader`) and what it reads a run into
(:class:`RunState`): reports are pure functions of that and the run's summary."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakd.errors import StateError
from soakd.state.schema import DB_NAME, decode_hists
from soakd.telemetry.histogram import HistSnapshot


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
