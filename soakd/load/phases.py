"""Phases on a schedule (APScheduler): ramp the load up linearly, hold it steady, and step it
up for a short probe on a cron schedule (say, a 2x burst for a minute every hour).

The engine's target load is the only thing a phase changes (``set_concurrency`` in closed loop,
``set_rate`` in open loop); the runner owns warmup, draining and the end of the run.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from soakd.config import Config

log = logging.getLogger("soakd.phases")


class LoadControl(Protocol):
    def set_concurrency(self, n: int) -> None: ...

    def set_rate(self, rps: float) -> None: ...


def cron_period(expr: str, *, samples: int = 48) -> float | None:
    """The period in seconds of a crontab schedule whose fire times are evenly spaced ("0 * * * *":
    3600.0, "0 */6 * * *": 21600.0), over its next ``samples`` fire times; None when they are not
    ("0 9,17 * * *", "0 */5 * * *": 5 h gaps then 4 h at midnight) or there is no schedule. The
    leak monitor judges memory at the same point of each such cycle (docs/leak-verdicts.md)."""
    if not expr.strip():
        return None
    trigger = CronTrigger.from_crontab(expr, timezone=timezone.utc)
    fires: list[datetime] = []
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)  # any fixed instant: the schedule's gaps do not depend on it
    while len(fires) < samples:
        nxt = trigger.get_next_fire_time(fires[-1] if fires else None, now)
        if nxt is None:
            break
        fires.append(nxt)
        now = nxt + timedelta(seconds=1)
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(fires)}
    return gaps.pop() if len(gaps) == 1 else None


# A schedule's period is taken as the leak verdicts' cycle only where the run sees several
# cycles: under one, memory is not judged at all (docs/leak-verdicts.md, "Known load cycles"),
# so a nightly probe would leave a 24 h soak with no verdict. `[leak] cycle` sets any period.
MAX_SCHEDULE_CYCLE_S = 6 * 3600.0
MIN_SCHEDULE_CYCLES = 4  # in the run's duration


def schedule_cycle(cfg: Config) -> float | None:
    """The load period the schedule gives the leak verdicts: an evenly spaced
    ``phases.probe_schedule`` of at most 6 h that the run's duration holds 4 times; None when
    there is none, or when ``[leak] cycle`` sets the period itself."""
    period = None if cfg.leak.cycle is not None else cron_period(cfg.phases.probe_schedule)
    if period is None:
        return None
    duration = cfg.load.duration
    if period > MAX_SCHEDULE_CYCLE_S or (duration is not None and duration < MIN_SCHEDULE_CYCLES * period):
        log.info(
            "the probe schedule repeats every %.0f s: leak verdicts are not judged cycle by cycle by it (that "
            "takes a period of at most %.0f h that the run holds %d times; [leak] cycle sets one)",
            period,
            MAX_SCHEDULE_CYCLE_S / 3600,
            MIN_SCHEDULE_CYCLES,
        )
        return None
    return period


def ramp_fraction(elapsed: float, ramp: float) -> float:
    """Share of the way from the start load to the target, ``elapsed`` seconds into a ramp."""
    if ramp <= 0:
        return 1.0
    return min(1.0, max(0.0, elapsed / ramp))


def load_at(target: float, start_fraction: float, fraction: float, closed_loop: bool) -> float:
    """Linear from ``start_fraction * target`` to ``target``; closed loop rounds to >= 1 request."""
    value = target * (start_fraction + (1.0 - start_fraction) * fraction)
    return float(max(1, round(value))) if closed_loop else max(value, 1e-3)


class PhaseScheduler:
    """Drives the ramp and the probes on its own BackgroundScheduler (one thread, daemon)."""

    def __init__(
        self,
        cfg: Config,
        engine: LoadControl,
        set_phase: Callable[[str], None],
        *,
        elapsed_before: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.set_phase = set_phase
        self.closed_loop = not cfg.load.open_loop
        # A replayed trace's load is its speed: a ramp or probe scales the speed (docs/replay.md).
        target = cfg.load.concurrency if self.closed_loop else cfg.load.rate or cfg.load.replay_speed
        assert target is not None
        self.target = float(target)
        self.ramp = cfg.phases.ramp
        self.elapsed_before = elapsed_before  # a resumed run does not ramp again from zero
        self.clock = clock
        self._t0 = self.clock()
        self._lock = threading.Lock()
        self.phase = "steady"
        self.current_load = self.target
        self._scheduler = BackgroundScheduler(timezone=timezone.utc)
        aps_log = logging.getLogger("apscheduler")
        aps_log.setLevel(max(logging.WARNING, aps_log.level))  # not a line per job run

    @property
    def ramping(self) -> bool:
        return self.ramp > 0 and self.elapsed_before < self.ramp

    def _apply(self, load: float) -> None:
        self.current_load = load
        if self.closed_loop:
            self.engine.set_concurrency(int(load))
        else:
            self.engine.set_rate(load)

    def initial_load(self) -> float:
        """Set the engine's starting load (call before ``engine.start()``)."""
        if self.ramping:
            self._apply(
                load_at(
                    self.target,
                    self.cfg.phases.ramp_from,
                    ramp_fraction(self.elapsed_before, self.ramp),
                    self.closed_loop,
                )
            )
        return self.current_load

    def start(self) -> None:
        self._t0 = self.clock()
        if self.ramping:
            self._enter("ramp")
            step = max(0.2, min(1.0, self.ramp / 50))
            self._scheduler.add_job(
                self._ramp_tick, "interval", seconds=step, id="ramp", max_instances=1, coalesce=True
            )
        else:
            self._enter("steady")
        if self.cfg.phases.probe_schedule:
            cron = CronTrigger.from_crontab(self.cfg.phases.probe_schedule, timezone=timezone.utc)
            self._scheduler.add_job(
                self._probe_begin, cron, id="probe", max_instances=1, coalesce=True, misfire_grace_time=30
            )
        self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.set_phase(phase)

    def _ramp_tick(self) -> None:
        with self._lock:
            if self.phase != "ramp":
                return
            frac = ramp_fraction(self.elapsed_before + self.clock() - self._t0, self.ramp)
            self._apply(load_at(self.target, self.cfg.phases.ramp_from, frac, self.closed_loop))
            if frac >= 1.0:
                self._scheduler.remove_job("ramp")
                self._enter("steady")

    def probe_now(self) -> bool:
        """Begin a probe (the cron job's action); False when not in steady state."""
        with self._lock:
            if self.phase != "steady":
                log.info("probe skipped: phase is %s", self.phase)
                return False
            load = self.target * self.cfg.phases.probe_factor
            self._apply(float(max(1, round(load))) if self.closed_loop else load)
            self._enter("probe")
        log.info("probe: load x%.2f for %.0fs", self.cfg.phases.probe_factor, self.cfg.phases.probe_duration)
        return True

    def _probe_begin(self) -> None:
        if self.probe_now():
            end = datetime.now(timezone.utc) + timedelta(seconds=self.cfg.phases.probe_duration)
            self._scheduler.add_job(self.probe_end, "date", run_date=end, id="probe-end", replace_existing=True)

    def probe_end(self) -> None:
        with self._lock:
            if self.phase != "probe":
                return
            self._apply(self.target)
            self._enter("steady")
