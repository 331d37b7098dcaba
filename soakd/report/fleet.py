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
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from soakd.config import CompareConfig, SloConfig, load_config
from soakd.errors import Exit, SoakdError, StateError
from soakd.record.write import stage_summary
from soakd.report.compare import Comparison, print_comparison
from soakd.report.inputs import load_report
from soakd.report.validate import Malformed, check_fleet, check_result, is_fleet_doc, load_json
from soakd.telemetry.catalogue import STAGES
from soakd.telemetry.histogram import HistSnapshot
from soakd.verdicts.slo import error_ratio, slo_block

Hists = dict[str, HistSnapshot]


class FleetSourceError(SoakdError):
    """A fleet source that is neither a state dir nor a soakd JSON; the message names it."""


@dataclass
class GpuRun:
    """One soak of one GPU: its report dict and, where known, its exact histograms."""

    name: str
    source: str
    data: dict[str, Any]
    hists: Hists | None
    reasons: list[str] = field(default_factory=list)

    @property
    def leaks(self) -> list[str]:
        memory: dict[str, dict[str, Any]] = self.data.get("memory") or {}
        return sorted(s for s, m in memory.items() if isinstance(m, dict) and m.get("leak_suspected") is True)

    @property
    def p99_e2e_ms(self) -> float | None:
        value = ((self.data.get("latency_ms") or {}).get("e2e") or {}).get("p99")
        return None if value is None else float(value)

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
    return GpuRun("", str(path), doc.data, doc.hists)


def _from_json(path: Path, slo: SloConfig | None) -> list[GpuRun]:
    try:
        doc = load_json(path)
    except (OSError, ValueError) as exc:
        raise FleetSourceError(f"{path}: cannot read a soakd JSON: {exc}") from None
    try:
        if is_fleet_doc(doc):
            check_fleet(doc)
        elif isinstance(doc, dict) and "latency_ms" in doc:
            check_result(doc)
    except Malformed as exc:
        raise FleetSourceError(f"{path}: not a soakd summary, report or fleet JSON: {exc}") from None
    if isinstance(doc, dict) and isinstance(doc.get("gpus"), list) and "fleet" in doc:
        runs = []
        for i, gpu in enumerate(doc["gpus"]):
            where = f"{path} (gpus[{i}])"
            if not isinstance(gpu, dict) or "report" not in gpu:
                raise FleetSourceError(f"{where}: not a fleet GPU entry (no report)")
            run = GpuRun(
                str(gpu.get("name") or ""),
                str(gpu.get("source") or where),
                gpu["report"],
                hists_from_json(gpu.get("latency_histograms"), where),
            )
            runs.append(_with_slo(run, slo))
        return runs
    if not isinstance(doc, dict) or "latency_ms" not in doc:
        raise FleetSourceError(f"{path}: not a soakd summary, report or fleet JSON (no latency_ms)")
    run = GpuRun("", str(path), doc, hists_from_json(doc.get("latency_histograms"), str(path)))
    return [_with_slo(run, slo)]


def _with_slo(run: GpuRun, slo: SloConfig | None) -> GpuRun:
    if slo is not None:
        run.data = {**run.data, "slo": slo_block(slo, run.data)}
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
        fp: dict[str, Any] = run.data.get("run") or {}
        host, device = fp.get("host"), fp.get("device")
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
    run.reasons = [f"leak suspected: {', '.join(run.leaks)}"] if run.leaks else []
    slo: dict[str, Any] = run.data.get("slo") or {}
    run.reasons += [f"SLO missed: {name}" for name in slo.get("failed") or []]


def worst(runs: Sequence[GpuRun]) -> GpuRun | None:
    """Failing GPUs first (most reasons first), then the highest end-to-end p99."""
    if not runs:
        return None
    return max(runs, key=lambda r: (not r.passed, len(r.reasons), r.p99_e2e_ms or 0.0))


def gpu_entry(run: GpuRun) -> dict[str, Any]:
    d, fp = run.data, run.data.get("run") or {}
    memory: dict[str, dict[str, Any]] = d.get("memory") or {}
    return {
        "name": run.name,
        "source": run.source,
        "run_id": d.get("run_id") or fp.get("run_id"),
        "device_name": fp.get("device_name"),
        "host": fp.get("host"),
        "passed": run.passed,
        "reasons": run.reasons,
        "duration_seconds": d.get("duration_seconds"),
        "throughput_rps": d.get("throughput_rps"),
        "requests": d.get("requests") or {},
        "error_ratio": error_ratio(d.get("requests") or {}),
        "latency_ms": d.get("latency_ms") or {},
        "leaks": {s: m.get("leak_suspected") for s, m in sorted(memory.items()) if isinstance(m, dict)},
        "slo": d.get("slo"),
        "latency_histograms": None if run.hists is None else hists_to_json(run.hists),
        "report": d,
    }


def build_fleet(runs: Sequence[GpuRun], slo: SloConfig | None = None) -> dict[str, Any]:
    """The fleet JSON: merged figures and verdict, the worst GPU, one entry per GPU."""
    if not runs:
        raise FleetSourceError("a fleet report needs at least one state dir or JSON")
    for run in runs:
        _judge(run)
    notes = []
    requests: dict[str, int] = {}
    for run in runs:
        for k, v in (run.data.get("requests") or {}).items():
            requests[k] = requests.get(k, 0) + int(v)
    exact = all(r.hists is not None for r in runs)
    merged: Hists = merge_hists(r.hists for r in runs if r.hists is not None) if exact else {}
    latency: dict[str, Any] | None = {s: stage_summary(merged[s]) for s in _stage_order(merged)} if exact else None
    if not exact:
        missing = [r.name for r in runs if r.hists is None]
        notes.append(
            "no merged latency: no histograms in "
            + ", ".join(missing)
            + " (a summary or report JSON; give its state dir, or a fleet JSON)"
        )
    throughput = sum(float(r.data.get("throughput_rps") or 0.0) for r in runs)
    merged_doc: dict[str, Any] = {"requests": requests, "latency_ms": latency or {}, "throughput_rps": throughput}
    fleet_slo = None
    failed = [r.name for r in runs if not r.passed]
    if slo is not None:
        # The fleet as one service: every request of every GPU against the limits. Leaks and
        # throughput are per GPU (a fleet total would hide one slow or leaking GPU).
        merged_slo = SloConfig(
            p99_ms=slo.p99_ms, stage_p99_ms=dict(slo.stage_p99_ms), max_error_ratio=slo.max_error_ratio
        )
        fleet_slo = slo_block(merged_slo, merged_doc)
    passed = not failed and (fleet_slo is None or bool(fleet_slo["passed"]))
    bad = worst(runs)
    assert bad is not None
    by_model: dict[str, list[GpuRun]] = {}
    for run in runs:
        by_model.setdefault(str((run.data.get("run") or {}).get("device_name") or "unknown"), []).append(run)
    return {
        "fleet": {
            "gpus": len(runs),
            "passed": passed,
            "verdict": "pass" if passed else "FAIL",
            "failed_gpus": failed,
            "worst_gpu": {"name": bad.name, "passed": bad.passed, "reasons": bad.reasons, "p99_e2e_ms": bad.p99_e2e_ms},
            "merged_latency_exact": exact,
            "notes": notes,
        },
        "throughput_rps": round(throughput, 3),
        "requests": requests,
        "error_ratio": error_ratio(requests),
        "latency_ms": latency,
        "latency_histograms": hists_to_json(merged) if exact else None,
        "slo": fleet_slo,
        "by_device_name": {
            model: {
                "gpus": [r.name for r in group],
                "failed_gpus": [r.name for r in group if not r.passed],
                "throughput_rps": round(sum(float(r.data.get("throughput_rps") or 0.0) for r in group), 3),
                "latency_ms": (
                    {s: stage_summary(h) for s, h in merge_hists(r.hists for r in group if r.hists is not None).items()}
                    if all(r.hists is not None for r in group)
                    else None
                ),
            }
            for model, group in sorted(by_model.items())
        },
        "gpus": [gpu_entry(r) for r in runs],
    }


# --------------------------------------------------------------------------- Markdown


def _ms(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}"


def _latency_table(latency: dict[str, dict[str, Any]]) -> list[str]:
    out = ["| stage | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | requests |", "|---|---:|---:|---:|---:|---:|---:|"]
    for stage in _stage_order(latency):
        s = latency[stage]
        out.append(
            f"| {stage} | {_ms(s.get('p50'))} | {_ms(s.get('p90'))} | {_ms(s.get('p99'))} | "
            f"{_ms(s.get('p999'))} | {_ms(s.get('max'))} | {s.get('count', '-')} |"
        )
    return out


def render_fleet_markdown(fleet: dict[str, Any]) -> str:
    f = fleet["fleet"]
    w = f["worst_gpu"]
    lines = [f"# Fleet report: {f['gpus']} GPUs, verdict {f['verdict']}", ""]
    why = "; ".join(w["reasons"]) if w["reasons"] else f"passes, highest p99 e2e ({_ms(w['p99_e2e_ms'])} ms)"
    lines += [f"**Worst GPU: {w['name']}** ({why})", ""]
    if f["failed_gpus"]:
        lines += [f"Failed GPUs: {', '.join(f['failed_gpus'])}", ""]
    lines += [f"Note: {n}" for n in f["notes"]] + ([""] if f["notes"] else [])
    lines += [
        "## All GPUs merged",
        "",
        f"Throughput {fleet['throughput_rps']:.1f} req/s in all; requests "
        + ", ".join(f"{k} {v}" for k, v in fleet["requests"].items() if v),
        "",
    ]
    if fleet["latency_ms"]:
        lines += [*_latency_table(fleet["latency_ms"]), ""]
    if fleet.get("slo"):
        lines += ["| merged SLO check | observed | result |", "|---|---:|---|"]
        lines += [f"| {c['name']} | {c['observed']} | {c['status']} |" for c in fleet["slo"]["checks"]]
        lines.append("")
    lines += [
        "| GPU | device | verdict | req/s | p99 e2e ms | error ratio | leak suspected |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for g in fleet["gpus"]:
        er = "-" if g["error_ratio"] is None else f"{g['error_ratio']:.4g}"
        leaks = ", ".join(s for s, v in g["leaks"].items() if v) or "none"
        p99 = ((g["latency_ms"] or {}).get("e2e") or {}).get("p99")
        lines.append(
            f"| {g['name']} | {g['device_name'] or '-'} | {'pass' if g['passed'] else 'FAIL'} | "
            f"{float(g['throughput_rps'] or 0):.1f} | {_ms(p99)} | {er} | {leaks} |"
        )
    lines.append("")
    for g in fleet["gpus"]:
        verdict = "pass" if g["passed"] else "FAIL: " + "; ".join(g["reasons"])
        lines += [
            f"## {g['name']}: {verdict}",
            "",
            f"{g['device_name'] or 'unknown device'}, run {g['run_id']}, {g['source']}; "
            f"{float(g['throughput_rps'] or 0):.1f} req/s over {g['duration_seconds']} s",
            "",
        ]
        lines += [*_latency_table(g["latency_ms"] or {}), ""]
        if g["leaks"]:
            lines += ["| memory series | leak verdict |", "|---|---|"]
            lines += [f"| {s} | {_LEAK_WORDS.get(v, 'not judged')} |" for s, v in g["leaks"].items()]
            lines.append("")
    return "\n".join(lines)


_LEAK_WORDS = {True: "LEAK SUSPECTED", False: "no leak"}


# --------------------------------------------------------------------------- commands


def fleet_command(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``soakd report --fleet SRC...``: the fleet JSON (or Markdown); exit 1 when the fleet fails."""
    if ns.format == "html":
        raise SoakdError("--fleet: --format html is not available for a fleet (use json or md)")
    if ns.run_id:
        raise SoakdError("--fleet: --run-id names one run; a fleet reports each state dir's latest run")
    slo = load_config(ns.config).slo if ns.config else None
    fleet = build_fleet(load_sources(ns.fleet, slo), slo)
    if ns.format == "md":
        text = render_fleet_markdown(fleet)
    else:
        text = json.dumps(fleet, indent=2, allow_nan=False, default=str) + "\n"
    if ns.output:
        Path(ns.output).write_text(text, encoding="utf-8")
        print(f"report: {ns.output}", file=sys.stderr)
    else:
        (out or sys.stdout).write(text)
    w = fleet["fleet"]["worst_gpu"]
    print(
        f"fleet: {fleet['fleet']['gpus']} GPUs, verdict {fleet['fleet']['verdict']}; worst GPU {w['name']}"
        + (f" ({'; '.join(w['reasons'])})" if w["reasons"] else ""),
        file=sys.stderr,
    )
    return Exit.OK if fleet["fleet"]["passed"] else Exit.FAIL


def is_fleet(doc: dict[str, Any]) -> bool:
    return isinstance(doc.get("fleet"), dict) and isinstance(doc.get("gpus"), list)


def compare_fleets(
    a: dict[str, Any], b: dict[str, Any], cfg: CompareConfig, a_name: str, b_name: str, out: TextIO
) -> int:
    """Fleet B against fleet A: the merged figures, then each GPU matched by name (a
    StatefulSet's pods keep their names from one release's soak to the next)."""
    ga = {g["name"]: g for g in a["gpus"]}
    gb = {g["name"]: g for g in b["gpus"]}
    regressions: list[str] = []

    def top(doc: dict[str, Any]) -> dict[str, Any]:  # no merged percentiles: nothing to compare there
        return {**{k: v for k, v in doc.items() if k != "gpus"}, "latency_ms": doc.get("latency_ms") or {}}

    merged = Comparison(top(a), top(b), cfg).run()
    if len(ga) != len(gb):
        merged.warnings.append(f"fleets differ in size: {len(ga)} GPUs vs {len(gb)} (throughput is the sum)")
    print("== all GPUs merged", file=out)
    print_comparison(merged, a_name, b_name, out)
    regressions += [f"merged: {m}" for m in merged.regressions]
    for name in sorted(set(ga) & set(gb)):
        cmp = Comparison(ga[name]["report"], gb[name]["report"], cfg).run()
        print(f"\n== {name}", file=out)
        print_comparison(cmp, f"{a_name} [{name}]", f"{b_name} [{name}]", out)
        regressions += [f"{name}: {m}" for m in cmp.regressions]
    for name in sorted(set(ga) ^ set(gb)):
        print(f"warning: GPU {name} only in {a_name if name in ga else b_name}", file=out)
    print(f"\nfleet: {'regression: ' + ', '.join(regressions) if regressions else 'no regression'}", file=out)
    return Exit.FAIL if regressions else Exit.OK
