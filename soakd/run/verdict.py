"""The end of ``soakd run``: print the SLO verdict, save the summary and the HTML report in the
state dir, pick the exit code."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

from soakd.errors import Exit
from soakd.record.types import RunRecord, SloBlock
from soakd.record.write import write_record, write_text_private
from soakd.report.document import REPORT_NAME, SUMMARY_NAME, build_report, run_dir
from soakd.report.gate import print_verdict
from soakd.state import StateReader

log = logging.getLogger("soakd.report")


def write_run_report(state_dir: str | Path, run_id: str, summary: RunRecord) -> Path:
    """``<state-dir>/<run-id>/summary.json`` and ``report.html``; returns the report's path. The
    report takes this run's verdicts (memory, SLOs) from ``summary``: nothing is judged twice."""
    folder = run_dir(state_dir, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    write_record(folder / SUMMARY_NAME, summary)
    with StateReader(state_dir) as state:
        doc = build_report(state.load_run(run_id), summary=summary, judged=True)
    # Here, not at the top: matplotlib costs 0.3 s of CPU to import, and a run that ends before its
    # soak (a refused target, a bad flag) draws no report.
    from soakd.report.html import render_html

    path = folder / REPORT_NAME
    write_text_private(path, render_html(doc))
    return path


def conclude(summary: RunRecord, *, state_dir: str | Path | None, run_id: str, out: TextIO) -> int:
    """Print the SLO verdict and the report's path; the exit code (1 when an SLO is missed)."""
    slo = summary.slo_block or SloBlock()
    print_verdict(slo, out)
    if state_dir is not None:
        try:
            path = write_run_report(state_dir, run_id, summary)
            print(f"report: {path}", file=out, flush=True)
        except Exception:  # the soak's verdict stands even if its report cannot be drawn
            log.exception("cannot write the run's report")
    return Exit.OK if slo.passed else Exit.FAIL
