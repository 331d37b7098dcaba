"""A fleet report: many soaks (one per GPU) in, one table per GPU and a merged verdict out.

Each source is a state dir (its most recent run), a report or summary JSON, or an earlier
fleet JSON (its GPUs are taken one by one, so fleets of several clusters merge). Latency
histograms merge exactly: the per-stage counts add bucket by bucket (the same log-bucket grid
everywhere), so the fleet's p99 is the p99 of every request of every GPU, not a mean of p99s.
A JSON without histograms (a summary, or a report from ``soakd report --format json``) still
gets its table and verdicts, but then the fleet has no merged percentiles, and says so.

The fleet fails when any GPU fails: a leak suspected on any memory series, or an SLO missed
(the run's own ``[slo]``, or ``--config``'s, which also applies to the merged figures). The
worst GPU is named: failing GPUs first (most reasons first), then the highest p99.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from soakd.config import CompareConfig, SloConfig, load_config
from soakd.errors import Exit, SoakdError, StateError
from soakd.record.read import read_any
from soakd.record.types import (
    DeviceGroup,
    FleetRecord,
    FleetVerdict,
    GpuEntry,
    Percentiles,
    RunRecord,
    WorstGpu,
)
from soakd.record.validate import Malformed, is_fleet_doc, load_json
from soakd.record.write import dump_record, stage_summary
from soakd.report.compare import Comparison, print_comparison
from soakd.report.inputs import load_report
from soakd.telemetry.catalogue import STAGES
from soakd.telemetry.histogram import HistSnapshot
from soakd.verdicts.slo import error_ratio, slo_block

Hists = dict[str, HistSnapshot]


class FleetSourceError(SoakdError):
    """A fleet source that is neither a state dir nor a soakd JSON; the message names it."""


@dataclass
class GpuRun:
    """One soak of one GPU: its record and, where known, its exact histograms."""

    name: str
    source: str
    record: RunRecord
    hists: Hists | None
    reasons: list[str] = field(default_factory=list)

    @property
    def p99_e2e_ms(self) -> float | None:
        return self.record.p99("e2e")

    @property
    def passed(self) -> bool:
        return not self.reasons


# --------------------------------------------------------------------------- histograms in JSON


def hists_to_json(hists: Hists) -> dict[str, dict[str, Any]]:
    """The sparse form the state database stores (bucket indexes and counts, sum, max)."""
    return {s: {**h.to_sparse(), "sum": h.total, "max": h.maximum} for s, h in hists.items() if h.count}


def hists_from_json(data: Any, source: str) -> Hists | None:
    if data is None:
        return None
    try:
        return {s: HistSnapshot.from_sparse(d, float(d["sum"]), float(d["max"])) for s, d in data.items()}
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise FleetSourceError(f"{source}: latency_histograms is malformed ({type(exc).__name__}: {exc})") from None


def merge_hists(parts: Iterable[Hists]) -> Hists:
    merged: Hists = {}
    for hists in parts:
        for stage, h in hists.items():
            merged[stage] = merged[stage] + h if stage in merged else h
    return merged


def _stage_order(stages: Iterable[str]) -> list[str]:
    names = set(stages)
    return [s for s in STAGES if s in names] + sorted(names - set(STAGES))


# --------------------------------------------------------------------------- loading sources


def _from_state_dir(path: Path, slo: SloConfig | None) -> GpuRun:
    try:
        doc = load_report(path, None, slo=slo)
    except StateError as exc:
        raise FleetSourceError(f"{path}: {exc}") from None
    return GpuRun("", str(path), doc.record, doc.hists)


def _from_json(path: Path, slo: SloConfig | None) -> list[GpuRun]:
    try:
        doc = load_json(path)
    except (OSError, ValueError) as exc:
        raise FleetSourceError(f"{path}: cannot read a soakd JSON: {exc}") from None
    if not is_fleet_doc(doc) and not (isinstance(doc, dict) and "latency_ms" in doc):
        raise FleetSourceError(f"{path}: not a soakd summary, report or fleet JSON (no latency_ms)")
    try:
        record = read_any(doc)
    except Malformed as exc:
        raise FleetSourceError(f"{path}: not a soakd summary, report or fleet JSON: {exc}") from None
    if isinstance(record, FleetRecord):
        runs = []
        for i, gpu in enumerate(record.gpus):
            where = f"{path} (gpus[{i}])"
            run = GpuRun(gpu.name, gpu.source or where, gpu.report, hists_from_json(gpu.latency_histograms, where))
            runs.append(_with_slo(run, slo))
        return runs
    run = GpuRun("", str(path), record, hists_from_json(doc.get("latency_histograms"), str(path)))
    return [_with_slo(run, slo)]


def _with_slo(run: GpuRun, slo: SloConfig | None) -> GpuRun:
    if slo is not None:
        run.record = msgspec.structs.replace(run.record, slo=slo_block(slo, run.record))
    return run


def load_sources(sources: Sequence[str], slo: SloConfig | None = None) -> list[GpuRun]:
    """Every GPU run of ``sources`` (state dirs and JSON files), named uniquely."""
    runs: list[GpuRun] = []
    for src in sources:
        path = Path(src)
        if path.is_dir():
            runs.append(_from_state_dir(path, slo))
        elif path.is_file():
            runs.extend(_from_json(path, slo))
        else:
            raise FleetSourceError(f"{src}: no such state dir or JSON file")
    _name(runs)
    return runs


def _name(runs: list[GpuRun]) -> None:
    """``host/device`` (a pod's host name is its pod name), or the source where another run of
    the set has the same host and device. Runs named by an earlier fleet JSON keep their names."""

    def key(run: GpuRun) -> str | None:
        host, device = run.record.fingerprint.get("host"), run.record.fingerprint.get("device")
        return f"{host}/{device}" if host and device else None

    keys = [key(r) for r in runs]
    for run, k in zip(runs, keys, strict=True):
        if not run.name:
            run.name = k if k is not None and keys.count(k) == 1 else run.source
    names = [r.name for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise FleetSourceError(f"the same GPU run given twice: {', '.join(dupes)}")


# --------------------------------------------------------------------------- the verdict


def _judge(run: GpuRun) -> None:
    leaks = run.record.leaks
    run.reasons = [f"leak suspected: {', '.join(leaks)}"] if leaks else []
    slo = run.record.slo_block
    run.reasons += [f"SLO missed: {name}" for name in (slo.failed if slo is not None else [])]


def worst(runs: Sequence[GpuRun]) -> GpuRun | None:
    """Failing GPUs first (most reasons first), then the highest end-to-end p99."""
    if not runs:
        return None
    return max(runs, key=lambda r: (not r.passed, len(r.reasons), r.p99_e2e_ms or 0.0))


def gpu_entry(run: GpuRun) -> GpuEntry:
    d, fp = run.record, run.record.fingerprint
    return GpuEntry(
        name=run.name,
        source=run.source,
        run_id=d.run_id if isinstance(d.run_id, str) else fp.get("run_id"),
        device_name=fp.get("device_name"),
        host=fp.get("host"),
        passed=run.passed,
        reasons=run.reasons,
        duration_seconds=d.duration_seconds,
        throughput_rps=d.throughput_rps,
        requests=d.requests,
        error_ratio=error_ratio(d.requests),
        latency_ms=d.latency_ms,
        leaks={s: m.leak for s, m in sorted(d.series.items())},
        slo=d.slo_block,
        latency_histograms=None if run.hists is None else hists_to_json(run.hists),
        report=d,
    )


def _latency(hists: Hists) -> dict[str, Percentiles]:
    return {s: msgspec.convert(stage_summary(hists[s]), Percentiles) for s in _stage_order(hists)}


def _device_groups(runs: Sequence[GpuRun]) -> dict[str, DeviceGroup]:
    """The GPUs by device name (a fleet of mixed boards: one line per board)."""
    by_model: dict[str, list[GpuRun]] = {}
    for run in runs:
        by_model.setdefault(str(run.record.fingerprint.get("device_name") or "unknown"), []).append(run)
    return {
        model: DeviceGroup(
            gpus=[r.name for r in group],
            failed_gpus=[r.name for r in group if not r.passed],
            throughput_rps=round(sum(float(r.record.throughput_rps or 0.0) for r in group), 3),
            latency_ms=(
                _latency(merge_hists(r.hists for r in group if r.hists is not None))
                if all(r.hists is not None for r in group)
                else None
            ),
        )
        for model, group in sorted(by_model.items())
    }


def build_fleet(runs: Sequence[GpuRun], slo: SloConfig | None = None) -> FleetRecord:
    """The fleet JSON: merged figures and verdict, the worst GPU, one entry per GPU."""
    if not runs:
        raise FleetSourceError("a fleet report needs at least one state dir or JSON")
    for run in runs:
        _judge(run)
    notes = []
    requests: dict[str, int] = {}
    for run in runs:
        for k, v in run.record.requests.items():
            requests[k] = requests.get(k, 0) + v
    exact = all(r.hists is not None for r in runs)
    merged: Hists = merge_hists(r.hists for r in runs if r.hists is not None) if exact else {}
    if not exact:
        missing = [r.name for r in runs if r.hists is None]
        notes.append(
            "no merged latency: no histograms in "
            + ", ".join(missing)
            + " (a summary or report JSON; give its state dir, or a fleet JSON)"
        )
    throughput = sum(float(r.record.throughput_rps or 0.0) for r in runs)
    latency = _latency(merged) if exact else None
    fleet_slo = None
    failed = [r.name for r in runs if not r.passed]
    if slo is not None:
        # The fleet as one service: every request of every GPU against the limits. Leaks and
        # throughput are per GPU (a fleet total would hide one slow or leaking GPU).
        merged_slo = SloConfig(
            p99_ms=slo.p99_ms, stage_p99_ms=dict(slo.stage_p99_ms), max_error_ratio=slo.max_error_ratio
        )
        as_one = RunRecord(requests=requests, latency_ms=latency or {}, throughput_rps=throughput)
        fleet_slo = slo_block(merged_slo, as_one)
    passed = not failed and (fleet_slo is None or fleet_slo.passed)
    bad = worst(runs)
    assert bad is not None
    return FleetRecord(
        fleet=FleetVerdict(
            gpus=len(runs),
            passed=passed,
            verdict="pass" if passed else "FAIL",
            failed_gpus=failed,
            worst_gpu=WorstGpu(name=bad.name, passed=bad.passed, reasons=bad.reasons, p99_e2e_ms=bad.p99_e2e_ms),
            merged_latency_exact=exact,
            notes=notes,
        ),
        throughput_rps=round(throughput, 3),
        requests=requests,
        error_ratio=error_ratio(requests),
        latency_ms=latency,
        latency_histograms=hists_to_json(merged) if exact else None,
        slo=fleet_slo,
        by_device_name=_device_groups(runs),
        gpus=[gpu_entry(r) for r in runs],
    )


# --------------------------------------------------------------------------- Markdown


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{float(v):.3f}"


def _latency_table(latency: dict[str, Percentiles]) -> list[str]:
    out = ["| stage | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | requests |", "|---|---:|---:|---:|---:|---:|---:|"]
    for stage in _stage_order(latency):
        s = latency[stage]
        count = s.count if isinstance(s.count, int) else "-"
        out.append(f"| {stage} | {_ms(s.p50)} | {_ms(s.p90)} | {_ms(s.p99)} | {_ms(s.p999)} | {_ms(s.max)} | {count} |")
    return out


def render_fleet_markdown(fleet: FleetRecord) -> str:
    f = fleet.fleet
    w = f.worst_gpu
    lines = [f"# Fleet report: {f.gpus} GPUs, verdict {f.verdict}", ""]
    why = "; ".join(w.reasons) if w.reasons else f"passes, highest p99 e2e ({_ms(w.p99_e2e_ms)} ms)"
    lines += [f"**Worst GPU: {w.name}** ({why})", ""]
    if f.failed_gpus:
        lines += [f"Failed GPUs: {', '.join(f.failed_gpus)}", ""]
    lines += [f"Note: {n}" for n in f.notes] + ([""] if f.notes else [])
    lines += [
        "## All GPUs merged",
        "",
        f"Throughput {fleet.throughput_rps:.1f} req/s in all; requests "
        + ", ".join(f"{k} {v}" for k, v in fleet.requests.items() if v),
        "",
    ]
    if fleet.latency_ms:
        lines += [*_latency_table(fleet.latency_ms), ""]
    if fleet.slo is not None:
        lines += ["| merged SLO check | observed | result |", "|---|---:|---|"]
        lines += [f"| {c.name} | {c.observed} | {c.status} |" for c in fleet.slo.checks]
        lines.append("")
    lines += [
        "| GPU | device | verdict | req/s | p99 e2e ms | error ratio | leak suspected |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for g in fleet.gpus:
        er = "-" if g.error_ratio is None else f"{g.error_ratio:.4g}"
        leaks = ", ".join(s for s, v in g.leaks.items() if v) or "none"
        e2e = (g.latency_ms or {}).get("e2e")
        lines.append(
            f"| {g.name} | {g.device_name or '-'} | {'pass' if g.passed else 'FAIL'} | "
            f"{float(g.throughput_rps or 0):.1f} | {_ms(None if e2e is None else e2e.p99)} | {er} | {leaks} |"
        )
    lines.append("")
    for g in fleet.gpus:
        verdict = "pass" if g.passed else "FAIL: " + "; ".join(g.reasons)
        lines += [
            f"## {g.name}: {verdict}",
            "",
            f"{g.device_name or 'unknown device'}, run {g.run_id}, {g.source}; "
            f"{float(g.throughput_rps or 0):.1f} req/s over {g.duration_seconds} s",
            "",
        ]
        lines += [*_latency_table(g.latency_ms or {}), ""]
        if g.leaks:
            lines += ["| memory series | leak verdict |", "|---|---|"]
            lines += [f"| {s} | {_LEAK_WORDS.get(v, 'not judged')} |" for s, v in g.leaks.items()]
            lines.append("")
    return "\n".join(lines)


_LEAK_WORDS: dict[bool | None, str] = {True: "LEAK SUSPECTED", False: "no leak"}


# --------------------------------------------------------------------------- commands


def fleet_command(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``soakd report --fleet SRC...``: the fleet JSON (or Markdown); exit 1 when the fleet fails."""
    if ns.format == "html":
        raise SoakdError("--fleet: --format html is not available for a fleet (use json or md)")
    if ns.run_id:
        raise SoakdError("--fleet: --run-id names one run; a fleet reports each state dir's latest run")
    slo = load_config(ns.config).slo if ns.config else None
    fleet = build_fleet(load_sources(ns.fleet, slo), slo)
    text = render_fleet_markdown(fleet) if ns.format == "md" else dump_record(fleet)
    if ns.output:
        Path(ns.output).write_text(text, encoding="utf-8")
        print(f"report: {ns.output}", file=sys.stderr)
    else:
        (out or sys.stdout).write(text)
    w = fleet.fleet.worst_gpu
    print(
        f"fleet: {fleet.fleet.gpus} GPUs, verdict {fleet.fleet.verdict}; worst GPU {w.name}"
        + (f" ({'; '.join(w.reasons)})" if w.reasons else ""),
        file=sys.stderr,
    )
    return Exit.OK if fleet.fleet.passed else Exit.FAIL


def compare_fleets(a: FleetRecord, b: FleetRecord, cfg: CompareConfig, a_name: str, b_name: str, out: TextIO) -> int:
    """Fleet B against fleet A: the merged figures, then each GPU matched by name (a
    StatefulSet's pods keep their names from one release's soak to the next)."""
    ga = {g.name: g for g in a.gpus}
    gb = {g.name: g for g in b.gpus}
    regressions: list[str] = []
    merged = Comparison(a.merged(), b.merged(), cfg).run()
    if len(ga) != len(gb):
        merged.warnings.append(f"fleets differ in size: {len(ga)} GPUs vs {len(gb)} (throughput is the sum)")
    print("== all GPUs merged", file=out)
    print_comparison(merged, a_name, b_name, out)
    regressions += [f"merged: {m}" for m in merged.regressions]
    for name in sorted(set(ga) & set(gb)):
        cmp = Comparison(ga[name].report, gb[name].report, cfg).run()
        print(f"\n== {name}", file=out)
        print_comparison(cmp, f"{a_name} [{name}]", f"{b_name} [{name}]", out)
        regressions += [f"{name}: {m}" for m in cmp.regressions]
    for name in sorted(set(ga) ^ set(gb)):
        print(f"warning: GPU {name} only in {a_name if name in ga else b_name}", file=out)
    print(f"\nfleet: {'regression: ' + ', '.join(regressions) if regressions else 'no regression'}", file=out)
    return Exit.FAIL if regressions else Exit.OK
