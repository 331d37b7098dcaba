"""The SLO gate as text: the checks' cells for the reports and the ``SLO pass/FAIL`` lines that
end ``soakd run`` (the verdict itself is computed in :mod:`soakd.verdicts.slo`)."""

from __future__ import annotations

from typing import TextIO

from soakd.record.types import SloBlock, SloCheck
from soakd.report.units import with_unit  # one format per unit, as in the reports


def format_observed(check: SloCheck) -> str:
    v = check.observed
    if v is None:
        return "nothing measured" if check.status == "FAIL" else "-"
    if isinstance(v, float):
        return with_unit(v, check.unit)
    return str(v)


def format_limit(check: SloCheck) -> str:
    if check.limit is None:
        return check.op
    return f"{check.op} {check.limit:g} {check.unit}".strip()


def print_verdict(block: SloBlock, out: TextIO) -> None:
    """``SLO pass/FAIL`` lines for the end of a run."""
    if not block.checks:
        print("SLO: none configured ([slo] in --config)", file=out)
        return
    for c in block.checks:
        print(f"SLO {c.status:<4} {c.name:<28} observed {format_observed(c):<18} limit {format_limit(c)}", file=out)
    verdict = "met" if block.passed else f"MISSED ({', '.join(block.failed)})"
    print(f"SLO verdict: {verdict}", file=out)
