"""What reports are built from, read from disk: a state dir's run (through the one state reader)
and the summary the run saved beside it. The rest of report/ is pure."""

from __future__ import annotations

from pathlib import Path

from soakd.config import SloConfig
from soakd.record.read import read_record
from soakd.record.types import RunRecord
from soakd.record.validate import load_json
from soakd.report.document import SUMMARY_NAME, ReportDoc, build_report, run_dir
from soakd.state import RunState, StateReader


def saved_summary(state_dir: str | Path, run_id: str) -> RunRecord | None:
    """``<state-dir>/<run-id>/summary.json`` if the run saved one that reads as a run record (a
    damaged one is ignored: the state database holds the figures)."""
    try:
        return read_record(load_json(run_dir(state_dir, run_id) / SUMMARY_NAME))
    except (OSError, ValueError):
        return None


def load_state(state_dir: str | Path, run_id: str | None = None) -> RunState:
    with StateReader(state_dir) as reader:
        return reader.load_run(run_id)


def load_report(state_dir: str | Path, run_id: str | None = None, slo: SloConfig | None = None) -> ReportDoc:
    """The full report of a state dir's run (StateError when the state cannot be read)."""
    state = load_state(state_dir, run_id)
    return build_report(state, slo=slo, summary=saved_summary(state_dir, state.run_id))
