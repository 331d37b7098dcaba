"""``soakd sweep``: step through load settings and find the batching trade-off.

The model is loaded and warmed up once; each step then runs its own Engine (concurrency or
rate x max batch size) until it is stable, i.e. throughput and p99 of the last three windows
are each within ``--tolerance`` percent of their mean, after ``--min-step`` and at most
``--max-step`` (or for a fixed ``--step-duration``). A step that never settles is kept and
marked ``stable: false``. Each step's figures come from its last three windows.

Then the knee (where p99 rises sharply for little throughput) and the recommendation: the
step with the highest throughput whose p99 meets the SLO (goodput under the SLO). Exit 1 when
an SLO is given and no step meets it.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import psutil
import torch

from soakd.config import Config, ConfigError, SloConfig, parse_duration
from soakd.load.engine import Engine, EngineStats
from soakd.models.loader import LoadedModel
from soakd.report.slo import error_bound, error_ratio
from soakd.run import steps as shared
from soakd.run.stop import StopFlag
from soakd.summary import write_json_atomic
from soakd.targets.base import AnyTarget
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.histogram import HistSnapshot
from soakd.workload.sources import RequestSource

log = logging.getLogger("soakd.sweep")

BUSY = 0.85  # a stage busier than this share of the time is the bottleneck
KNEE_MIN_P99_RISE = 0.2  # a sharp rise: p99 up at least 20% ...
KNEE_RATIO = 2.0  # ... and over twice the relative throughput gain
_POLL_S = 0.1


@dataclass
class SweepPlan:
    mode: str  # "concurrency" or "rate"
    steps: list[dict[str, Any]]  # each {"concurrency" | "rate": v, "max_batch_size": b}
    step_duration: float | None
    window: float
    min_step: float
    max_step: float
    tolerance: float  # fraction
    slo_p99_ms: float | None
    one_axis: bool = True  # one load value or one batch size (or load tied to batch size, 2x)


def _parse_list(text: str | None, flag: str, kind: Callable[[str], Any]) -> list[Any] | None:
    if text is None:
        return None
    values: list[Any] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            v = kind(part)
        except ValueError:
            example = "1,4,8 or 2x" if kind is _Concurrency else "1,4,8"
            raise ConfigError(f"{flag}: cannot parse {part!r} in {text!r} (expected e.g. {example})") from None
        if (v.value if isinstance(v, _Concurrency) else v) <= 0:
            raise ConfigError(f"{flag}: values must be > 0, got {part!r}")
        values.append(v)
    if not values:
        raise ConfigError(f"{flag}: empty list")
    return values


class _Concurrency:
    """A --concurrency item: ``16`` requests in flight, or ``2x``: twice each step's max batch
    size, so every batch size is fed the same way (the seed article's batch-size table)."""

    def __init__(self, text: str) -> None:
        self.per_batch = text.endswith("x")
        self.value = float(text[:-1]) if self.per_batch else int(text)

    def of(self, max_batch_size: int) -> int:
        return max(1, round(self.value * max_batch_size)) if self.per_batch else int(self.value)


def _duration_arg(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if seconds <= 0:
        raise ConfigError(f"{flag}: must be > 0, got {text!r}")
    return seconds


def plan(cfg: Config, ns: argparse.Namespace) -> SweepPlan:
    """The steps a sweep runs, from its flags (the config's own settings fill a missing axis)."""
    conc = _parse_list(ns.sweep_concurrency, "--concurrency", _Concurrency)
    rate = _parse_list(ns.sweep_rate, "--rate", float)
    batch = _parse_list(ns.sweep_max_batch_size, "--max-batch-size", int) or [cfg.batcher.max_batch_size]
    if conc and rate:
        raise ConfigError("--concurrency and --rate: sweep one load mode (closed or open loop), not both")
    if rate or (not conc and cfg.load.open_loop):
        mode, loads = "rate", rate or [cfg.load.rate]
    else:
        mode, loads = "concurrency", conc or [_Concurrency(str(cfg.load.concurrency or 8))]
    steps = [
        {mode: load.of(b) if isinstance(load, _Concurrency) else load, "max_batch_size": b}
        for load, b in itertools.product(loads, batch)
    ]
    tol = float(getattr(ns, "stability_tolerance", 10.0))
    if not 0 < tol < 100:
        raise ConfigError(f"--tolerance: expected a percentage in (0, 100), got {tol}")
    fixed = _duration_arg(ns.step_duration, "--step-duration") if ns.step_duration else None
    window = _duration_arg(getattr(ns, "sweep_window", "2s"), "--window")
    if fixed is not None:
        window = min(window, fixed / 4)  # a first window to discard, then three to measure
    min_step = _duration_arg(getattr(ns, "min_step", "10s"), "--min-step")
    max_step = _duration_arg(getattr(ns, "max_step", "60s"), "--max-step")
    if max_step < min_step:
        raise ConfigError(f"--max-step: must be >= --min-step ({min_step}s), got {max_step}s")
    slo = ns.slo_p99_ms if ns.slo_p99_ms is not None else cfg.slo.p99_ms
    return SweepPlan(
        mode,
        steps,
        fixed,
        window,
        max(min_step, 4 * window),
        max(max_step, 4 * window),
        tol / 100.0,
        slo,
        one_axis=len(loads) == 1 or len(batch) == 1,
    )


def step_config(cfg: Config, step: dict[str, Any]) -> Config:
    c = copy.deepcopy(cfg)
    c.load.concurrency = step.get("concurrency")
    c.load.rate = step.get("rate")
    c.load.duration = None
    c.batcher.max_batch_size = step["max_batch_size"]
    return c


# --------------------------------------------------------------------------- one step


@dataclass
class Mark:
    """The engine's cumulative state at a window boundary."""

    t: float
    stats: EngineStats
    batch_sum: float
    batch_count: float
    pre_busy: float


@dataclass
class StepResult:
    settings: dict[str, Any]
    marks: list[Mark] = field(default_factory=list)
    peak_rss: int = 0
    peak_gpu: int | None = None
    stable: bool = False
    workers: int = 1


def _mark(engine: Engine, metrics: Metrics) -> Mark:
    pool = engine.preprocess_pool
    # Sum and count from one collect() of the batch-size histogram, so they describe the same batches.
    samples = {s.name: s.value for family in metrics.batch_size.collect() for s in family.samples}
    return Mark(
        t=time.perf_counter(),
        stats=engine.stats(),
        batch_sum=samples.get("soakd_batch_size_sum", 0.0),
        batch_count=samples.get("soakd_batch_size_count", 0.0),
        pre_busy=pool.busy_seconds() if pool is not None else 0.0,
    )


def _window_figures(a: Mark, b: Mark) -> tuple[float, float]:
    dt = max(1e-9, b.t - a.t)
    ok = b.stats.completed.get("ok", 0) - a.stats.completed.get("ok", 0)
    p99 = (b.stats.stages["e2e"] - a.stats.stages["e2e"]).percentile(0.99)
    return ok / dt, p99


def is_stable(marks: list[Mark], tolerance: float) -> bool:
    """Throughput and p99 of the last three windows each within ``tolerance`` of their mean."""
    if len(marks) < 4:
        return False
    figures = [_window_figures(a, b) for a, b in itertools.pairwise(marks[-4:])]
    for series in zip(*figures, strict=True):
        if any(math.isnan(v) for v in series) or min(series) <= 0:
            return False
        mean = sum(series) / len(series)
        if (max(series) - min(series)) / mean > tolerance:
            return False
    return True


@dataclass
class SweepTarget:
    """What every step drives: an in-process model (``model`` set) or a served one."""

    target: AnyTarget
    source: Callable[[Config], RequestSource]  # a step's request source, from its config
    model: LoadedModel | None = None

    @property
    def cuda(self) -> bool:
        return self.model is not None and self.model.device.type == "cuda"


def run_step(st: SweepTarget, cfg: Config, sweep: SweepPlan, settings: dict[str, Any]) -> StepResult:
    step_cfg = step_config(cfg, settings)
    metrics = Metrics()
    engine = Engine(st.target, st.source(step_cfg), step_cfg, metrics)
    result = StepResult(settings, workers=step_cfg.input.preprocess_workers)
    cuda = st.cuda
    model = st.model
    if cuda and model is not None:
        # Give back what earlier steps cached, so each step's peak is what its own batches need.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(model.device)
    proc = psutil.Process()
    engine.start()
    result.marks.append(_mark(engine, metrics))
    start = result.marks[0].t
    next_mark = start + sweep.window
    try:
        while True:
            now = time.perf_counter()
            result.peak_rss = max(result.peak_rss, proc.memory_info().rss)
            if now < next_mark:
                time.sleep(min(_POLL_S, next_mark - now))
                continue
            result.marks.append(_mark(engine, metrics))
            next_mark += sweep.window
            elapsed = result.marks[-1].t - start
            if sweep.step_duration is not None:
                done = elapsed >= sweep.step_duration - 1e-3
            else:
                settled = elapsed >= sweep.min_step and is_stable(result.marks, sweep.tolerance)
                done = settled or elapsed >= sweep.max_step
            if done:
                break
    finally:
        drained = engine.stop(drain_timeout=min(cfg.load.drain_timeout, 10.0))
    if not drained:
        log.warning("step %s: drain timed out with %d requests in flight", settings, engine.inflight)
    result.stable = is_stable(result.marks, sweep.tolerance)
    if cuda and model is not None:
        result.peak_gpu = int(torch.cuda.max_memory_reserved(model.device))
    return result


# --------------------------------------------------------------------------- figures


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
    return out


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
    keys = ("index", "concurrency", "rate", "max_batch_size", "throughput_rps", "p99_ms", "stable")
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


# --------------------------------------------------------------------------- output


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


def sweep_command(cfg: Config, ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Load (or connect) and warm up once (the run session's own steps), then each step on the
    same target."""
    sweep = plan(cfg, ns)
    if cfg.target.url is not None:
        return _sweep_network(cfg, ns, sweep, out)
    shared.demo_allocator(cfg)  # before the model's threads start
    model, target = shared.load_target(cfg)
    try:
        biggest = max(s["max_batch_size"] for s in sweep.steps)
        warm = shared.warm_up(cfg, target, shared.request_source(cfg, model), biggest, StopFlag().event)
        st = SweepTarget(target, lambda c: shared.request_source(c, model), model)
        return _sweep(cfg, ns, sweep, st, shared.cold_start(model, warm, cfg.model.warmup), out)
    finally:
        target.close()


def _sweep_network(cfg: Config, ns: argparse.Namespace, sweep: SweepPlan, out: TextIO) -> int:
    """A served model: the server batches, so only the load is swept; one client for all steps,
    its pool sized for the largest step."""
    if len({s["max_batch_size"] for s in sweep.steps}) > 1:
        raise ConfigError("--max-batch-size: a served model batches on the server; sweep --concurrency or --rate")
    early = shared.read_inputs(cfg)
    opened = copy.deepcopy(cfg)
    if sweep.mode == "concurrency":
        opened.load.concurrency = max(int(s["concurrency"]) for s in sweep.steps)
        opened.load.rate = None
    target, connect_s = shared.open_network_target(opened, Metrics())
    try:
        source = shared.network_source(cfg, target, early)
        warm = shared.warm_up_target(cfg, target, source, StopFlag().event)
        st = SweepTarget(target, lambda _c: source)
        return _sweep(cfg, ns, sweep, st, shared.target_cold_start(connect_s, warm, cfg.model.warmup), out)
    finally:
        target.close()


def _sweep(
    cfg: Config, ns: argparse.Namespace, sweep: SweepPlan, st: SweepTarget, cold: dict[str, Any], out: TextIO
) -> int:
    how = (
        f"{sweep.step_duration:g}s each"
        if sweep.step_duration is not None
        else f"until stable within {100 * sweep.tolerance:g}% ({sweep.min_step:g}-{sweep.max_step:g}s)"
    )
    log.info("sweep: %d steps over %s and max batch size, %s", len(sweep.steps), sweep.mode, how)

    steps: list[dict[str, Any]] = []
    for i, settings in enumerate(sweep.steps):
        try:
            figures = step_figures(i, run_step(st, cfg, sweep, settings))
        except KeyboardInterrupt:
            log.warning("interrupted: reporting the %d step(s) that finished", len(steps))
            break
        steps.append(figures)
        log.info(
            "step %d %s: %.1f req/s, p99 %s ms, %s%s",
            i,
            settings,
            figures["throughput_rps"],
            figures["p99_ms"],
            figures["bottleneck"],
            "" if figures["stable"] else " (unstable)",
        )
    if not steps:
        return 130  # interrupted before any step finished (128 + SIGINT)
    judge_errors(steps, cfg.slo)
    knee = find_knee(steps if sweep.one_axis else sorted(steps, key=lambda s: s["throughput_rps"]))
    rec = recommend(steps, sweep.slo_p99_ms, knee, prefer_stable=sweep.step_duration is None)
    run_id = shared.new_run_id()
    run_fp = (
        shared.run_fingerprint(cfg, run_id, st.model)
        if st.model is not None
        else shared.target_fingerprint(cfg, run_id)
    )
    result = {
        "mode": sweep.mode,
        "slo_p99_ms": sweep.slo_p99_ms,
        "step_duration_seconds": sweep.step_duration,
        "stability_tolerance_pct": round(100 * sweep.tolerance, 3),
        "steps": steps,
        "knee": knee,
        "recommendation": rec,
        "cold_start": cold,
        "run": run_fp,
    }
    if ns.json_out:
        write_json_atomic(ns.json_out, result)
        log.info("sweep written to %s", ns.json_out)
    print_table(result, out)
    return 1 if rec is None else 0
