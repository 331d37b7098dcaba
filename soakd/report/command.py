"""``soakd report``: a run's report from its state dir, as JSON, self-contained HTML or Markdown."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from soakd.config import load_config
from soakd.errors import Exit
from soakd.report.data import run_report
from soakd.report.document import SUMMARY_NAME, build_report, run_dir
from soakd.store import StateReader
from soakd.summary import write_json_atomic, write_text_private


def _saved_summary(state_dir: str, run_id: str) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir(state_dir, run_id) / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def report_command(ns: argparse.Namespace) -> int:
    """Plain JSON: the state's own figures. HTML and Markdown (and JSON with --config): the report
    with plots' data, memory verdicts and SLO checks (``--config``'s ``[slo]``, else the run's
    own). With --config the exit code is the gate's: 1 when an SLO is missed. A missing or
    damaged state database is a StateError (exit 2, naming the file)."""
    slo = load_config(ns.config).slo if ns.config else None
    with StateReader(ns.state_dir) as reader:
        state = reader.load_run(ns.run_id)
    if ns.format == "json" and not ns.config:
        report = run_report(state)
        if ns.output:
            write_json_atomic(ns.output, report)
        else:
            sys.stdout.write(json.dumps(report, indent=2, allow_nan=False, default=str) + "\n")
        return Exit.OK
    doc = build_report(state, slo=slo, summary=_saved_summary(ns.state_dir, state.run_id))
    if ns.format == "html":
        from soakd.report.html import render_html  # matplotlib loads only for HTML

        text = render_html(doc)
    elif ns.format == "md":
        from soakd.report.markdown import render_markdown  # as above: each format loads its own renderer

        text = render_markdown(doc)
    else:
        text = json.dumps(doc.data, indent=2, allow_nan=False, default=str) + "\n"
    if ns.output:
        write_text_private(Path(ns.output), text)
        print(f"report: {ns.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if ns.config and not doc.data["slo"]["passed"]:
        return Exit.FAIL
    return Exit.OK
