"""``soakd report``: a run's report from its state dir, as JSON, self-contained HTML or Markdown.

A state database that cannot be read (garbage, truncated, on a mount SQLite cannot open) and an
output that cannot be written are exit 2 with one line naming the file, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import zlib
from pathlib import Path
from typing import Any

from soakd.config import load_config, redact_secrets
from soakd.errors import Exit, SoakdError
from soakd.files import write_private
from soakd.report.data import RunNotFound, load_run_report
from soakd.store import DB_NAME


class UnreadableState(SoakdError):
    """The state database exists but cannot be read; the message names it and says why."""


def report_command(ns: argparse.Namespace) -> int:
    db = Path(ns.state_dir) / DB_NAME
    try:
        return _report(ns)
    except RunNotFound as exc:
        print(f"soakd: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except sqlite3.Error as exc:
        hint = ""
        if "unable to open" in str(exc) or "readonly" in str(exc):
            hint = " (a read-only mount or folder: SQLite needs to create or write its -shm file beside it)"
        elif "not a database" in str(exc) or "malformed" in str(exc):
            hint = " (damaged or truncated: a new run moves it aside)"
        raise UnreadableState(f"{db}: cannot read the state database: {exc}{hint}") from None
    except (zlib.error, json.JSONDecodeError) as exc:  # histogram rows that decode to garbage
        raise UnreadableState(f"{db}: damaged rows in the state database: {type(exc).__name__}: {exc}") from None


def _report(ns: argparse.Namespace) -> int:
    if ns.format != "json" or ns.config:
        return _full_report(ns)
    report = load_run_report(ns.state_dir, ns.run_id)
    _redact_run(report)
    text = json.dumps(report, indent=2, allow_nan=False, default=str) + "\n"
    _emit(ns.output, text)
    return Exit.OK


def _redact_run(data: dict[str, Any]) -> None:
    """A state file written before redaction existed must not leak its secrets into a report."""
    run = data.get("run")
    if isinstance(run, dict) and isinstance(run.get("config"), dict):
        run["config"] = redact_secrets(run["config"])


def _emit(output: str | None, text: str) -> None:
    if not output:
        sys.stdout.write(text)
        return
    try:
        write_private(output, text)
    except OSError as exc:
        raise UnreadableState(f"--output {output}: cannot write the report: {exc.strerror}") from None
    print(f"report: {output}", file=sys.stderr)


def _full_report(ns: argparse.Namespace) -> int:
    """HTML and Markdown (and JSON with --config): the report with plots' data, memory verdicts
    and SLO checks (``--config``'s ``[slo]``, else the run's own). With --config the exit code
    is the gate's: 1 when an SLO is missed."""
    from soakd.report.document import build_report  # numpy and the renderers: only for this path

    slo = load_config(ns.config).slo if ns.config else None
    doc = build_report(ns.state_dir, ns.run_id, slo=slo)
    _redact_run(doc.data)
    if ns.format == "html":
        from soakd.report.html import render_html

        text = render_html(doc)
    elif ns.format == "md":
        from soakd.report.markdown import render_markdown

        text = render_markdown(doc)
    else:
        text = json.dumps(doc.data, indent=2, allow_nan=False, default=str) + "\n"
    _emit(ns.output, text)
    if ns.config and not doc.data["slo"]["passed"]:
        return Exit.FAIL
    return Exit.OK
