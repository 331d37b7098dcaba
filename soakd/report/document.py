"""The full report of a run: the JSON report data plus what the HTML plots need.

:func:`build_report` starts from :func:`soakd.report.data.run_report` (segments, merged
percentiles, events, fingerprint) and adds per-window figures per stage, memory trends and
leak verdicts, SLO checks and, from the run's last saved summary, what the state database does
not hold (batch sizes, input shapes, cold start). Every renderer (JSON, HTML, Markdown) reads
the same :class:`ReportDoc`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from soakd.config import LeakConfig, SloConfig
from soakd.report.data import run_report
from soakd.report.window_rows import rows_from_windows
from soakd.state import RunState
from soakd.telemetry.histogram import HistSnapshot
from soakd.verdicts.memory import memory_block
from soakd.verdicts.slo import slo_block

SUMMARY_NAME = "summary.json"  # <state-dir>/<run-id>/summary.json: the last segment's summary
REPORT_NAME = "report.html"
# Summary keys the state database does not hold; taken from the saved summary when there is one.
FROM_SUMMARY = (
    "batch_size",
    "input_shapes_seen",
    "cold_start",
    "schedule_lag_ms",
    "offered_rps",
    "target",
    "model_offline",
    "llm",
)

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


def build_report(
    state: RunState, *, slo: SloConfig | None = None, summary: dict[str, Any] | None = None, judged: bool = False
) -> ReportDoc:
    """The run's report from its state. ``slo``: checks to apply (default: the run's own
    ``[slo]``); ``summary``: the run's summary when there is one (the end of ``soakd run`` passes
    its own, ``soakd report`` the saved one) for what the database does not hold and the live
    leak verdicts. ``judged``: the summary's SLO block is this run's verdict, taken as it is."""
    data = run_report(state)
    config: dict[str, Any] = (data.get("run") or {}).get("config") or {}
    for key in FROM_SUMMARY:
        if summary is not None and key in summary and key not in data:
            data[key] = summary[key]

    windows = state.windows
    data["windows"] = rows_from_windows(windows)
    hists: dict[str, HistSnapshot] = {}
    for _, _, _, hs in windows:
        for stage, h in hs.items():
            hists[stage] = hists[stage] + h if stage in hists else h

    samples: dict[str, tuple[Array, Array]] = {}
    end = state.ended_at
    for name in data.get("memory", {}):
        arr = np.asarray([r[:2] for r in state.samples.get(name, [])], dtype=np.float64).reshape(-1, 2)
        if end is not None:  # samplers outlive the load by a moment; that moment is not the run
            arr = arr[arr[:, 0] <= end]
        samples[name] = (arr[:, 0], arr[:, 1])
    # The live monitor's verdict (saved in the summary) outranks one judgement over the samples.
    saved: dict[str, dict[str, Any]] = (summary or {}).get("memory") or {}
    live = {
        s: {
            "state": m.get("leak_state"),
            "suspected": m.get("leak_suspected"),
            "slope_bytes_per_hour": m.get("slope_bytes_per_hour"),
            "p_value": m.get("p_value"),
            "detectable_slope_bytes_per_hour": m.get("detectable_slope_bytes_per_hour"),
            "judged_seconds": m.get("judged_seconds"),
            "exhaustion_eta_seconds": m.get("exhaustion_eta_seconds"),
            "reason": str(m.get("verdict", "")).split(": ", 1)[-1],
        }
        for s, m in saved.items()
        if m.get("verdict_source") == "leak monitor"
    }
    memory = memory_block(samples, _section(LeakConfig, config.get("leak")), live)
    for name, info in memory.items():
        data.setdefault("memory", {}).setdefault(name, {}).update(info)

    data["run_duration_seconds"] = data.get("duration_seconds")
    if judged and summary is not None:
        data["slo"] = summary["slo"]  # the verdict this run printed and exits with
    else:
        slo_cfg = slo if slo is not None else _section(SloConfig, config.get("slo"))
        data["slo"] = slo_block(slo_cfg, data)
    return ReportDoc(data=data, samples=samples, hists=hists, t0=windows[0][0] if windows else None)
