"""SLO checks on a summary (or a report): each check's name, limit, observed value and result.

A check passes, fails, or cannot be judged (``passed`` None: e.g. no leak verdict yet for a
series). Only a failed check fails the gate: an unjudged leak check is shown, not counted,
because the ``min_duration`` check is what guards a run that was too short to judge. A check on
requests (latency, errors, throughput) with nothing measured fails: a gate never passes on nothing.

Every gate has an error bound: without ``[slo] max_error_ratio`` the default one applies
(DEFAULT_MAX_ERROR_RATIO, named "error ratio (default)"), as Locust fails a run with failed requests.
For a served model the same bound holds the share of the run it was down ("target down"): while
a server refuses, soakd backs off, so an outage sends few requests to fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from soakd.config import SloConfig
from soakd.record.types import RunRecord, SloBlock, SloCheck


@dataclass(frozen=True)
class Check:
    name: str
    limit: float | None
    observed: float | str | None
    op: str  # how observed must compare with limit: "<=", ">=", "no leak"
    unit: str
    passed: bool | None

    @property
    def status(self) -> str:
        return {True: "pass", False: "FAIL", None: "n/a"}[self.passed]


DEFAULT_MAX_ERROR_RATIO = 0.01  # requests not ok, when [slo] sets no bound of its own
DEFAULT_ERROR_CHECK = "error ratio (default)"


def _le(observed: float | None, limit: float) -> bool:
    return observed is not None and observed <= limit


def error_ratio(requests: dict[str, int]) -> float | None:
    """Share of requests that did not end ok (errors, timeouts, OOMs, bad input, dropped)."""
    total = sum(requests.values())
    return None if total == 0 else (total - requests.get("ok", 0)) / total


def down_ratio(record: RunRecord) -> float | None:
    """Share of the run a served model was down (None in process, or with no duration)."""
    target, duration = record.target_block, record.duration_seconds
    if target is None or target.down_seconds is None or not duration:
        return None
    return min(1.0, float(target.down_seconds) / float(duration))


def error_bound(slo: SloConfig) -> tuple[str, float] | None:
    """The error gate in force: its check's name and limit; None when ``"none"`` turned it off."""
    if slo.max_error_ratio == "none":
        return None
    if slo.max_error_ratio is None:
        return DEFAULT_ERROR_CHECK, DEFAULT_MAX_ERROR_RATIO
    return "error ratio", slo.max_error_ratio


def check_slos(slo: SloConfig, record: RunRecord) -> list[Check]:
    checks: list[Check] = []
    limits = {"e2e": slo.p99_ms} if slo.p99_ms is not None else {}
    limits.update(slo.stage_p99_ms)  # a per-stage e2e limit is the more specific one
    for stage, limit in limits.items():
        observed = record.p99(stage)
        checks.append(Check(f"p99 {stage}", limit, observed, "<=", "ms", _le(observed, limit)))
    bound = error_bound(slo)
    if bound is not None:
        name, limit = bound
        ratio = error_ratio(record.requests)
        checks.append(Check(name, limit, ratio, "<=", "", _le(ratio, limit)))
        down = down_ratio(record)
        if down is not None:  # a served model: while it was down, few requests went out to fail
            checks.append(Check(name.replace("error ratio", "target down"), limit, down, "<=", "", down <= limit))
    if slo.min_throughput_rps is not None:
        rps = record.throughput_rps
        passed = rps is not None and rps >= slo.min_throughput_rps
        checks.append(Check("throughput", slo.min_throughput_rps, rps, ">=", "req/s", passed))
    if slo.min_duration is not None:
        dur = record.judged_duration
        checks.append(
            Check("duration", slo.min_duration, dur, ">=", "s", None if dur is None else dur >= slo.min_duration)
        )
    for series in slo.no_leak:
        found = record.series.get(series)
        suspected = None if found is None else found.leak
        verdict = {True: "leak suspected", False: "no leak", None: "no verdict"}[suspected]
        checks.append(
            Check(f"no leak {series}", None, verdict, "no leak", "", None if suspected is None else not suspected)
        )
    return checks


def slo_block(slo: SloConfig, record: RunRecord) -> SloBlock:
    """The record's ``slo`` key: overall result and every check."""
    checks = check_slos(slo, record)
    return SloBlock(
        passed=all(c.passed is not False for c in checks),
        failed=[c.name for c in checks if c.passed is False],
        checks=[
            SloCheck(
                name=c.name, limit=c.limit, observed=c.observed, op=c.op, unit=c.unit, passed=c.passed, status=c.status
            )
            for c in checks
        ],
    )
