"""The run summary (``--summary-json``) built from what the session already holds, the status
line, and the summary as printed at the end."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TextIO

import msgspec
import numpy as np

from soakd.config import Config
from soakd.load.replay import ReplayLoop
from soakd.record.types import (
    BatchBucket,
    BatchSize,
    LlmBlock,
    Percentiles,
    ReplayBlock,
    RunRecord,
    ScheduleLag,
    TargetBlock,
    WindowRow,
)
from soakd.record.write import LLM_TIMINGS, hist_json, percentiles
from soakd.run.windows import Delta
from soakd.verdicts.memory import memory_block
from soakd.verdicts.slo import slo_block
from soakd.workload.replay import ReplaySource

if TYPE_CHECKING:
    from soakd.analysis.monitor import Verdict
    from soakd.load.engine import Engine, EngineStats
    from soakd.telemetry.catalogue import Metrics
    from soakd.telemetry.series import SeriesStore


def _fmt_ms(v: float) -> str:
    return "    -" if math.isnan(v) else f"{v:7.2f}"


def status_line(elapsed: float, win: Delta, stats: EngineStats, offline_rps: float | None = None) -> str:
    line = (
        f"[{elapsed:7.0f}s] {win.rps:9.1f} req/s  p50 {_fmt_ms(win.percentile_ms(0.5))} ms"
        f"  p99 {_fmt_ms(win.percentile_ms(0.99))} ms  errors {win.errors}  inflight {stats.inflight}"
        f"  queued {stats.queued}"
    )
    if offline_rps:
        line += f"  {win.rps / offline_rps:4.0%} of offline"
    if win.dropped:
        line += f"  dropped {win.dropped}"
    return line


def batch_buckets(metrics: Metrics) -> list[BatchBucket]:
    """Batches per ``soakd_batch_size`` bucket (not cumulative), up to the largest size seen."""
    cumulative: list[tuple[float, float]] = []
    for family in metrics.batch_size.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                cumulative.append((float(s.labels["le"]), s.value))
    cumulative.sort()
    out: list[BatchBucket] = []
    prev = 0.0
    for le, value in cumulative:
        n = int(value - prev)
        prev = value
        if math.isinf(le):  # beyond the largest bound: fold into it (JSON has no infinity)
            if n and out:
                out[-1].count += n
            continue
        out.append(BatchBucket(le=le, count=n))
    while out and out[-1].count == 0:
        out.pop()
    return out


def live_verdicts(verdicts: dict[str, Verdict]) -> dict[str, dict[str, Any]]:
    """The leak monitor's verdicts as the summary's memory section and /status take them."""
    return {series: v.as_dict() for series, v in verdicts.items()}


def llm_block(metrics: Metrics, elapsed: float) -> LlmBlock:
    """The summary's ``llm`` block, read from the stream metrics the target recorded (one place
    for the fact: the /metrics histograms and this block are the same counts)."""

    def count(name: str, labels: dict[str, str] | None = None) -> int:
        return int(metrics.registry.get_sample_value(name, labels or {}) or 0)

    out_tokens = count("soakd_tokens_total", {"kind": "output"})
    goodput = count("soakd_goodput_requests_total")
    snaps = {"ttft": metrics.ttft.labels("").snapshot(), "itl": metrics.itl.labels("").snapshot()}
    snaps["tpot"] = metrics.tpot.labels("").snapshot()
    return LlmBlock(
        ttft_ms=percentiles(snaps["ttft"]),
        itl_ms=percentiles(snaps["itl"]),
        tpot_ms=percentiles(snaps["tpot"]),
        input_tokens=count("soakd_tokens_total", {"kind": "input"}),
        output_tokens=out_tokens,
        output_tokens_per_second=round(out_tokens / elapsed, 3),
        goodput_requests=goodput,
        goodput_rps=round(goodput / elapsed, 3),
        # the buckets themselves, so that drivers' timings merge exactly (soakd report --merge)
        histograms={name: hist_json(snap) for name, snap in snaps.items() if snap.count},
    )


def build_summary(
    cfg: Config,
    engine: Engine,
    stats: EngineStats,
    *,
    run: dict[str, Any],
    cold: dict[str, Any],
    windows: list[WindowRow],
    series: SeriesStore | None,
    verdicts: dict[str, Verdict],
    metrics: Metrics,
    elapsed_before: float = 0.0,
    offline: dict[str, Any] | None = None,
    target: dict[str, Any] | None = None,
) -> RunRecord:
    """The run's record, built field by field (the record type fixes the order keys are written
    in). The blocks that come from below the record's layer (the engine's batch figures, the
    replay loop's, the target's) arrive as mappings and are converted here, at that boundary."""
    completed = stats.completed
    batch = msgspec.convert(engine.batch_size_summary(), BatchSize)
    batch.buckets = batch_buckets(metrics)
    record = RunRecord(
        throughput_rps=round(completed.get("ok", 0) / stats.elapsed, 3),
        duration_seconds=round(stats.elapsed, 3),
        requests=completed,
        latency_ms={s: percentiles(h) for s, h in stats.stages.items() if h.count or s == "e2e"},
        batch_size=batch,
        input_shapes_seen=engine.shapes_seen,
        cold_start=cold,
        run=run,
        windows=windows,
        # A resumed run: earlier segments count toward the minimum duration.
        run_duration_seconds=round(elapsed_before + stats.elapsed, 3),
    )
    if engine.open_loop:
        lag = percentiles(stats.lag)
        record.schedule_lag_ms = ScheduleLag(p50=lag.p50, p99=lag.p99, max=lag.max)
        sent = sum(completed.values()) + stats.inflight
        record.offered_rps = round(sent / stats.elapsed, 3)
    if isinstance(engine.executor, ReplayLoop):
        replay = msgspec.convert(engine.executor.summary(stats.elapsed), ReplayBlock)
        if isinstance(engine.source, ReplaySource):
            replay.rows_clipped = engine.source.clipped
        record.replay = replay
    if offline is not None:
        record.model_offline = dict(offline)
        if stats.model_seconds > 0:  # soakd's own per-batch work on the model threads, against the model's
            record.model_offline["harness_overhead_ratio"] = round(stats.overhead_seconds / stats.model_seconds, 4)
    if cfg.target.url is not None and cfg.target.api == "openai":
        record.llm = llm_block(metrics, stats.elapsed)
    if target is not None:  # a served model: where it was, how it answered, how long it was down
        record.target = msgspec.convert(target, TargetBlock)
    samples = {name: series.read(name) for name in series.names()} if series is not None else {}
    record.memory = memory_block({k: v for k, v in samples.items() if np.size(v[0])}, cfg.leak, live_verdicts(verdicts))
    record.slo = slo_block(cfg.slo, record)
    return record


def print_summary(summary: RunRecord, out: TextIO) -> None:
    print(
        f"\nsoakd summary: {summary.throughput_rps or 0.0:.1f} req/s over {summary.duration_seconds or 0.0:.1f}s, "
        f"requests {', '.join(f'{k}={v}' for k, v in summary.requests.items() if v)}",
        file=out,
    )
    if isinstance(summary.offered_rps, int | float):
        achieved = summary.throughput_rps or 0.0
        print(f"  offered {summary.offered_rps:.1f} req/s, achieved {achieved:.1f} req/s", file=out)
    off = summary.model_offline
    if off and off.get("rps"):
        line = f"  model alone at batch {off['batch_size']}: {off['rps']:.1f} req/s"
        line += f" (achieved/offline {off['achieved_ratio']:.2f})"
        if "harness_overhead_ratio" in off:
            line += f"; soakd's own per-batch work {100 * off['harness_overhead_ratio']:.1f}% of the model's time"
        print(line, file=out)
    print(f"  {'stage':<12}{'p50':>10}{'p90':>10}{'p99':>10}{'p99.9':>10}{'max':>10}  (ms)", file=out)
    for stage, s in summary.latency_ms.items():
        cells = "".join(f"{_nan(v):10.2f}" for v in (s.p50, s.p90, s.p99, s.p999, s.max))
        print(f"  {stage:<12}{cells}", file=out)
    lag = summary.schedule_lag_ms
    if not isinstance(lag, msgspec.UnsetType):
        print(f"  schedule lag p50 {lag.p50} ms, p99 {lag.p99} ms, max {lag.max} ms", file=out)
    b = summary.batch_size
    if isinstance(b, BatchSize) and b.batches:  # a served model batches on the server: soakd formed none
        print(f"  batch size mean {_nan(b.mean):.2f}, max {_nan(b.max):.0f} over {b.batches} batches", file=out)
    llm = summary.llm_block
    if llm is not None:
        cells = ", ".join(
            f"{name} p50 {_ms(timing, 'p50')} ms p99 {_ms(timing, 'p99')} ms"
            for name, timing in zip((n for n, _ in LLM_TIMINGS), (llm.ttft_ms, llm.itl_ms, llm.tpot_ms), strict=True)
        )
        print(
            f"  {cells}; tokens in {llm.input_tokens}, out {llm.output_tokens} "
            f"({_nan(llm.output_tokens_per_second):.1f}/s); goodput {_nan(llm.goodput_rps):.2f} req/s",
            file=out,
        )
    tg = summary.target_block
    if tg is not None:
        print(
            f"  target {tg.url}: down {_nan(tg.down_seconds):.1f}s in {tg.outages} outage(s); responses "
            + ", ".join(f"{k}={v}" for k, v in tg.responses.items() if v),
            file=out,
        )


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def _ms(timing: Percentiles | None, q: str) -> str:
    v = None if timing is None else (timing.p50 if q == "p50" else timing.p99)
    return "-" if v is None else f"{v:.2f}"
