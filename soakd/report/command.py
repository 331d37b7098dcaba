"""``soakd report``: a run's report from its state dir, as JSON, self-contained HTML or Markdown."""

from __future__ import annotations

import argparse
import json
import sys

from soakd.errors import Exit
from soakd.report.data import RunNotFound, load_run_report


def report_command(ns: argparse.Namespace) -> int:
    if getattr(ns, "fleet", None):
        from soakd.report.fleet import fleet_command

        return fleet_command(ns)
    if ns.format != "json" or ns.config:
        return _full_report(ns)
    try:
        report = load_run_report(ns.state_dir, ns.run_id)
    except RunNotFound as exc:
        print(f"soakd: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    text = json.dumps(report, indent=2, allow_nan=False, default=str) + "\n"
    if ns.output:
        from soakd.summary import write_json_atomic

        write_json_atomic(ns.output, report)
    else:
        sys.stdout.write(text)
    return Exit.OK


def _full_report(ns: argparse.Namespace) -> int:
    """HTML and Markdown (and JSON with --config): the report with plots' data, memory verdicts
    and SLO checks (``--config``'s ``[slo]``, else the run's own). With --config the exit code
    is the gate's: 1 when an SLO is missed."""
    from soakd.config import load_config
    from soakd.report.document import build_report

    slo = load_config(ns.config).slo if ns.config else None
    try:
        doc = build_report(ns.state_dir, ns.run_id, slo=slo)
    except RunNotFound as exc:
        print(f"soakd: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    if ns.format == "html":
        from soakd.report.html import render_html

        text = render_html(doc)
    elif ns.format == "md":
        from soakd.report.markdown import render_markdown

        text = render_markdown(doc)
    else:
        text = json.dumps(doc.data, indent=2, allow_nan=False, default=str) + "\n"
    if ns.output:
        from pathlib import Path

        Path(ns.output).write_text(text, encoding="utf-8")
        print(f"report: {ns.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if ns.config and not doc.data["slo"]["passed"]:
        return Exit.FAIL
    return Exit.OK
