"""``soakd run``: load, warm up, drive load, report live, stop cleanly, write the summary."""

from __future__ import annotations

import json
import logging
import math
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

import torch

import soakd
from soakd.analysis.monitor import monitor_for_run
from soakd.config import Config
from soakd.daemon import Daemon, Notifier
from soakd.endpoints import EndpointServer
from soakd.fingerprint import fingerprint
from soakd.load.engine import Engine, EngineStats
from soakd.models.loader import LoadedModel, load_model
from soakd.report.finish import complete_summary, conclude
from soakd.report.windows import WindowRecorder
from soakd.summary import stage_summary, write_json_atomic
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.histogram import HistSnapshot
from soakd.telemetry.series import SeriesStore
from soakd.telemetry.telemetry import Telemetry
from soakd.workload.sources import RequestSource, build_source

log = logging.getLogger("soakd")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


@dataclass
class Window:
    """Rate and percentiles between two reads of the engine (for status lines and /status)."""

    rps: float = 0.0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    errors: int = 0
    dropped: int = 0


@dataclass
class WindowTracker:
    prev_time: float = 0.0
    prev_counts: dict[str, int] = field(default_factory=dict)
    prev_e2e: HistSnapshot = field(default_factory=HistSnapshot.empty)

    def advance(self, stats: EngineStats) -> Window:
        dt = max(1e-9, stats.elapsed - self.prev_time)
        delta = {k: v - self.prev_counts.get(k, 0) for k, v in stats.completed.items()}
        e2e = stats.stages["e2e"]
        win = e2e - self.prev_e2e
        self.prev_time, self.prev_counts, self.prev_e2e = stats.elapsed, dict(stats.completed), e2e
        return Window(
            rps=delta.get("ok", 0) / dt,
            p50_ms=win.percentile(0.5) * 1e3,
            p99_ms=win.percentile(0.99) * 1e3,
            errors=sum(v for k, v in delta.items() if k not in ("ok", "dropped")),
            dropped=delta.get("dropped", 0),
        )


def warm_up(model: LoadedModel, source: RequestSource, runs: int, max_batch: int) -> tuple[float, float]:
    """Run the model ``runs`` times (cycling shapes, batch sizes 1 and max) outside measurement.

    Returns (first inference seconds, total warmup seconds). The first call is timed on its
    own: kernel selection, lazy init and allocator growth make it the cold-start outlier.
    """
    inputs = source.warmup_inputs()
    cuda = model.device.type == "cuda"
    t0 = time.perf_counter()
    first = 0.0
    with torch.inference_mode():
        for i in range(max(runs, 1)):
            _, tensor = inputs[i % len(inputs)]
            size = max_batch if (i // len(inputs)) % 2 else 1
            x = tensor.unsqueeze(0).expand(size, *tensor.shape).contiguous().to(model.device)
            model.fn(x)
            if cuda:
                torch.cuda.synchronize(model.device)
            if i == 0:
                first = time.perf_counter() - t0
    return first, time.perf_counter() - t0


def _fmt_ms(v: float) -> str:
    return "    -" if math.isnan(v) else f"{v:7.2f}"


def status_line(elapsed: float, win: Window, stats: EngineStats) -> str:
    line = (
        f"[{elapsed:7.0f}s] {win.rps:9.1f} req/s  p50 {_fmt_ms(win.p50_ms)} ms  p99 {_fmt_ms(win.p99_ms)} ms"
        f"  errors {win.errors}  inflight {stats.inflight}  queued {stats.queued}"
    )
    if win.dropped:
        line += f"  dropped {win.dropped}"
    return line


def build_summary(engine: Engine, stats: EngineStats, run: dict[str, Any], cold: dict[str, float]) -> dict[str, Any]:
    completed = stats.completed
    summary: dict[str, Any] = {
        "throughput_rps": round(completed.get("ok", 0) / stats.elapsed, 3),
        "duration_seconds": round(stats.elapsed, 3),
        "requests": completed,
        "latency_ms": {s: stage_summary(h) for s, h in stats.stages.items() if h.count or s == "e2e"},
        "batch_size": engine.batch_size_summary(),
        "input_shapes_seen": engine.shapes_seen,
        "cold_start": cold,
        "run": run,
    }
    if engine.open_loop:
        lag = stage_summary(stats.lag)
        summary["schedule_lag_ms"] = {"p50": lag["p50"], "p99": lag["p99"], "max": lag["max"]}
        sent = sum(v for k, v in completed.items()) + stats.inflight
        summary["offered_rps"] = round(sent / stats.elapsed, 3)
    return summary


def print_summary(summary: dict[str, Any], out: TextIO) -> None:
    req = summary["requests"]
    print(f"\nsoakd summary: {summary['throughput_rps']:.1f} req/s over {summary['duration_seconds']:.1f}s, "
          f"requests {', '.join(f'{k}={v}' for k, v in req.items() if v)}", file=out)
    print(f"  {'stage':<12}{'p50':>10}{'p90':>10}{'p99':>10}{'p99.9':>10}{'max':>10}  (ms)", file=out)
    for stage, s in summary["latency_ms"].items():
        cells = "".join(
            f"{(s[k] if s[k] is not None else float('nan')):10.2f}" for k in ("p50", "p90", "p99", "p999", "max")
        )
        print(f"  {stage:<12}{cells}", file=out)
    if "schedule_lag_ms" in summary:
        lag = summary["schedule_lag_ms"]
        print(f"  schedule lag p50 {lag['p50']} ms, p99 {lag['p99']} ms, max {lag['max']} ms", file=out)
    b = summary["batch_size"]
    print(f"  batch size mean {b['mean']:.2f}, max {b['max']:.0f} over {b['batches']} batches", file=out)


class StopFlag:
    """Set by SIGINT/SIGTERM; the run loop polls it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None

    def install(self) -> Callable[[], None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.signal = signum
            self.event.set()

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


def run(cfg: Config, *, out: TextIO = sys.stdout, stop: StopFlag | None = None) -> int:
    """Run a soak per ``cfg``; returns the process exit code."""
    metrics = Metrics()
    metrics.build_info.labels(soakd.__version__).set(1)
    metrics.phase_info.labels("loading").set(1)
    server = EndpointServer(cfg.metrics.addr, metrics.registry)
    server.start()
    log.info("serving metrics on http://%s/metrics", server.address)
    stop = stop or StopFlag()
    restore = stop.install() if threading.current_thread() is threading.main_thread() else (lambda: None)
    daemon: Daemon | None = None
    try:
        # State dir (a corrupt or locked file is moved aside), run id (resumed under systemd),
        # sd_notify, /healthz and /status, the log file and SIGHUP.
        daemon = Daemon.open(cfg, metrics, new_run_id, lambda p: _set_phase(metrics, p))
        server.health, server.status = daemon.health, daemon.status
        return _run(cfg, daemon.run_id, metrics, server, stop, out, daemon=daemon)
    finally:
        restore()
        server.close()
        if daemon is not None:
            daemon.close(sys.exc_info()[1])


PHASES = ("loading", "warmup", "ramp", "steady", "probe", "draining", "done")


def _set_phase(metrics: Metrics, phase: str) -> None:
    for p in PHASES:
        metrics.phase_info.labels(p).set(1 if p == phase else 0)


def _run(cfg: Config, run_id: str, metrics: Metrics, server: EndpointServer, stop: StopFlag, out: TextIO,
         *, daemon: Daemon | None = None) -> int:
    # Without a daemon (a caller of _run of its own): no state, no sd_notify, phases still apply.
    daemon = daemon or Daemon(cfg, metrics, run_id, None, Notifier({}), lambda p: _set_phase(metrics, p))
    model = load_model(cfg.model.spec, cfg.model.device, cfg.model.dtype, cfg.model.options)
    metrics.model_load.set(model.load_seconds)
    log.info("loaded %s on %s in %.2fs", cfg.model.spec, model.device, model.load_seconds)
    # Memory/device samplers start once the model is on its device (they read that device) and
    # stop whatever way the run ends. The leak monitor reads `series`.
    series = SeriesStore(capacity=cfg.memory.ring_size)
    daemon.watch_series(series)  # a durable copy of every sample in the state store
    telemetry = Telemetry(cfg, metrics, series, model.device,
                          resource_attributes={"soakd.run_id": run_id, "soakd.model": cfg.model.spec})
    # Leak verdicts: judged from `series` on the telemetry scheduler; flips become state events.
    cuda_index = None if model.device.type != "cuda" else (model.device.index or torch.cuda.current_device())
    leak = monitor_for_run(cfg, metrics, series, cuda_index,
                           on_event=lambda kind, detail: daemon.event(kind, json.dumps(detail, default=str)))
    leak.open()
    telemetry.scheduler.add_task("leak", leak.evaluate, cfg.leak.evaluate_interval)
    telemetry.start()
    try:
        return _soak(cfg, run_id, metrics, server, stop, out, model, series, telemetry, daemon=daemon)
    finally:
        telemetry.stop()
        leak.close()


def _soak(cfg: Config, run_id: str, metrics: Metrics, server: EndpointServer, stop: StopFlag, out: TextIO,
          model: LoadedModel, series: SeriesStore, telemetry: Telemetry, *, daemon: Daemon) -> int:
    shapes = cfg.input.shapes or model.default_shape
    # Sample files, a sequence-length mix or pre-made shapes; ConfigError when there is no shape.
    source = build_source(cfg, model.default_shape, model.dtype)

    daemon.set_phase("warmup")
    first, warm = warm_up(model, source, cfg.model.warmup, cfg.batcher.max_batch_size)
    metrics.first_inference.set(first)
    metrics.warmup.set(warm)
    cold = {"model_load_seconds": round(model.load_seconds, 4), "first_inference_seconds": round(first, 4),
            "warmup_seconds": round(warm, 4), "warmup_runs": cfg.model.warmup}
    log.info("warmup: %d runs in %.2fs (first inference %.3fs)", cfg.model.warmup, warm, first)

    run_fp = fingerprint(cfg, run_id=run_id, model_spec=cfg.model.spec, model_sha256=model.sha256,
                         device=model.device,
                         input_desc=f"samples {cfg.input.samples}" if cfg.input.samples else f"shapes {shapes}")
    if cfg.load.rate is not None:
        mode = f"rate={cfg.load.rate}/{cfg.load.arrival}"
    else:
        mode = f"concurrency={cfg.load.concurrency}"
    metrics.run_info.labels(run_id, cfg.model.spec, model.sha256[:16], str(model.device), run_fp["device_name"],
                            torch.__version__, str(torch.version.cuda), mode).set(1)
    metrics.run_start_time.set(time.time())

    engine = Engine(model.fn, model.device, source, cfg, metrics)
    engine.batch_hook = telemetry.batch_hook
    daemon.attach(engine, run_fp)  # a new segment of the run; the load the phases start from
    engine.start()
    daemon.ready()  # phases (ramp or steady), state writer, watchdog, then READY=1
    tracker = WindowTracker()
    recorder = WindowRecorder()  # per-window figures for the summary, the report and compare
    recorder.start(engine.stats())
    # A resumed run only runs what is left of its duration.
    deadline = None if cfg.load.duration is None else time.monotonic() + daemon.remaining(cfg.load.duration)
    next_status = time.monotonic() + cfg.metrics.status_interval
    while not stop.event.is_set():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        wake = min(next_status, deadline) if deadline is not None else next_status
        stop.event.wait(max(0.0, wake - now))
        if time.monotonic() >= next_status:
            stats = engine.stats()
            win = tracker.advance(stats)
            recorder.add(stats)
            print(status_line(stats.elapsed, win, stats), file=out, flush=True)
            daemon.tick(win)  # /status, systemd STATUS=, verdict events
            next_status += cfg.metrics.status_interval
    if stop.signal is not None:
        log.info("received %s: stopping arrivals and draining", signal.Signals(stop.signal).name)
    daemon.set_phase("draining")  # STOPPING=1, watchdog off
    drained = engine.stop()
    if not drained:
        log.warning("drain timed out after %.1fs with %d requests in flight", cfg.load.drain_timeout, engine.inflight)
    daemon.set_phase("done")
    daemon.finish(stop.signal)  # the segment's last window; a run that reached its end is finished
    summary = build_summary(engine, engine.stats(), run_fp, cold)
    complete_summary(summary, cfg, windows=recorder.rows, series=series, metrics=metrics,
                     elapsed_before=daemon.elapsed_before)  # + windows, memory, slo
    if cfg.output.summary_json:
        write_json_atomic(cfg.output.summary_json, summary)
        log.info("summary written to %s", cfg.output.summary_json)
    print_summary(summary, out)
    # SLO lines, <state-dir>/<run-id>/report.html; 1 when an SLO is missed.
    return conclude(summary, state_dir=daemon.store.dir if daemon.store is not None else None,
                    run_id=run_id, out=out)
