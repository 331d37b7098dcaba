"""What a sweep's steps add up to: each step's figures from its last three windows, its
bottleneck and error gate, the knee, the recommendation, and the table printed at the end."""

from __future__ import annotations

import itertools
import math
from typing import Any, TextIO

from soakd.config import SloConfig
from soakd.run.sweep.step import Mark, StepResult
from soakd.telemetry.histogram import HistSnapshot
from soakd.verdicts.slo import error_bound, error_ratio

BUSY = 0.85  # a stage busier than this share of the time is the bottleneck
KNEE_MIN_P99_RISE = 0.2  # a sharp rise: p99 up at least 20% ...
KNEE_RATIO = 2.0  # ... and over twice the relative throughput gain


def _ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1e3, 3)


def _stage_mean(a: Mark, b: Mark, stage: str) -> float:
    if stage not in b.stats.stages:
        return 0.0
    before = a.stats.stages.get(stage, HistSnapshot.empty())
    mean = (b.stats.stages[stage] - before).mean()
    return 0.0 if math.isnan(mean) else mean


def bottleneck(pre_busy: float, model_busy: float, means: dict[str, float]) -> str:
    """preprocess-bound | model-bound | queueing (| postprocess-bound): what limits the step."""
    if pre_busy >= BUSY:
        return "preprocess-bound"
    if model_busy >= BUSY:
        return "model-bound"
    names = {
        "preprocess": "preprocess-bound",
        "queue": "queueing",
        "inference": "model-bound",
        "postprocess": "postprocess-bound",
    }
    return names[max(names, key=lambda s: means.get(s, 0.0))]


def step_figures(index: int, r: StepResult) -> dict[str, Any]:
    a, b = r.marks[max(0, len(r.marks) - 4)], r.marks[-1]  # the last three windows
    dt = max(1e-9, b.t - a.t)
    ok = b.stats.completed.get("ok", 0) - a.stats.completed.get("ok", 0)
    e2e = b.stats.stages["e2e"] - a.stats.stages["e2e"]
    batches = b.batch_count - a.batch_count
    mean_batch = (b.batch_sum - a.batch_sum) / batches if batches else 0.0
    means = {s: _stage_mean(a, b, s) for s in ("preprocess", "queue", "inference", "postprocess")}
    # The inference histogram holds each batch's time once per request in it; per batch that
    # is its sum divided by the mean batch size (exact when time does not depend on size).
    inf = b.stats.stages["inference"] - a.stats.stages["inference"]
    model_busy = (inf.total / mean_batch) / dt if mean_batch else 0.0
    pre_busy = (b.pre_busy - a.pre_busy) / (dt * r.workers)
    requests = {k: v - r.marks[0].stats.completed.get(k, 0) for k, v in b.stats.completed.items()}
    out: dict[str, Any] = {"index": index, **r.settings}
    out.update(
        {
            "duration_seconds": round(b.t - r.marks[0].t, 3),
            "throughput_rps": round(ok / dt, 3),
            "p50_ms": _ms(e2e.percentile(0.5)),
            "p90_ms": _ms(e2e.percentile(0.9)),
            "p99_ms": _ms(e2e.percentile(0.99)),
            "mean_batch_size": round(mean_batch, 3),
            "peak_host_rss_bytes": r.peak_rss,
            "peak_gpu_memory_bytes": r.peak_gpu,
            "stable": r.stable,
            "bottleneck": bottleneck(pre_busy, model_busy, means),
            "stage_mean_ms": {s: round(v * 1e3, 4) for s, v in means.items() if v > 0},
            "model_busy_ratio": round(min(1.0, model_busy), 4),
            "preprocess_busy_ratio": round(min(1.0, pre_busy), 4) if "preprocess" in b.stats.stages else None,
            "requests": {k: v for k, v in requests.items() if v},
            "error_ratio": error_ratio(requests),
        }
    )
    if "rate" in r.settings or "replay_speed" in r.settings:  # an open loop: what arrived, beside what was served
        out["offered_rps"] = round((_arrived(b) - _arrived(a)) / dt, 3)
    return out


def _arrived(m: Mark) -> int:
    """Requests that had arrived by the mark: finished (dropped included) or in flight."""
    return sum(m.stats.completed.values()) + m.stats.inflight


def judge_errors(steps: list[dict[str, Any]], slo: SloConfig) -> None:
    """Each step's ``error_gate``: pass or FAIL against the error bound in force (the default 1%
    without ``[slo] max_error_ratio``); a step that measured nothing fails. A failing step is
    never recommended."""
    bound = error_bound(slo)
    for s in steps:
        ratio = s["error_ratio"]
        s["error_gate"] = None if bound is None else "pass" if ratio is not None and ratio <= bound[1] else "FAIL"


def find_knee(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last step before p99 first rises sharply (>= 20% and over twice the relative
    throughput gain) from one step to the next, in the given order; None if it never does."""
    for a, b in itertools.pairwise(steps):
        if not a["p99_ms"] or not b["p99_ms"] or not a["throughput_rps"]:
            continue
        p99_gain = b["p99_ms"] / a["p99_ms"] - 1
        thr_gain = b["throughput_rps"] / a["throughput_rps"] - 1
        if p99_gain >= KNEE_MIN_P99_RISE and p99_gain > KNEE_RATIO * max(thr_gain, 0.0):
            return {
                **_brief(a),
                "next_p99_rise_pct": round(100 * p99_gain, 1),
                "next_throughput_gain_pct": round(100 * thr_gain, 1),
            }
    return None


def _brief(step: dict[str, Any]) -> dict[str, Any]:
    keys = ("index", "concurrency", "rate", "replay_speed", "max_batch_size", "throughput_rps", "p99_ms", "stable")
    return {k: step[k] for k in keys if k in step}


def recommend(
    steps: list[dict[str, Any]], slo_p99_ms: float | None, knee: dict[str, Any] | None, *, prefer_stable: bool = True
) -> dict[str, Any] | None:
    """Highest throughput whose p99 meets the SLO; no SLO: the knee.

    ``prefer_stable``: a step that never settled within --max-step is only chosen when no stable
    one meets the SLO. Fixed-duration steps are too short for that to mean much, so there the
    fastest step wins and is only flagged."""
    steps = [s for s in steps if s.get("error_gate") != "FAIL"]
    if not steps:
        return None
    if slo_p99_ms is None:
        if knee is not None and any(s["index"] == knee["index"] for s in steps):
            return {**knee, "reason": "no SLO given: the knee"}
        best = max(steps, key=lambda s: s["throughput_rps"])
        return {**_brief(best), "reason": "no SLO given and no knee: the highest throughput"}
    meeting = [s for s in steps if s["p99_ms"] is not None and s["p99_ms"] <= slo_p99_ms]
    if not meeting:
        return None
    stable = [s for s in meeting if s["stable"]] if prefer_stable else []
    best = max(stable or meeting, key=lambda s: s["throughput_rps"])
    reason = f"highest throughput with p99 <= {slo_p99_ms} ms"
    if not best["stable"]:
        reason += " (an unstable step: its figures moved by more than the tolerance)"
    return {**_brief(best), "slo_p99_ms": slo_p99_ms, "reason": reason}


def _cell(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_table(result: dict[str, Any], out: TextIO) -> None:
    mode = result["mode"]
    head = (
        f"{'step':>4} {mode[:4]:>7} {'mbs':>4} {'req/s':>10} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} "
        f"{'batch':>6} {'rss MiB':>8} {'gpu MiB':>8} {'stable':>6}  bottleneck"
    )
    print(head, file=out)
    for s in result["steps"]:
        gpu = None if s["peak_gpu_memory_bytes"] is None else s["peak_gpu_memory_bytes"] / 2**20
        print(
            f"{s['index']:>4} {s[mode]:>7g} {s['max_batch_size']:>4} {s['throughput_rps']:>10.1f} "
            f"{_cell(s['p50_ms'], '9.2f')} {_cell(s['p90_ms'], '9.2f')} {_cell(s['p99_ms'], '9.2f')} "
            f"{s['mean_batch_size']:>6.2f} {s['peak_host_rss_bytes'] / 2**20:>8.0f} {_cell(gpu, '8.0f'):>8} "
            f"{'yes' if s['stable'] else 'NO':>6}  {s['bottleneck']}{_error_note(s)}",
            file=out,
        )
    knee, rec = result["knee"], result["recommendation"]
    print(f"knee: {_describe(knee, mode) if knee else 'none (p99 never rose sharply)'}", file=out)
    if rec is not None:
        print(f"recommendation: {_describe(rec, mode)} — {rec['reason']}", file=out)
    elif result["slo_p99_ms"] is not None:
        print(f"recommendation: none — no step met p99 <= {result['slo_p99_ms']} ms and the error gate", file=out)
    else:
        print("recommendation: none — every step failed the error gate", file=out)


def _error_note(step: dict[str, Any]) -> str:
    if step.get("error_gate") != "FAIL":
        return ""
    ratio = step["error_ratio"]
    return "  (nothing measured: error gate FAIL)" if ratio is None else f"  ({ratio:.1%} not ok: error gate FAIL)"


def _describe(s: dict[str, Any], mode: str) -> str:
    return (
        f"step {s['index']} ({mode} {s[mode]:g}, max batch {s['max_batch_size']}): "
        f"{s['throughput_rps']:.1f} req/s, p99 {_cell(s['p99_ms'], '.2f')} ms"
    )
