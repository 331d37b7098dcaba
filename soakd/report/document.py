"""The full report of a run: the JSON report data plus what the HTML plots need.

:func:`build_report` starts from :func:`soakd.report.data.load_run_report` (segments, merged
percentiles, events, fingerprint) and adds per-window figures per stage, memory trends and
leak verdicts, SLO checks and, from the run's last saved summary, what the state database does
not hold (batch sizes, input shapes, cold start). Every renderer (JSON, HTML, Markdown) reads
the same :class:`ReportDoc`.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from soakd.config import LeakConfig, SloConfig
from soakd.report.data import load_run_report, load_series
from soakd.report.memory import memory_block
from soakd.report.slo import slo_block
from soakd.report.windows import rows_from_windows
from soakd.store import DB_NAME, decode_hists
from soakd.telemetry.histogram import HistSnapshot

SUMMARY_NAME = "summary.json"  # <state-dir>/<run-id>/summary.json: the last segment's summary
REPORT_NAME = "report.html"
# Summary keys the state database does not hold; taken from the saved summary when there is one.
FROM_SUMMARY = ("batch_size", "input_shapes_seen", "cold_start", "schedule_lag_ms", "offered_rps")

Array = npt.NDArray[np.float64]


@dataclass
class ReportDoc:
    data: dict[str, Any]  # JSON-able: what `report --format json` prints
    samples: dict[str, tuple[Array, Array]] = field(default_factory=dict)  # memory: unix t, bytes
    hists: dict[str, HistSnapshot] = field(default_factory=dict)  # latency per stage, whole run
    t0: float | None = None  # unix time of the first window: the plots' zero


def run_dir(state_dir: str | Path, run_id: str) -> Path:
    return Path(state_dir) / run_id


def _section(cls: type[Any], data: dict[str, Any] | None) -> Any:
    """A config section from the fingerprint's config dict (already typed when it was saved)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in names})


StoredWindow = tuple[float, float, dict[str, int], dict[str, HistSnapshot]]


def _windows(state_dir: str | Path, run_id: str) -> list[StoredWindow]:
    conn = sqlite3.connect(f"file:{Path(state_dir) / DB_NAME}?mode=ro", uri=True, timeout=10)
    try:
        # A segment's writer may keep upserting its window between the segment's end and the
        # process exit (stretching it, or adding empty ones): that time is not part of the run.
        rows = conn.execute(
            "SELECT w.t_start, MIN(w.t_end, COALESCE(s.ended_at, w.t_end)), w.outcomes, w.hists FROM windows w"
            " JOIN segments s ON s.id = w.segment_id"
            " WHERE w.run_id = ? AND (s.ended_at IS NULL OR w.t_start < s.ended_at) ORDER BY w.t_start",
            (run_id,)).fetchall()
    finally:
        conn.close()
    return [(t0, t1, json.loads(o), decode_hists(blob)) for t0, t1, o, blob in rows]


def _run_end(state_dir: str | Path, run_id: str) -> float | None:
    """When the run's last segment ended (None: still running or died without a recorded end)."""
    conn = sqlite3.connect(f"file:{Path(state_dir) / DB_NAME}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute("SELECT ended_at FROM segments WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                           (run_id,)).fetchone()
    finally:
        conn.close()
    return None if row is None or row[0] is None else float(row[0])


def build_report(state_dir: str | Path, run_id: str | None = None, *, slo: SloConfig | None = None,
                 summary: dict[str, Any] | None = None) -> ReportDoc:
    """The run's report. ``slo``: checks to apply (default: the run's own ``[slo]``);
    ``summary``: the run's summary when the caller has it (else the saved one, if any)."""
    data = load_run_report(state_dir, run_id)
    rid: str = data["run_id"]
    config: dict[str, Any] = (data.get("run") or {}).get("config") or {}
    if summary is None:
        try:
            summary = json.loads((run_dir(state_dir, rid) / SUMMARY_NAME).read_text())
        except (OSError, ValueError):
            summary = None
    for key in FROM_SUMMARY:
        if summary is not None and key in summary and key not in data:
            data[key] = summary[key]

    windows = _windows(state_dir, rid)
    data["windows"] = rows_from_windows(windows)
    hists: dict[str, HistSnapshot] = {}
    for _, _, _, hs in windows:
        for stage, h in hs.items():
            hists[stage] = hists[stage] + h if stage in hists else h

    samples: dict[str, tuple[Array, Array]] = {}
    end = _run_end(state_dir, rid)
    for name in data.get("memory", {}):
        rows = load_series(state_dir, rid, name)
        arr = np.asarray([r[:2] for r in rows], dtype=np.float64).reshape(-1, 2)
        if end is not None:  # samplers outlive the load by a moment; that moment is not the run
            arr = arr[arr[:, 0] <= end]
        samples[name] = (arr[:, 0], arr[:, 1])
    # The live monitor's verdict (saved in the summary) outranks one judgement over the samples.
    saved: dict[str, dict[str, Any]] = (summary or {}).get("memory") or {}
    live = {s: {"suspected": m.get("leak_suspected"), "slope_bytes_per_hour": m.get("slope_bytes_per_hour"),
                "p_value": m.get("p_value")}
            for s, m in saved.items() if m.get("verdict_source") == "leak monitor"}
    memory = memory_block(samples, _section(LeakConfig, config.get("leak")), live)
    for name, info in memory.items():
        data.setdefault("memory", {}).setdefault(name, {}).update(info)

    slo_cfg = slo if slo is not None else _section(SloConfig, config.get("slo"))
    data["run_duration_seconds"] = data.get("duration_seconds")
    data["slo"] = slo_block(slo_cfg, data)
    return ReportDoc(data=data, samples=samples, hists=hists, t0=windows[0][0] if windows else None)
