"""Run samplers on an APScheduler interval, each bounded in time and isolated from the others.

Every source gets its own APScheduler job (``max_instances=1``, coalescing) and its own
worker thread. The job hands the sample to the worker and waits at most ``sample_timeout``:
a driver call that hangs (NVML on a wedged GPU, a stuck /proc read) keeps only its own
worker, marks its source down, and is not re-entered until it returns, while the other
sources keep sampling. Worker threads are daemons so a call that never returns cannot
block process exit.

Each source exports ``collector_up``, ``collector_duration_seconds`` and
``collector_last_success_timestamp_seconds``. A source that is absent on this host (no CUDA,
no NVML, no glibc) raises :class:`SourceUnavailable` from ``open()``: it reports
``collector_up 0`` once, logs one line, and is never sampled (its tick returns at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from soakd.telemetry.catalogue import Metrics

log = logging.getLogger("soakd.telemetry")


class SourceUnavailable(Exception):
    """The source does not exist on this host; the message says why (one log line)."""


class Sampler(Protocol):
    """One telemetry source. ``open`` may raise SourceUnavailable; ``sample`` sets metrics."""

    name: str

    def open(self) -> None: ...

    def sample(self) -> None: ...

    def close(self) -> None: ...


class _Worker:
    """A daemon thread that runs one call at a time for one source."""

    def __init__(self, name: str) -> None:
        self._cv = threading.Condition()
        self._call: Callable[[], None] | None = None
        self._done = threading.Event()
        self._done.set()
        self.error: BaseException | None = None
        self.duration = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"soakd-sampler-{name}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return not self._done.is_set()

    def submit(self, call: Callable[[], None]) -> None:
        with self._cv:
            self._done.clear()
            self._call = call
            self._cv.notify()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._call is None and not self._closed:
                    self._cv.wait()
                if self._call is None:
                    return
                call, self._call = self._call, None
            t0 = time.perf_counter()
            try:
                call()
                self.error = None
            except BaseException as exc:  # reported by the job, never kills the worker
                self.error = exc
            self.duration = time.perf_counter() - t0
            self._done.set()


class _Source:
    """Scheduler-side state of one sampler."""

    def __init__(self, sampler: Sampler, metrics: Metrics) -> None:
        self.sampler = sampler
        self.name = sampler.name
        self.worker = _Worker(sampler.name)
        self.up = metrics.collector_up.labels(self.name)
        self.duration = metrics.collector_duration.labels(self.name)
        self.last_success = metrics.collector_last_success.labels(self.name)
        self.opened = False
        self.overran: str | None = None  # "open" or "sample": a call still running past the timeout
        self.state = "new"  # new | up | failing | hung | absent
        self.samples = 0
        self.failures = 0


class SamplerScheduler:
    """Owns the APScheduler BackgroundScheduler and one job per sampler."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        sample_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.sample_timeout = sample_timeout
        self.clock = clock
        self._sources: dict[str, _Source] = {}
        self._scheduler = BackgroundScheduler(timezone=timezone.utc)
        self._started = False
        apscheduler_log = logging.getLogger("apscheduler")
        if apscheduler_log.level == logging.NOTSET:
            # "Added job"/"Running job" (INFO) and "skipped: maximum number of running instances"
            # (WARNING) on every tick would drown soakd's own lines; a source that overruns is
            # reported once by this module as hung.
            apscheduler_log.setLevel(logging.ERROR)

    def add(self, sampler: Sampler, interval: float) -> None:
        """Schedule ``sampler`` every ``interval`` seconds (first sample at start)."""
        if sampler.name in self._sources:
            raise ValueError(f"duplicate sampler {sampler.name!r}")
        src = self._sources[sampler.name] = _Source(sampler, self.metrics)
        src.up.set(0)
        self._scheduler.add_job(
            self.run_once,
            "interval",
            args=[sampler.name],
            id=sampler.name,
            name=f"sample {sampler.name}",
            seconds=interval,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(interval)),
            next_run_time=datetime.now(timezone.utc) + timedelta(milliseconds=10 * len(self._sources)),
        )

    def add_task(self, name: str, func: Callable[[], object], interval: float) -> None:
        """Run ``func`` every ``interval`` seconds on this scheduler, outside the sampler
        bookkeeping (no collector_up, no staleness check): for consumers of the samples such as
        the leak monitor (soakd/analysis/monitor.py)."""
        self._scheduler.add_job(
            func,
            "interval",
            id=f"task-{name}",
            name=name,
            seconds=interval,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(interval)),
        )

    def start(self) -> None:
        self._scheduler.start()
        self._started = True

    def states(self) -> dict[str, str]:
        return {name: src.state for name, src in self._sources.items()}

    def run_once(self, name: str) -> bool:
        """One bounded sample of source ``name``; True when it succeeded. The scheduler's job."""
        src = self._sources[name]
        if src.state == "absent":
            return False
        if src.worker.busy:
            # Still inside the hung call from an earlier tick: do not pile up another one.
            return False
        if src.overran == "open":  # the open that overran has returned: use its outcome
            src.overran = None
            if not self._opened(src):
                return False
        src.overran = None
        if not src.opened and not self._open(src):
            return False
        src.worker.submit(src.sampler.sample)
        finished = src.worker.wait(self.sample_timeout)
        if not finished:
            src.up.set(0)
            src.duration.set(self.sample_timeout)
            if src.state != "hung":
                log.warning(
                    "telemetry source %s: sample still running after %.1fs; marked down until it returns",
                    name,
                    self.sample_timeout,
                )
            src.state = "hung"
            src.overran = "sample"
            return False
        src.duration.set(src.worker.duration)
        if src.worker.error is not None:
            self._failed(src, src.worker.error)
            return False
        src.up.set(1)
        src.last_success.set(self.clock())
        if src.state in ("failing", "hung"):
            log.info("telemetry source %s: sampling again", name)
        src.state = "up"
        src.samples += 1
        return True

    def _open(self, src: _Source) -> bool:
        src.worker.submit(src.sampler.open)
        if not src.worker.wait(self.sample_timeout):
            if src.state != "hung":
                log.warning(
                    "telemetry source %s: open still running after %.1fs; marked down", src.name, self.sample_timeout
                )
            src.state = "hung"
            src.overran = "open"
            return False
        return self._opened(src)

    def _opened(self, src: _Source) -> bool:
        """Act on the outcome of the source's finished ``open()``; True when it is ready to sample."""
        err = src.worker.error
        if isinstance(err, SourceUnavailable):
            # Its job stays and returns at once from now on (run_once). Removing it here, from
            # inside the job, hung the process whenever shutdown came first: APScheduler 3.11's
            # shutdown(wait=True) holds the lock remove_job needs while it waits for this job.
            src.state = "absent"
            src.up.set(0)
            log.info("telemetry source %s unavailable: %s (reported as collector_up 0, not sampled)", src.name, err)
            return False
        if err is not None:
            self._failed(src, err)
            return False
        src.opened = True
        return True

    def _failed(self, src: _Source, err: BaseException) -> None:
        src.up.set(0)
        src.failures += 1
        if src.state not in ("failing",):
            log.warning(
                "telemetry source %s: sample failed: %s: %s (logged once until it recovers)",
                src.name,
                type(err).__name__,
                err,
            )
        else:
            log.debug("telemetry source %s: sample failed again: %s", src.name, err)
        src.state = "failing"

    def shutdown(self) -> None:
        """Stop scheduling; close sources whose worker is idle (a hung one is left to die with us)."""
        if self._started:
            self._scheduler.shutdown(wait=True)
            self._started = False
        for src in self._sources.values():
            if src.opened and src.worker.wait(self.sample_timeout):
                try:
                    src.sampler.close()
                except Exception as exc:  # closing is best effort at the end of a run
                    log.debug("telemetry source %s: close failed: %s", src.name, exc)
            src.worker.close()
