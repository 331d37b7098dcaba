"""Lifecycle of a long-running soak: sd_notify, the watchdog, /healthz and /status, durable
state (segments, windows, samples, events), phases, and log re-opening on SIGHUP.

sd_notify speaks systemd's datagram protocol on ``$NOTIFY_SOCKET`` directly (a path, or an
abstract socket written ``@name``), so there is no libsystemd dependency. Without the variable
every notification is a no-op. Watchdog pings are withheld while the engine completes nothing
or a sampler has gone stale, so a hung inference or a stuck driver call gets us restarted.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from soakd.config import Config
from soakd.store import StateStore, WindowRow, default_state_dir, resolve_run_id
from soakd.telemetry.catalogue import Metrics

if TYPE_CHECKING:
    from soakd.load.engine import Engine, EngineStats
    from soakd.load.phases import PhaseScheduler
    from soakd.runner import Window
    from soakd.telemetry.series import SeriesStore

log = logging.getLogger("soakd.daemon")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# --------------------------------------------------------------------------- sd_notify


class Notifier:
    """systemd's notify protocol over a unix datagram socket; silent without ``NOTIFY_SOCKET``."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        self._sock: socket.socket | None = None
        if addr.startswith(("@", "/")):
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._failed = False
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        # The watchdog is ours only when WATCHDOG_PID is unset or names this process.
        mine = not pid or pid == str(os.getpid())
        self.watchdog_usec = int(usec) if usec.isdigit() and int(usec) > 0 and mine else None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half the watchdog timeout, as sd_watchdog_enabled(3) advises."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2e6

    def notify(self, *assignments: str) -> bool:
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
            return True
        except OSError as exc:  # systemd gone (or a test's socket closed): never fatal
            if not self._failed:
                self._failed = True
                log.warning("sd_notify to %r failed: %s", self.address.replace("\0", "@"), exc)
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# --------------------------------------------------------------------------- health


def gauge_values(gauge: Any, label: str) -> dict[str, float]:
    """``{label value: sample value}`` of a labelled prometheus_client metric (public API only)."""
    out: dict[str, float] = {}
    for family in gauge.collect():
        for sample in family.samples:
            if label in sample.labels:
                out[sample.labels[label]] = float(sample.value)
    return out


def leak_verdicts(metrics: Metrics) -> dict[str, dict[str, float | bool | None]]:
    """The leak monitor's verdicts per series, read from the ``soakd_leak_*`` gauges."""
    out: dict[str, dict[str, float | bool | None]] = {}
    for gauge, key in ((metrics.leak_slope, "slope_bytes_per_hour"), (metrics.leak_p_value, "p_value"),
                       (metrics.memory_exhaustion_eta, "exhaustion_eta_seconds")):
        for series, value in gauge_values(gauge, "series").items():
            out.setdefault(series, {})[key] = value if math.isfinite(value) else None
    for series, value in gauge_values(metrics.leak_suspected, "series").items():
        out.setdefault(series, {})["suspected"] = value >= 1
    return out


class Health:
    """Healthy while the engine completes requests and every sampler that has ever succeeded
    succeeded recently. The same answer serves /healthz and gates the watchdog pings."""

    def __init__(self, metrics: Metrics, stall_timeout: float, sampler_stale_after: float,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.stall_timeout = stall_timeout
        self.sampler_stale_after = sampler_stale_after
        self.clock = clock
        self.wall = wall
        self.engine: Engine | None = None
        self.stopping = False

    def __call__(self) -> tuple[bool, str]:
        engine = self.engine
        if self.stopping:
            return False, "stopping: draining in-flight requests"
        if engine is None:
            return False, "starting: loading and warming up the model"
        idle = self.clock() - engine.last_progress
        if engine.inflight > 0 and idle > self.stall_timeout:
            return False, (f"engine stalled: no request completed for {idle:.0f}s with {engine.inflight} in "
                           f"flight (hung inference?)")
        now = self.wall()
        stale = [f"{src} (last success {now - t:.0f}s ago)"
                 for src, t in sorted(gauge_values(self.metrics.collector_last_success, "source").items())
                 if t > 0 and now - t > self.sampler_stale_after]
        if stale:
            return False, "samplers stale: " + ", ".join(stale)
        return True, "ok"


class Watchdog:
    """Pings ``WATCHDOG=1`` every interval while ``health`` says ok; withholds it otherwise."""

    def __init__(self, notifier: Notifier, health: Callable[[], tuple[bool, str]], interval: float) -> None:
        self.notifier = notifier
        self.health = health
        self.interval = interval
        self.pings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soakd-watchdog", daemon=True)
        self._withholding = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            ok, reason = self.health()
            if self._stop.is_set():
                return
            if ok:
                if self._withholding:
                    log.info("watchdog: healthy again, pinging")
                self._withholding = False
                self.notifier.watchdog()
                self.pings += 1
            elif not self._withholding:
                self._withholding = True
                log.error("watchdog: withholding pings: %s", reason)
                self.notifier.status(f"unhealthy: {reason}")


# --------------------------------------------------------------------------- logs


class ReopenableFileHandler(logging.FileHandler):
    """A log file that SIGHUP re-opens, so logrotate can move it away."""

    def reopen(self) -> None:
        with self.lock or threading.RLock():
            if self.stream is not None:
                self.stream.close()
            self.stream = self._open()


# --------------------------------------------------------------------------- the lifecycle


class Daemon:
    """Everything around the engine that a run of days needs. The runner calls, in order:
    ``open`` (before loading), ``attach`` (engine built), ``ready`` (engine started), ``tick``
    (each status interval), ``set_phase`` (always), ``finish`` and ``close``."""

    def __init__(self, cfg: Config, metrics: Metrics, run_id: str, store: StateStore | None,
                 notifier: Notifier, set_phase_metric: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.run_id = run_id
        self.store = store
        self.notifier = notifier
        self._set_phase_metric = set_phase_metric
        stale = cfg.daemon.sampler_stale_after or max(5 * cfg.memory.interval, 30.0)
        self.health = Health(metrics, cfg.daemon.stall_timeout, stale)
        self.started = time.monotonic()
        self.phase = "loading"
        self.segment: int | None = None
        self.elapsed_before = 0.0
        self.engine: Engine | None = None
        self.phases: PhaseScheduler | None = None
        self.watchdog: Watchdog | None = None
        self.window: Window | None = None
        self._verdicts: dict[str, bool] = {}
        self._seen_outcomes: set[str] = set()
        self._win_lock = threading.Lock()
        self._win_t0 = time.time()
        self._win_base: EngineStats | None = None
        self._log_handler: ReopenableFileHandler | None = None
        self._restore_signals: Callable[[], None] = lambda: None
        self._ended = False

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, cfg: Config, metrics: Metrics, new_run_id: Callable[[], str],
             set_phase_metric: Callable[[str], None], environ: Mapping[str, str] | None = None) -> Daemon:
        """Open the state dir (a corrupt or locked file is moved aside), pick the run id (resuming
        the unfinished run under systemd), set up the log file and SIGHUP."""
        env = os.environ if environ is None else environ
        handler = None
        if cfg.output.log_file:
            handler = ReopenableFileHandler(cfg.output.log_file)
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            logging.getLogger().addHandler(handler)
        state_dir = default_state_dir(cfg.state.dir)
        resume = cfg.state.resume
        if resume is None:  # under systemd a restart continues the run; by hand it starts a new one
            resume = "INVOCATION_ID" in env or "NOTIFY_SOCKET" in env
        store = StateStore(state_dir, flush_interval=cfg.state.flush_interval, retention=cfg.state.retention)
        for notice in store.notices:
            log.error("%s", notice)
        run_id = resolve_run_id(state_dir, cfg.state.run_id, resume, new_run_id)
        daemon = cls(cfg, metrics, run_id, store, Notifier(env), set_phase_metric)
        daemon._log_handler = handler
        if threading.current_thread() is threading.main_thread():
            daemon._install_sighup()
        log.info("state in %s (run %s)", store.path, run_id)
        return daemon

    def _install_sighup(self) -> None:
        def on_hup(signum: int, frame: FrameType | None) -> None:
            # Re-open from a thread: the signal may land while the main thread holds the handler.
            handler = self._log_handler
            if handler is not None:
                threading.Thread(target=handler.reopen, name="soakd-reopen-log", daemon=True).start()

        old = signal.signal(signal.SIGHUP, on_hup)

        def restore() -> None:
            signal.signal(signal.SIGHUP, old)

        self._restore_signals = restore

    # ------------------------------------------------------------------ phases and events

    def set_phase(self, phase: str) -> None:
        if phase == self.phase:
            return
        old, self.phase = self.phase, phase
        self._set_phase_metric(phase)
        self.event("phase", f"{old} -> {phase}")
        if phase == "draining":
            self.health.stopping = True
            if self.watchdog is not None:
                self.watchdog.stop()
            self.notifier.stopping(f"draining: {self.run_id}")

    def event(self, kind: str, detail: str) -> None:
        if self.store is not None:
            self.store.add_event(self.run_id, self.segment, kind, detail)

    def watch_series(self, series: SeriesStore) -> None:
        """Copy every memory sample into the store (the leak monitor's rings are in memory only)."""
        store, run_id = self.store, self.run_id
        if store is not None:
            series.add_listener(lambda name, t, value: store.add_sample(run_id, name, t, value))

    # ------------------------------------------------------------------ engine

    def remaining(self, duration: float) -> float:
        """What is left of the run's ``duration`` after the time earlier segments already ran."""
        return max(0.0, duration - self.elapsed_before)

    def attach(self, engine: Engine, fingerprint: dict[str, Any]) -> None:
        """Before ``engine.start()``: begin this segment, set the load the phases start from."""
        from soakd.load.phases import PhaseScheduler

        self.engine = engine
        self._win_t0, self._win_base = time.time(), engine.stats()  # zero: counts start with the engine
        if self.store is not None:
            self.segment = self.store.begin_segment(self.run_id, fingerprint)
            self.elapsed_before = self.store.previous_active_seconds(self.run_id, self.segment)
            if self.elapsed_before > 0:
                log.info("resuming run %s as segment %d (%.0fs already run)", self.run_id, self.segment,
                         self.elapsed_before)
        self.phases = PhaseScheduler(self.cfg, engine, self.set_phase, elapsed_before=self.elapsed_before)
        self.phases.initial_load()

    def ready(self) -> None:
        """After ``engine.start()``: phases, the window recorder, the watchdog, then READY=1."""
        engine = self.engine
        assert engine is not None and self.phases is not None
        self.health.engine = engine
        if self.store is not None:
            self.store.window_source = self._window_row
            self.store.start_writer()
        self.phases.start()
        interval = self.notifier.watchdog_interval
        if interval is not None:
            self.watchdog = Watchdog(self.notifier, self.health, interval)
            self.watchdog.start()
        self.notifier.ready(f"{self.phase}: run {self.run_id}, model loaded and warmed up")
        log.info("ready%s", f" (watchdog ping every {interval:.1f}s)" if interval else "")

    def _window_row(self) -> tuple[int, str, WindowRow] | None:
        """The open window so far (the store's writer upserts it); rolls over every state.window."""
        engine, base, seg = self.engine, self._win_base, self.segment
        if engine is None or base is None or seg is None:
            return None
        with self._win_lock:
            now_t, stats = time.time(), engine.stats()
            row = WindowRow(
                t_start=self._win_t0, t_end=now_t,
                outcomes={k: v - base.completed.get(k, 0) for k, v in stats.completed.items()},
                hists={s: h - base.stages[s] if s in base.stages else h for s, h in stats.stages.items()},
            )
            for outcome, n in row.outcomes.items():
                if n and outcome != "ok" and outcome not in self._seen_outcomes:
                    self._seen_outcomes.add(outcome)
                    self.event("outcome", f"first {outcome} outcome in segment {seg}")
            if now_t - self._win_t0 >= self.cfg.state.window:
                self._win_t0, self._win_base = now_t, stats
        return seg, self.run_id, row

    def tick(self, window: Window) -> None:
        """Each status interval: keep /status and systemd's STATUS= current, record verdict changes."""
        self.window = window
        verdicts = leak_verdicts(self.metrics)
        suspected = sorted(s for s, v in verdicts.items() if v.get("suspected"))
        for series, v in verdicts.items():
            flag = bool(v.get("suspected"))
            if self._verdicts.get(series, False) != flag:
                self.event("verdict", f"{series}: {'leak suspected' if flag else 'no leak'}"
                           f" (slope {v.get('slope_bytes_per_hour')} B/h)")
            self._verdicts[series] = flag
        p99 = "-" if math.isnan(window.p99_ms) else f"{window.p99_ms:.2f} ms"
        leak = f"leak suspected: {', '.join(suspected)}" if suspected else "no leak suspected"
        self.notifier.status(f"{self.phase}: {window.rps:.1f} req/s, p99 {p99}, {leak}")

    def finish(self, stop_signal: int | None) -> None:
        """After the drain: end the segment (a run that reached its duration is finished)."""
        if self.phases is not None:
            self.phases.stop()
        reason = "completed" if stop_signal is None else signal.Signals(stop_signal).name
        self._end(reason, finished=stop_signal is None)

    def _end(self, reason: str, *, finished: bool) -> None:
        if self._ended:
            return
        self._ended = True
        if self.store is not None and self.segment is not None:
            self.event("stop", f"segment {self.segment}: {reason}")
            self.store.flush()  # the last window, before the segment is marked ended
            self.store.window_source = None  # closed: later flushes must not stretch it past the end
            self.store.end_segment(self.segment, reason, finished=finished)

    def close(self, error: BaseException | None = None) -> None:
        """Always (finally): stop the threads, end the segment if the run failed, close the store."""
        if self.phases is not None:
            self.phases.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        if not self._ended:
            self.notifier.stopping()
            self._end(f"error: {type(error).__name__}: {error}" if error else "error", finished=False)
        if self.store is not None:
            self.store.close()
        self.notifier.close()
        self._restore_signals()
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler.close()

    # ------------------------------------------------------------------ /status

    def status(self) -> dict[str, Any]:
        ok, reason = self.health()
        engine, win = self.engine, self.window
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "segment": self.segment,
            "phase": self.phase,
            "healthy": ok,
            "health": reason,
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "run_elapsed_seconds": round(self.elapsed_before + time.monotonic() - self.started, 3),
            "throughput_rps": None,
            "p50_ms": None,
            "p99_ms": None,
            "window_seconds": self.cfg.metrics.status_interval,
        }
        if win is not None:
            out["throughput_rps"] = round(win.rps, 3)
            out["p50_ms"] = None if math.isnan(win.p50_ms) else round(win.p50_ms, 4)
            out["p99_ms"] = None if math.isnan(win.p99_ms) else round(win.p99_ms, 4)
        if engine is not None:
            stats = engine.stats()
            out["requests"] = stats.completed
            out["inflight"] = stats.inflight
            out["target_load"] = {"rate" if engine.open_loop else "concurrency": engine.target_load}
        verdicts = leak_verdicts(self.metrics)
        out["leak"] = verdicts
        out["leak_suspected"] = sorted(s for s, v in verdicts.items() if v.get("suspected"))
        out["watchdog"] = {"interval_seconds": self.notifier.watchdog_interval,
                           "pings": self.watchdog.pings if self.watchdog else 0}
        if self.store is not None:
            out["state"] = {"path": str(self.store.path), "write_errors": self.store.write_errors,
                            "dropped": self.store.dropped}
        return out
