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
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from soakd.config import LeakConfig, SloConfig
from soakd.record.types import MemorySeries, RunRecord
from soakd.record.write import to_json_object
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
    "replay",
    "record_requests",
)

Array = npt.NDArray[np.float64]


@dataclass
class ReportDoc:
    record: RunRecord  # what `report --format json` prints
    samples: dict[str, tuple[Array, Array]] = field(default_factory=dict)  # memory: unix t, bytes
    hists: dict[str, HistSnapshot] = field(default_factory=dict)  # latency per stage, whole run
    t0: float | None = None  # unix time of the first window: the plots' zero

    @cached_property
    def data(self) -> dict[str, Any]:
        """The record as JSON values, for the renderers (built once: the record is final by then)."""
        return to_json_object(self.record)


def run_dir(state_dir: str | Path, run_id: str) -> Path:
    return Path(state_dir) / run_id


def _section(cls: type[Any], data: dict[str, Any] | None) -> Any:
    """A config section from the fingerprint's config dict (already typed when it was saved)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in names})


def _live_verdict(m: MemorySeries) -> dict[str, Any]:
    """A saved summary's live leak verdict, as :func:`memory_block` takes it."""
    return {
        "state": m.leak_state,
        "suspected": m.leak_suspected,
        "slope_bytes_per_hour": m.slope_bytes_per_hour,
        "p_value": m.p_value,
        "detectable_slope_bytes_per_hour": m.detectable_slope_bytes_per_hour,
        "judged_seconds": m.judged_seconds,
        "exhaustion_eta_seconds": m.exhaustion_eta_seconds,
        "reason": str(m.verdict or "").split(": ", 1)[-1],
    }


def build_report(
    state: RunState, *, slo: SloConfig | None = None, summary: RunRecord | None = None, judged: bool = False
) -> ReportDoc:
    """The run's report from its state. ``slo``: checks to apply (default: the run's own
    ``[slo]``); ``summary``: the run's summary when there is one (the end of ``soakd run`` passes
    its own, ``soakd report`` the saved one) for what the database does not hold and the live
    leak verdicts. ``judged``: the summary's SLO block is this run's verdict, taken as it is."""
    data = run_report(state)
    config = data.config
    for key in FROM_SUMMARY:
        saved = getattr(summary, key, msgspec.UNSET)
        if saved is not msgspec.UNSET and getattr(data, key) is msgspec.UNSET:
            setattr(data, key, saved)

    windows = state.windows
    data.windows = rows_from_windows(windows)
    hists: dict[str, HistSnapshot] = {}
    for _, _, _, hs in windows:
        for stage, h in hs.items():
            hists[stage] = hists[stage] + h if stage in hists else h

    samples: dict[str, tuple[Array, Array]] = {}
    end = state.ended_at
    for name in data.series:
        arr = np.asarray([r[:2] for r in state.samples.get(name, [])], dtype=np.float64).reshape(-1, 2)
        if end is not None:  # samplers outlive the load by a moment; that moment is not the run
            arr = arr[arr[:, 0] <= end]
        samples[name] = (arr[:, 0], arr[:, 1])
    # The live monitor's verdict (saved in the summary) outranks one judgement over the samples.
    saved = summary.series if summary is not None else {}
    live = {s: _live_verdict(m) for s, m in saved.items() if m.verdict_source == "leak monitor"}
    memory = memory_block(samples, _section(LeakConfig, config.get("leak")), live)
    series = dict(data.series)
    for name, info in memory.items():  # the verdict's figures over the state's range
        stored = msgspec.to_builtins(series[name]) if name in series else {}
        series[name] = msgspec.convert({**stored, **msgspec.to_builtins(info)}, MemorySeries)
    data.memory = series

    data.run_duration_seconds = data.duration_seconds
    if judged and summary is not None:
        data.slo = summary.slo  # the verdict this run printed and exits with
    else:
        slo_cfg = slo if slo is not None else _section(SloConfig, config.get("slo"))
        data.slo = slo_block(slo_cfg, data)
    return ReportDoc(record=data, samples=samples, hists=hists, t0=windows[0][0] if windows else None)
