"""``soakd report`` and ``soakd compare``: the commands, reading their inputs from disk; the
documents themselves are built by the pure modules beside this one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from soakd.config import CompareConfig, load_config, redact_secrets
from soakd.errors import Exit, StateError
from soakd.record.read import load_record
from soakd.record.types import FleetRecord, RunRecord
from soakd.record.write import dump_record, write_record, write_text_private
from soakd.report.compare import Comparison, print_comparison
from soakd.report.data import run_report
from soakd.report.document import build_report
from soakd.report.fleet import compare_fleets, fleet_command
from soakd.report.inputs import load_state, saved_summary


def report_command(ns: argparse.Namespace) -> int:
    """Plain JSON: the state's own figures. HTML and Markdown (and JSON with --config): the report
    with plots' data, memory verdicts and SLO checks (``--config``'s ``[slo]``, else the run's
    own). With --config the exit code is the gate's: 1 when an SLO is missed. A missing or
    damaged state database is a StateError (exit 2, naming the file). ``--fleet``: many runs,
    one table per GPU (:mod:`soakd.report.fleet`); ``--merge``: one soak from many drivers
    (:mod:`soakd.report.merge`)."""
    if getattr(ns, "fleet", None):
        return fleet_command(ns)
    if getattr(ns, "merge", None):
        from soakd.report.merge import merge_command  # one soak from many drivers: its own module

        return merge_command(ns)
    slo = load_config(ns.config).slo if ns.config else None
    state = load_state(ns.state_dir, ns.run_id)
    if ns.format == "json" and not ns.config:
        report = run_report(state)
        _redact_run(report)
        if ns.output:
            _write(ns.output, lambda: write_record(ns.output, report))
        else:
            sys.stdout.write(dump_record(report))
        return Exit.OK
    doc = build_report(state, slo=slo, summary=saved_summary(ns.state_dir, state.run_id))
    _redact_run(doc.record)
    if ns.format == "html":
        from soakd.report.html import render_html  # matplotlib loads only for HTML

        text = render_html(doc)
    elif ns.format == "md":
        from soakd.report.markdown import render_markdown  # as above: each format loads its own renderer

        text = render_markdown(doc)
    else:
        text = dump_record(doc.record)
    if ns.output:
        _write(ns.output, lambda: write_text_private(Path(ns.output), text))
        print(f"report: {ns.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    gate = doc.record.slo_block
    if ns.config and gate is not None and not gate.passed:
        return Exit.FAIL
    return Exit.OK


def _redact_run(record: RunRecord) -> None:
    """A state file written before redaction existed must not leak its secrets into a report."""
    if record.config:
        record.run = {**record.fingerprint, "config": redact_secrets(record.config)}


def _write(output: str, write: Callable[[], None]) -> None:
    try:
        write()
    except OSError as exc:  # a read-only folder, a full disk: the user's to fix, exit 2
        raise StateError(f"--output {output}: cannot write the report: {exc.strerror}") from None


def compare_command(ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = load_config(ns.config).compare if ns.config else CompareConfig()
    docs: list[RunRecord | FleetRecord] = []
    for path in (ns.a, ns.b):
        try:
            docs.append(load_record(path))
        except (OSError, ValueError) as exc:
            print(f"soakd: error: {path}: {exc}", file=sys.stderr)
            return Exit.USAGE
    a, b = docs
    if isinstance(a, FleetRecord) and isinstance(b, FleetRecord):
        return compare_fleets(a, b, cfg, ns.a, ns.b, out)
    if not isinstance(a, RunRecord) or not isinstance(b, RunRecord):
        print(
            f"soakd: error: {ns.a if isinstance(a, FleetRecord) else ns.b} is a fleet report and the other is not: "
            "compare a fleet with a fleet",
            file=sys.stderr,
        )
        return Exit.USAGE
    cmp = Comparison(a, b, cfg).run()
    print_comparison(cmp, ns.a, ns.b, out)
    return Exit.FAIL if cmp.regressions else Exit.OK
