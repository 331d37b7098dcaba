"""``soakd run``: the run session. It builds every part once, from its own config section, in
the only place that knows the order, and owns the run's lifecycle:

metrics and /metrics -> state and run id -> target (model on its worker threads, or the client
of a served model, its URL checked) -> telemetry and the leak monitor -> request source ->
warm-up -> offline probe (in-process only) -> engine -> phases, state writer, watchdog, READY ->
status ticks until the duration or a signal -> drain -> summary -> report and exit code.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import soakd
from soakd.allocator import CpuFaults, FaultRates, demo_allocator, fault_warning
from soakd.analysis.monitor import LeakMonitor, monitor_for_run
from soakd.config import Config
from soakd.endpoints import EndpointServer
from soakd.errors import Exit, RunFailed
from soakd.load.engine import Engine, EngineStats
from soakd.load.phases import PhaseScheduler, schedule_cycle
from soakd.load.record import RequestRecorder
from soakd.record.write import write_record
from soakd.run.health import Health
from soakd.run.heap import frozen_heap
from soakd.run.identity import new_run_id
from soakd.run.lifecycle import Lifecycle
from soakd.run.prepare import Preparation, prepare
from soakd.run.shard import one_watcher, remaining, wait_for_start
from soakd.run.status import status_document
from soakd.run.stop import StopFlag
from soakd.run.summary import build_summary, print_summary, status_line
from soakd.run.verdict import conclude
from soakd.run.windows import Delta, StoreWindow, WindowRecorder, window_length
from soakd.targets.base import AnyTarget
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.pipeline import Telemetry, resource_attributes, run_samplers
from soakd.telemetry.series import SeriesStore
from soakd.telemetry.watched import UnitResolver, resolve_units
from soakd.workload.replay import ReplaySource
from soakd.workload.sources import RequestSource

log = logging.getLogger("soakd")

OVERHEAD_WARN_RATIO = 0.05  # soakd's own per-batch work above this share of model time is said aloud
OVERLOAD_TICKS = 3  # the queue grew this many status ticks in a row: offered load exceeds capacity


def run(cfg: Config, *, out: TextIO = sys.stdout, stop: StopFlag | None = None) -> int:
    """Run a soak per ``cfg``; returns the process exit code."""
    return RunSession(one_watcher(cfg), out, stop or StopFlag()).run()


@dataclass
class _Prepared:
    """What the soak needs from the preparation steps, whatever the target."""

    target: AnyTarget
    source: RequestSource
    run_fp: dict[str, Any]
    cold: dict[str, Any]
    offline: dict[str, Any] | None
    target_summary: Callable[[], dict[str, Any]] | None = None


class RunSession:
    def __init__(self, cfg: Config, out: TextIO, stop: StopFlag) -> None:
        self.cfg = cfg
        self.out = out
        self.stop = stop
        self.metrics = Metrics()
        stale = cfg.daemon.sampler_stale_after or max(5 * cfg.memory.interval, 30.0)
        self.health = Health(self.metrics, cfg.daemon.stall_timeout, stale)
        self.life: Lifecycle | None = None
        self.engine: Engine | None = None
        self.leak: LeakMonitor | None = None
        self.units: list[UnitResolver] = []
        self.window: Delta | None = None
        self.offline_rps: float | None = None
        self.target_summary: Callable[[], dict[str, Any]] | None = None  # a network target's /status block
        self._overhead_warned = False
        self._faults_warned = False  # by the probe (steps.probe_offline) or by the soak
        self._fault_warning: str | None = None  # the soak's own, for the summary
        self._probe_faults: float | None = None
        self._faults_at: tuple[EngineStats, CpuFaults] | None = None  # the last fault check's moment
        self._overload_ticks = 0
        self._overloaded = False
        self._last_queued = 0
        self.shard: dict[str, Any] | None = None  # the summary's shard block (run/shard.py)

    # ------------------------------------------------------------------ the whole run

    def run(self) -> int:
        demo_allocator(self.cfg)  # before the first thread (the metrics server) starts
        m = self.metrics
        m.build_info.labels(soakd.__version__).set(1)
        server = EndpointServer(self.cfg.metrics.addr, m.registry, health=self.health, status=self.status)
        server.start()
        log.info("serving metrics on http://%s/metrics", server.address)
        restore = self.stop.install()
        try:
            # State dir (a corrupt file is moved aside), run id (resumed under systemd),
            # sd_notify, the log file and SIGHUP.
            self.life = Lifecycle.open(self.cfg, m, new_run_id)
            self.life.on_phase.append(self._on_phase)
            return self._run_target(self.life)
        finally:
            restore()
            server.close()
            if self.life is not None:
                self.life.close(sys.exc_info()[1])

    def _on_phase(self, phase: str) -> None:
        if phase == "draining":
            self.health.stopping = True

    def _run_target(self, life: Lifecycle) -> int:
        """One path for every target: open it (load or connect), then telemetry, warm-up, soak."""
        # An unknown --watch-unit is exit 2 naming it, before a model loads or a target connects.
        self.units = resolve_units(self.cfg.target.watch_unit)
        prep = prepare(self.cfg, self.metrics, self.health)
        self.target_summary = prep.summary
        try:
            if self.stop.event.is_set():
                return self._stopped_early(life, prep.opening)
            return self._with_telemetry(life, prep)
        finally:
            prep.close()

    def _with_telemetry(self, life: Lifecycle, prep: Preparation) -> int:
        """Samplers, the series ring and the leak monitor around the warm-up and the soak."""
        cfg = self.cfg
        series = SeriesStore(capacity=cfg.memory.ring_size)
        life.watch_series(series)  # a durable copy of every sample in the state store
        telemetry = Telemetry(
            cfg,
            self.metrics,
            run_samplers(cfg, self.metrics, series, prep.device, self.units),
            resource_attributes=resource_attributes(
                prep.device, {"soakd.run_id": life.run_id, "soakd.model": prep.label}
            ),
        )
        # Leak verdicts judged from `series` on the telemetry scheduler; each flip is one event.
        self.leak = monitor_for_run(
            cfg,
            self.metrics,
            series,
            prep.cuda_index,
            on_event=lambda kind, detail: life.event(kind, json.dumps(detail, default=str)),
            cycle=schedule_cycle(cfg),
        )
        self.leak.open()
        telemetry.scheduler.add_task("leak", self.leak.evaluate, cfg.leak.evaluate_interval)
        telemetry.start()
        try:
            return self._warm_and_soak(life, prep, series, telemetry)
        finally:
            telemetry.stop()
            self.leak.close()

    def _stopped_early(self, life: Lifecycle, during: str) -> int:
        log.info("received %s during %s: stopping before the soak began", self.stop.name, during)
        life.end_segment(f"{self.stop.name} during {during}", finished=False)
        return Exit.OK

    def _warm_and_soak(self, life: Lifecycle, prep: Preparation, series: SeriesStore, telemetry: Telemetry) -> int:
        source = prep.source()
        life.set_phase("warmup")
        warm = prep.warm_up(source, self.stop.event)
        if warm.stopped or self.stop.event.is_set():
            return self._stopped_early(life, "warm-up")
        offline = prep.probe_offline(source, self.stop.event)
        if self.stop.event.is_set():
            return self._stopped_early(life, "the offline probe")
        self.offline_rps = offline["rps"] if offline and offline["rps"] > 0 else None
        if offline is not None and "churn_faults_per_call" in offline:
            self._probe_faults = offline["churn_faults_per_call"]
            self._faults_warned = "allocator_warning" in offline
        with frozen_heap():  # before --start-at: the collection it starts with must not delay the first send
            self.cfg, self.shard = wait_for_start(self.cfg, self.stop.event)  # --shard/--start-at: clock, start
            if self.stop.event.is_set():
                return self._stopped_early(life, "the wait for --start-at")
            run_fp = prep.fingerprint(life.run_id)
            if isinstance(source, ReplaySource):  # the trace is part of what the result is bound to
                run_fp["trace"] = source.info.fingerprint()
            ready = _Prepared(prep.target, source, run_fp, prep.cold_start(warm), offline, self.target_summary)
            return self._soak(life, ready, series, telemetry)

    def _soak(self, life: Lifecycle, prep: _Prepared, series: SeriesStore, telemetry: Telemetry) -> int:
        """The measured part, the same for every target: engine, phases, ticks, drain, summary."""
        cfg, m = self.cfg, self.metrics
        target, source, run_fp, offline = prep.target, prep.source, prep.run_fp, prep.offline
        engine = self.engine = Engine(target, source, cfg, m)
        if cfg.output.record_requests is not None:
            api = cfg.target.api if cfg.target.url is not None else "model"
            engine.recorder = RequestRecorder(cfg.output.record_requests, cfg.output.record_max_bytes, api=api)
        engine.batch_hook = telemetry.batch_hook
        life.begin_segment(run_fp)  # a new segment of the run
        phases = PhaseScheduler(cfg, engine, life.set_phase, elapsed_before=life.elapsed_before)
        phases.initial_load()  # the load the phases start from
        engine.start()
        self.health.engine = engine
        soak_start = (engine.stats(), CpuFaults.now())
        self._faults_at = soak_start
        windows = WindowRecorder()  # the summary's rows, for the report and compare
        windows.start(engine.stats())
        store_window = StoreWindow(
            engine.stats,
            window_length(cfg.state.window, cfg.load.duration, cfg.state.flush_interval),
            life.run_id,
            lambda: life.segment,
            life.event,
        )
        store_window.start(engine.stats())
        try:
            phases.start()
            life.ready(store_window.row, self.health)  # state writer, watchdog, then READY=1
            self._tick_until_done(life, engine, windows)
        finally:
            phases.stop()
        died = target.dead()
        self._drain(life, engine, died)
        recorded = engine.recorder.close() if engine.recorder is not None else None
        if died is not None:
            raise RunFailed(f"a model worker thread ended ({type(died).__name__}: {died}); the run stopped")
        stats = engine.stats()
        if offline is not None:
            offline["achieved_ratio"] = (
                round(stats.completed.get("ok", 0) / stats.elapsed / offline["rps"], 4) if offline["rps"] > 0 else None
            )
            rates = self._notice_faults(soak_start, (stats, CpuFaults.now()))
            offline["soak_page_faults_per_call"] = round(rates.faults, 1)
            offline["soak_churn_faults_per_call"] = round(rates.churn, 1)
            if self._fault_warning is not None:
                offline.setdefault("allocator_warning", self._fault_warning)
            offline["soak_kernel_time_ratio"] = round(rates.kernel_share, 4)
        # A closing look over every sample: the last scheduled one is up to leak.evaluate_interval
        # old, and `soakd analyze` of the recorded series judges them all (#39: they must agree);
        # final: the end of a run has no later, so a rise is not held back as "early".
        verdicts = self.leak.evaluate(final=True) if self.leak is not None else {}
        summary = build_summary(
            cfg,
            engine,
            stats,
            run=run_fp,
            cold=prep.cold,
            windows=windows.rows,
            series=series,
            verdicts=verdicts,
            metrics=m,
            elapsed_before=life.elapsed_before,
            offline=offline,
            target=prep.target_summary() if prep.target_summary is not None else None,
        )
        if recorded is not None:
            summary.record_requests = recorded
        if self.shard is not None:
            summary.shard = self.shard
        if cfg.output.summary_json:
            write_record(cfg.output.summary_json, summary)
            log.info("summary written to %s", cfg.output.summary_json)
        print_summary(summary, self.out)
        # SLO lines, <state-dir>/<run-id>/report.html; 1 when an SLO is missed.
        return conclude(
            summary, state_dir=life.store.dir if life.store is not None else None, run_id=life.run_id, out=self.out
        )

    def _drain(self, life: Lifecycle, engine: Engine, died: BaseException | None) -> None:
        """Stop arrivals, drain what is in flight (up to load.drain_timeout), end the segment:
        the run is finished unless a signal or a dead worker ended it."""
        cfg = self.cfg
        life.set_phase("draining")  # STOPPING=1, watchdog off
        if self.stop.signal is not None:
            log.info("received %s: stopping arrivals and draining", self.stop.name)
        log.info("draining %d requests in flight (up to %.0fs)", engine.inflight, cfg.load.drain_timeout)
        queued = engine.stats().queued
        if not engine.stop():
            # In process, the queue never reached the model (dropped); a served model's requests
            # still out are ended by the target (sent: timeout, never sent: dropped).
            where = (
                f"{queued} requests that never reached the model are counted as dropped"
                if engine.target.batches  # a model in this process
                else "the requests still out at the target are counted as timeouts (never sent: dropped)"
            )
            log.warning("drain timed out after %.1fs: %s", cfg.load.drain_timeout, where)
        life.set_phase("done")
        life.end_segment(
            "completed" if self.stop.signal is None else self.stop.name,
            finished=self.stop.signal is None and died is None,
        )

    # ------------------------------------------------------------------ while it runs

    def _tick_until_done(self, life: Lifecycle, engine: Engine, windows: WindowRecorder) -> None:
        cfg = self.cfg
        # A resumed run only runs what is left of its duration; with --start-at the duration
        # counts from that instant, so a late or restarted shard ends with the others.
        deadline = None
        if cfg.load.duration is not None:
            deadline = time.monotonic() + remaining(cfg, life.remaining(cfg.load.duration))
        interval = cfg.metrics.status_interval
        next_status = time.monotonic() + interval
        last = engine.stats()
        while not self.stop.event.is_set() and engine.target.dead() is None:
            now = time.monotonic()
            if (deadline is not None and now >= deadline) or engine.exhausted:
                break
            wake = min(next_status, deadline) if deadline is not None else next_status
            self.stop.event.wait(max(0.0, min(wake - now, 0.5)))
            if time.monotonic() >= next_status:
                stats = engine.stats()
                win = self.window = Delta.between(last, stats)
                windows.add(stats)
                print(status_line(stats.elapsed, win, stats, self.offline_rps), file=self.out, flush=True)
                self._notice_harness(last, stats)
                if self._faults_at is not None and engine.target.batches:
                    now_at = (stats, CpuFaults.now())
                    self._notice_faults(self._faults_at, now_at)
                    self._faults_at = now_at
                self._notice_overload(win, stats)
                last = stats
                life.notifier.status(self._status_text(life.phase, win))
                next_status += interval

    def _notice_harness(self, a: EngineStats, b: EngineStats) -> None:
        """soakd's own work per batch (collate, completion) against the model's time, said once
        when it is large enough to bend the figures (as perf_analyzer warns of client overhead)."""
        model_s = b.model_seconds - a.model_seconds
        if model_s <= 0:
            return
        ratio = (b.overhead_seconds - a.overhead_seconds) / model_s
        self.metrics.harness_overhead_ratio.set(ratio)
        if ratio > OVERHEAD_WARN_RATIO and not self._overhead_warned:
            self._overhead_warned = True
            log.warning(
                "soakd's own per-batch work is %.0f%% of the model's time: at this load the harness, "
                "not only the model, sets the throughput (soakd_harness_overhead_ratio)",
                100 * ratio,
            )

    def _notice_faults(self, a: tuple[EngineStats, CpuFaults], b: tuple[EngineStats, CpuFaults]) -> FaultRates:
        """Page faults per model batch and the kernel's share of CPU time between two moments of
        the soak, warned about once when the allocator sets the pace. The probe may not have seen
        it: glibc's dynamic mmap threshold makes a model's faults depend on the order its blocks
        were freed (docs/model-threads.md, section 3), so the same model can fault in the soak
        and not alone."""
        rates = a[1].per_call(b[1], b[0].batches - a[0].batches)
        warning = fault_warning(rates) if b[0].batches > a[0].batches else None
        if warning is not None and not self._faults_warned:
            self._faults_warned = True
            probe = self._probe_faults
            alone = "" if probe is None else f" (alone, in the offline probe: {probe:.0f} faults a call)"
            self._fault_warning = f"during the soak{alone}, {warning}"
            log.warning("%s", self._fault_warning)
        return rates

    def _notice_overload(self, win: Delta, stats: EngineStats) -> None:
        """Open loop: a queue that keeps growing means offered load exceeds what the model
        completes, and the latency measured is mostly queueing."""
        if not self.cfg.load.open_loop:
            return
        deep = stats.queued > 2 * self.cfg.batcher.max_batch_size
        growing = deep and (win.dropped > 0 or stats.queued > self._last_queued)
        self._last_queued = stats.queued
        self._overload_ticks = self._overload_ticks + 1 if growing else 0
        if self._overload_ticks >= OVERLOAD_TICKS and not self._overloaded:
            self._overloaded = True
            offered = self.engine.target_load if self.engine is not None else math.nan
            log.warning(
                "overloaded: %.1f req/s offered, %.1f req/s completed; %d queued%s. Latency now is "
                "mostly queueing: lower --rate or add capacity",
                offered,
                win.rps,
                stats.queued,
                f", {win.dropped} dropped in the last window" if win.dropped else "",
            )
        elif self._overloaded and self._overload_ticks == 0 and stats.queued <= self.cfg.batcher.max_batch_size:
            self._overloaded = False
            log.info("no longer overloaded: the queue is down to %d", stats.queued)

    def _status_text(self, phase: str, win: Delta) -> str:
        p99 = win.percentile_ms(0.99)
        suspected = sorted(s for s, v in (self.leak.verdicts() if self.leak else {}).items() if v.suspected)
        leak = f"leak suspected: {', '.join(suspected)}" if suspected else "no leak suspected"
        return f"{phase}: {win.rps:.1f} req/s, p99 {'-' if math.isnan(p99) else f'{p99:.2f} ms'}, {leak}"

    def status(self) -> dict[str, Any]:
        """/status: what the run is doing now."""
        return status_document(
            self.cfg,
            self.life,
            self.engine,
            self.window,
            self.health,
            self.leak.verdicts() if self.leak is not None else {},
            self.target_summary() if self.target_summary is not None else None,
        )
