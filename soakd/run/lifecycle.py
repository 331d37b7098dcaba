"""The lifecycle of one soak across restarts: the state store (segments, windows, samples,
events), the run id, the phase, what systemd is told, and the log file.

The session (:mod:`soakd.run.session`) calls, in order: ``open`` (before loading),
``begin_segment`` (the engine is built), ``ready`` (it runs), ``set_phase`` (always),
``end_segment`` and ``close``. Nothing here drives the engine.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from soakd.config import Config
from soakd.run.systemd import LOG_FORMAT, Notifier, ReopenableFileHandler, Watchdog, install_sighup
from soakd.state import StateStore, WindowRow, default_state_dir, resolve_run_id
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.series import SeriesStore

log = logging.getLogger("soakd.daemon")

PHASES = ("loading", "warmup", "ramp", "steady", "probe", "draining", "done")


class Lifecycle:
    def __init__(
        self, cfg: Config, metrics: Metrics, run_id: str, store: StateStore | None, notifier: Notifier
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.run_id = run_id
        self.store = store
        self.notifier = notifier
        self.started = time.monotonic()
        self.phase = ""
        self.segment: int | None = None
        self.elapsed_before = 0.0  # what earlier segments of this run already ran
        self.watchdog: Watchdog | None = None
        self.on_phase: list[Callable[[str], None]] = []
        self._log_handler: ReopenableFileHandler | None = None
        self._restore_signals: Callable[[], None] = lambda: None
        self._ended = False
        self.set_phase("loading")

    @classmethod
    def open(
        cls, cfg: Config, metrics: Metrics, new_run_id: Callable[[], str], environ: Mapping[str, str] | None = None
    ) -> Lifecycle:
        """Open the state dir (a corrupt file is moved aside), pick the run id (resuming the
        unfinished run under systemd), set up the log file and SIGHUP."""
        env = os.environ if environ is None else environ
        handler = None
        if cfg.output.log_file:
            handler = ReopenableFileHandler(cfg.output.log_file)
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            logging.getLogger().addHandler(handler)
        try:
            state_dir = default_state_dir(cfg.state.dir)
            resume = cfg.state.resume
            if resume is None:  # under systemd a restart continues the run; by hand it starts a new one
                resume = "INVOCATION_ID" in env or "NOTIFY_SOCKET" in env
            store = StateStore(state_dir, flush_interval=cfg.state.flush_interval, retention=cfg.state.retention)
            for notice in store.notices:
                log.error("%s", notice)
            run_id = resolve_run_id(state_dir, cfg.state.run_id, resume, new_run_id)
        except BaseException:
            if handler is not None:
                logging.getLogger().removeHandler(handler)
                handler.close()
            raise
        life = cls(cfg, metrics, run_id, store, Notifier(env))
        life._log_handler = handler
        if threading.current_thread() is threading.main_thread():
            life._restore_signals = install_sighup(lambda: life._log_handler)
        log.info("state in %s (run %s)", store.path, run_id)
        return life

    # ------------------------------------------------------------------ phases and events

    def set_phase(self, phase: str) -> None:
        if phase == self.phase:
            return
        old, self.phase = self.phase, phase
        for p in PHASES:
            self.metrics.phase_info.labels(p).set(1 if p == phase else 0)
        if old:
            self.event("phase", f"{old} -> {phase}")
        if phase == "draining":
            if self.watchdog is not None:
                self.watchdog.stop()
            self.notifier.stopping(f"draining: {self.run_id}")
        for listener in self.on_phase:
            listener(phase)

    def event(self, kind: str, detail: str) -> None:
        if self.store is not None:
            self.store.add_event(self.run_id, self.segment, kind, detail)

    def watch_series(self, series: SeriesStore) -> None:
        """Copy every memory sample into the store (the leak monitor's rings are in memory only)."""
        store, run_id = self.store, self.run_id
        if store is not None:
            series.add_listener(lambda name, t, value: store.add_sample(run_id, name, t, value))
        # A level reset (a watched server restarted) is an event: the report shows where.
        series.add_reset_listener(lambda names, t, why: self.event("series_reset", f"{', '.join(names)}: {why}"))

    # ------------------------------------------------------------------ segments

    def remaining(self, duration: float) -> float:
        """What is left of the run's ``duration`` after the time earlier segments already ran."""
        return max(0.0, duration - self.elapsed_before)

    def begin_segment(self, fingerprint: dict[str, Any]) -> None:
        if self.store is None:
            return
        self.segment = self.store.begin_segment(self.run_id, fingerprint)
        self.elapsed_before = self.store.previous_active_seconds(self.run_id, self.segment)
        if self.elapsed_before > 0:
            log.info(
                "resuming run %s as segment %d (%.0fs already run)", self.run_id, self.segment, self.elapsed_before
            )

    def ready(
        self, window_row: Callable[[], tuple[int, str, WindowRow] | None], health: Callable[[], tuple[bool, str]]
    ) -> None:
        """The engine runs: the state writer (with the open window), the watchdog, then READY=1."""
        if self.store is not None:
            self.store.window_source = window_row
            self.store.start_writer()
        interval = self.notifier.watchdog_interval
        if interval is not None:
            self.watchdog = Watchdog(self.notifier, health, interval)
            self.watchdog.start()
        self.notifier.ready(f"{self.phase}: run {self.run_id}, model loaded and warmed up")
        log.info("ready%s", f" (watchdog ping every {interval:.1f}s)" if interval else "")

    def end_segment(self, reason: str, *, finished: bool) -> None:
        if self._ended:
            return
        self._ended = True
        if self.store is not None and self.segment is not None:
            self.event("stop", f"segment {self.segment}: {reason}")
            self.store.flush()  # the last window, before the segment is marked ended
            self.store.window_source = None  # closed: later flushes must not stretch it past the end
            self.store.end_segment(self.segment, reason, finished=finished)

    def close(self, error: BaseException | None = None) -> None:
        """Always (finally): stop the watchdog, end the segment if the run failed, close the store."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if not self._ended:
            self.notifier.stopping()
            self.end_segment(f"error: {type(error).__name__}: {error}" if error else "error", finished=False)
        if self.store is not None:
            self.store.close()
        self.notifier.close()
        self._restore_signals()
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler.close()
