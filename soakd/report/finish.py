"""The end of ``soakd run``: complete the summary (windows, memory, batch sizes, SLO checks),
print the verdict, save the summary and the HTML report in the state dir, pick the exit code."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from soakd.config import Config
from soakd.errors import Exit
from soakd.files import write_private
from soakd.report.memory import memory_block
from soakd.report.slo import print_verdict, slo_block
from soakd.summary import write_json_atomic

if TYPE_CHECKING:
    from soakd.telemetry.catalogue import Metrics
    from soakd.telemetry.series import SeriesStore

log = logging.getLogger("soakd.report")



def batch_buckets(metrics: Metrics) -> list[dict[str, Any]]:
    """Batches per ``soakd_batch_size`` bucket (not cumulative), up to the largest size seen."""
    cumulative: list[tuple[float, float]] = []
    for family in metrics.batch_size.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                cumulative.append((float(s.labels["le"]), s.value))
    cumulative.sort()
    out: list[dict[str, Any]] = []
    prev = 0.0
    for le, value in cumulative:
        n = int(value - prev)
        prev = value
        if math.isinf(le):  # beyond the largest bound: fold into it (JSON has no infinity)
            if n and out:
                out[-1]["count"] += n
            continue
        out.append({"le": le, "count": n})
    while out and out[-1]["count"] == 0:
        out.pop()
    return out


def complete_summary(summary: dict[str, Any], cfg: Config, *, windows: list[dict[str, Any]],
                     series: SeriesStore | None, metrics: Metrics,
                     elapsed_before: float = 0.0) -> dict[str, Any]:
    """Add ``windows``, ``memory``, ``batch_size.buckets``, ``run_duration_seconds`` and ``slo``."""
    from soakd.daemon import leak_verdicts  # the live monitor's verdicts, from its gauges

    summary["windows"] = windows
    samples = {name: series.read(name) for name in series.names()} if series is not None else {}
    summary["memory"] = memory_block({k: v for k, v in samples.items() if np.size(v[0])}, cfg.leak,
                                     leak_verdicts(metrics))
    if isinstance(summary.get("batch_size"), dict):
        summary["batch_size"]["buckets"] = batch_buckets(metrics)
    # A resumed run: earlier segments count toward the minimum duration.
    summary["run_duration_seconds"] = round(elapsed_before + summary.get("duration_seconds", 0.0), 3)
    summary["slo"] = slo_block(cfg.slo, summary)
    return summary


def write_run_report(state_dir: str | Path, run_id: str, summary: dict[str, Any]) -> Path:
    """``<state-dir>/<run-id>/summary.json`` and ``report.html``; returns the report's path."""
    from soakd.report.document import REPORT_NAME, SUMMARY_NAME, build_report, run_dir
    from soakd.report.html import render_html

    folder = run_dir(state_dir, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / SUMMARY_NAME, summary)
    doc = build_report(state_dir, run_id, summary=summary)
    doc.data["slo"] = summary["slo"]  # the verdict this run printed and exits with
    return write_private(folder / REPORT_NAME, render_html(doc))  # 0600, like the summary


def conclude(summary: dict[str, Any], *, state_dir: str | Path | None, run_id: str, out: TextIO) -> int:
    """Print the SLO verdict and the report's path; the exit code (1 when an SLO is missed)."""
    print_verdict(summary["slo"], out)
    if state_dir is not None:
        try:
            path = write_run_report(state_dir, run_id, summary)
            print(f"report: {path}", file=out, flush=True)
        except Exception:  # the soak's verdict stands even if its report cannot be drawn
            log.exception("cannot write the run's report")
    return Exit.OK if summary["slo"]["passed"] else Exit.FAIL
