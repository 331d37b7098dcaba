"""A run's report data from its state: every segment, merged histograms, events, memory ranges.

Pure: :class:`soakd.state.RunState` in, a :class:`~soakd.record.types.RunRecord` out: the
summary's figures (``requests``, ``latency_ms.<stage>.{p50,...}``, ``run``) plus what only a
multi-segment run has (``segments``, ``restarts``, ``events``); the renderers build on it.
The ``load_*`` helpers read a state dir through :class:`soakd.state.StateReader`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from soakd.record.types import Event, MemorySeries, Percentiles, RunRecord, Segment
from soakd.record.write import stage_summary
from soakd.state import RunNotFound, RunState, StateReader
from soakd.telemetry.catalogue import OUTCOMES, STAGES
from soakd.telemetry.histogram import HistSnapshot

__all__ = ["RunNotFound", "load_run_report", "load_series", "load_timeline", "run_report"]


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def run_report(state: RunState) -> RunRecord:
    """The whole run, across its segments."""
    per_seg = {s[0]: {**dict.fromkeys(OUTCOMES, 0), **state.segment_outcomes.get(s[0], {})} for s in state.segments}
    merged: dict[str, HistSnapshot] = {}
    for _, _, _, hs in state.windows:
        for stage, h in hs.items():
            merged[stage] = merged[stage] + h if stage in merged else h
    requests = dict.fromkeys(OUTCOMES, 0)
    for counts in state.segment_outcomes.values():
        for k, v in counts.items():
            requests[k] = requests.get(k, 0) + v
    segments = []
    active = 0.0
    for sid, pid, started, last_seen, ended, reason in state.segments:
        dur = max(0.0, (ended or last_seen) - started)
        active += dur
        segments.append(
            Segment(
                id=sid,
                pid=pid,
                started_at=_iso(started),
                ended_at=_iso(ended),
                last_seen=_iso(last_seen),
                duration_seconds=round(dur, 3),
                # No end recorded: the process died (kill -9, OOM killer, power) or is still running.
                end=reason if ended is not None else "unclean (killed, crashed or still running)",
                requests=per_seg.get(sid, {}),
            )
        )
    order = [s for s in STAGES if s in merged] + sorted(s for s in merged if s not in STAGES)
    latency = {s: stage_summary(merged[s]) for s in order}
    if "e2e" not in latency:
        latency["e2e"] = stage_summary(HistSnapshot.empty())
    memory = {
        name: MemorySeries(first=first, last=last, min=lo, max=hi, samples=n)
        for name, (first, last, lo, hi, n) in state.series_stats.items()
    }
    segs = state.segments
    return RunRecord(
        run_id=state.run_id,
        created_at=_iso(state.created_at),
        finished=state.finished_at is not None,
        finished_at=_iso(state.finished_at),
        duration_seconds=round(active, 3),
        throughput_rps=round(requests.get("ok", 0) / active, 3) if active > 0 else 0.0,
        requests=requests,
        latency_ms=msgspec.convert(latency, dict[str, Percentiles]),
        segments=segments,
        restarts=max(0, len(segments) - 1),
        unclean_exits=sum(1 for s in segs if s[4] is None and s is not segs[-1]),
        memory=memory,
        events=[Event(t=_iso(t), segment=seg, kind=kind, detail=detail) for t, seg, kind, detail in state.events],
        run=state.fingerprint,
    )


def load_run_report(state_dir: str | Path, run_id: str | None = None) -> RunRecord:
    """:func:`run_report` of a state dir's run (``run_id`` None: the most recent)."""
    with StateReader(state_dir) as reader:
        return run_report(reader.load_run(run_id))


def load_timeline(state_dir: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Per stored window, oldest first: time, segment, throughput, outcomes and e2e percentiles."""
    with StateReader(state_dir) as reader:
        rows = reader.timeline(run_id)
    return [
        {
            "t_start": t0,
            "t_end": t1,
            "segment": seg,
            "resolution_seconds": res,
            "throughput_rps": counts.get("ok", 0) / max(1e-9, t1 - t0),
            "requests": counts,
            "e2e_ms": stage_summary(hs.get("e2e", HistSnapshot.empty())),
        }
        for seg, t0, t1, res, counts, hs in rows
    ]


def load_series(state_dir: str | Path, run_id: str | None, series: str) -> list[tuple[float, ...]]:
    """Memory samples of one series, oldest first: (unix time, mean, min, max)."""
    with StateReader(state_dir) as reader:
        return list(reader.load_run(run_id).samples.get(series, []))
