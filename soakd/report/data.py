"""Assemble a run's report from the state database: every segment, merged histograms.

Read-only on the database (a live soak can be reported on while it runs). The returned dict
follows the summary JSON's contract (``requests``, ``latency_ms.<stage>.{p50,...}``, ``run``)
plus what only a multi-segment run has (``segments``, ``restarts``, ``events``); HTML and
Markdown renderers build on the same dict, and on :func:`load_timeline` / :func:`load_series`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from soakd.store import DB_NAME, decode_hists
from soakd.summary import stage_summary
from soakd.telemetry.catalogue import OUTCOMES, STAGES
from soakd.telemetry.histogram import HistSnapshot

MAX_EVENTS = 500  # most recent events in a report; the database keeps more


class RunNotFound(LookupError):
    """No such state database or run; the message says which."""


@contextmanager
def _connect(state_dir: str | Path) -> Iterator[sqlite3.Connection]:
    path = Path(state_dir) / DB_NAME
    if not path.is_file():
        raise RunNotFound(f"{path}: no state database (is --state-dir right?)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        yield conn
    finally:
        conn.close()


def latest_run_id(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
    return None if row is None else str(row[0])


def _resolve(conn: sqlite3.Connection, run_id: str | None) -> tuple[str, tuple[Any, ...]]:
    rid = run_id or latest_run_id(conn)
    row = None if rid is None else conn.execute(
        "SELECT run_id, created_at, finished_at, fingerprint FROM runs WHERE run_id = ?", (rid,)).fetchone()
    if rid is None or row is None:
        known = [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 5")]
        hint = f" (recent: {', '.join(known)})" if known else " (no runs)"
        raise RunNotFound(f"run {rid!r} not found{hint}")
    return rid, row


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def load_run_report(state_dir: str | Path, run_id: str | None = None) -> dict[str, Any]:
    """The whole run, across its segments. ``run_id`` None: the most recent run."""
    with _connect(state_dir) as conn:
        rid, (_, created, finished, fp) = _resolve(conn, run_id)
        segs = conn.execute(
            "SELECT id, pid, started_at, last_seen, ended_at, end_reason FROM segments"
            " WHERE run_id = ? ORDER BY id",
            (rid,)).fetchall()
        per_seg: dict[int, dict[str, int]] = {s[0]: dict.fromkeys(OUTCOMES, 0) for s in segs}
        merged: dict[str, HistSnapshot] = {}
        for seg, outcomes, blob in conn.execute(
                "SELECT segment_id, outcomes, hists FROM windows WHERE run_id = ?", (rid,)):
            counts = per_seg.setdefault(seg, dict.fromkeys(OUTCOMES, 0))
            for k, v in json.loads(outcomes).items():
                counts[k] = counts.get(k, 0) + int(v)
            for stage, h in decode_hists(blob).items():
                merged[stage] = merged[stage] + h if stage in merged else h
        events = conn.execute(
            "SELECT t, segment_id, kind, detail FROM events WHERE run_id = ?"
            " ORDER BY t DESC, id DESC LIMIT ?",
            (rid, MAX_EVENTS)).fetchall()
        series = [r[0] for r in conn.execute(
            "SELECT DISTINCT series FROM samples WHERE run_id = ? ORDER BY series", (rid,))]
        memory = {}
        for name in series:
            first, last, lo, hi, n = conn.execute(
                "SELECT (SELECT value FROM samples WHERE run_id = ?1 AND series = ?2 ORDER BY t LIMIT 1),"
                " (SELECT value FROM samples WHERE run_id = ?1 AND series = ?2 ORDER BY t DESC LIMIT 1),"
                " MIN(vmin), MAX(vmax), SUM(n) FROM samples WHERE run_id = ?1 AND series = ?2",
                (rid, name)).fetchone()
            memory[name] = {"first": first, "last": last, "min": lo, "max": hi, "samples": n}

    requests = dict.fromkeys(OUTCOMES, 0)
    for counts in per_seg.values():
        for k, v in counts.items():
            requests[k] = requests.get(k, 0) + v
    segments = []
    active = 0.0
    for sid, pid, started, last_seen, ended, reason in segs:
        dur = max(0.0, (ended or last_seen) - started)
        active += dur
        segments.append({
            "id": sid, "pid": pid, "started_at": _iso(started), "ended_at": _iso(ended),
            "last_seen": _iso(last_seen), "duration_seconds": round(dur, 3),
            # No end recorded: the process died (kill -9, OOM killer, power) or is still running.
            "end": reason if ended is not None else "unclean (killed, crashed or still running)",
            "requests": per_seg.get(sid, {}),
        })
    order = [s for s in STAGES if s in merged] + sorted(s for s in merged if s not in STAGES)
    latency = {s: stage_summary(merged[s]) for s in order}
    if "e2e" not in latency:
        latency["e2e"] = stage_summary(HistSnapshot.empty())
    return {
        "run_id": rid,
        "created_at": _iso(created),
        "finished": finished is not None,
        "finished_at": _iso(finished),
        "duration_seconds": round(active, 3),
        "throughput_rps": round(requests.get("ok", 0) / active, 3) if active > 0 else 0.0,
        "requests": requests,
        "latency_ms": latency,
        "segments": segments,
        "restarts": max(0, len(segments) - 1),
        "unclean_exits": sum(1 for s in segs if s[4] is None and s is not segs[-1]),
        "memory": memory,
        "events": [{"t": _iso(t), "segment": seg, "kind": kind, "detail": detail}
                   for t, seg, kind, detail in reversed(events)],
        "run": json.loads(fp) if fp else {},
    }


def load_timeline(state_dir: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Per window, oldest first: time, segment, throughput, outcomes and e2e percentiles."""
    out = []
    with _connect(state_dir) as conn:
        rid, _ = _resolve(conn, run_id)
        for seg, t0, t1, res, outcomes, blob in conn.execute(
                "SELECT segment_id, t_start, t_end, resolution, outcomes, hists FROM windows"
                " WHERE run_id = ? ORDER BY t_start", (rid,)):
            counts = json.loads(outcomes)
            e2e = decode_hists(blob).get("e2e", HistSnapshot.empty())
            out.append({"t_start": t0, "t_end": t1, "segment": seg, "resolution_seconds": res,
                        "throughput_rps": counts.get("ok", 0) / max(1e-9, t1 - t0), "requests": counts,
                        "e2e_ms": stage_summary(e2e)})
    return out


def load_series(state_dir: str | Path, run_id: str | None, series: str) -> list[tuple[float, ...]]:
    """Memory samples of one series, oldest first: (unix time, mean, min, max)."""
    with _connect(state_dir) as conn:
        rid, _ = _resolve(conn, run_id)
        return [tuple(r) for r in conn.execute(
            "SELECT t, value, vmin, vmax FROM samples WHERE run_id = ? AND series = ? ORDER BY t",
            (rid, series))]
