"""``soakd report``: a run's report from its state dir, as JSON (HTML and Markdown to come)."""

from __future__ import annotations

import argparse
import json
import sys

from soakd.report.data import RunNotFound, load_run_report

EXIT_OK, EXIT_USAGE = 0, 2


def report_command(ns: argparse.Namespace) -> int:
    if ns.format != "json":
        print(f"soakd: error: report --format {ns.format}: not implemented yet (use --format json)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        report = load_run_report(ns.state_dir, ns.run_id)
    except RunNotFound as exc:
        print(f"soakd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text = json.dumps(report, indent=2, allow_nan=False, default=str) + "\n"
    if ns.output:
        from soakd.summary import write_json_atomic

        write_json_atomic(ns.output, report)
    else:
        sys.stdout.write(text)
    return EXIT_OK
