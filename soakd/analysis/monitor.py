"""The live leak monitor: judges every memory series in the SeriesStore on a schedule, keeps
one persistent verdict per series, exports the ``soakd_leak_*`` gauges, and reports flips.

``evaluate()`` is the whole job; the runner schedules it every ``leak.evaluate_interval`` on
the telemetry APScheduler. Verdict changes go to ``on_event(kind, detail)`` (logged too) so
the state store can keep them; evidence for a new suspicion comes from
:mod:`soakd.analysis.evidence`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from soakd.analysis.detector import DetectorParams, Judgement, Persistence, floor_for, judge
from soakd.analysis.evidence import CUDA_SERIES, HOST_SERIES, Evidence
from soakd.telemetry.catalogue import LEAK_SERIES
from soakd.telemetry.series import SeriesStore

if TYPE_CHECKING:
    from soakd.config import LeakConfig
    from soakd.telemetry.catalogue import Metrics

log = logging.getLogger("soakd.leak")

OnEvent = Callable[[str, dict[str, Any]], None]
Limits = Callable[[str], "float | None"]  # headroom in bytes before the series' limit; None: unknown
MIB = float(1 << 20)


def host_available() -> float:
    import psutil

    return float(psutil.virtual_memory().available)


def default_limits(cuda_device: int | None = None,
                   cuda_free: Callable[[], float] | None = None) -> Limits:
    """Host series: host available memory (psutil). CUDA series: free device memory
    (``torch.cuda.mem_get_info``: the device total minus what every process holds)."""
    if cuda_free is None and cuda_device is not None:
        import torch

        def cuda_free() -> float:
            return float(torch.cuda.mem_get_info(cuda_device)[0])

    def limits(series: str) -> float | None:
        if series in HOST_SERIES:
            return host_available()
        if series in CUDA_SERIES and cuda_free is not None:
            return cuda_free()
        return None

    return limits


@dataclass(frozen=True)
class Verdict:
    series: str
    suspected: bool
    judgement: Judgement
    eta_seconds: float  # +inf when not growing, nan when the limit is unknown


class LeakMonitor:
    """Judges ``series`` (default: every leak series) from ``store``; thread-safe ``evaluate``."""

    name = "leak"

    def __init__(self, store: SeriesStore, metrics: Metrics | None, cfg: LeakConfig,
                 limits: Limits | None = None, on_event: OnEvent | None = None, *,
                 evidence: Evidence | None = None, since: float | None = None,
                 clock: Callable[[], float] = time.time, series: Sequence[str] = LEAK_SERIES) -> None:
        self.store = store
        self.metrics = metrics
        self.cfg = cfg
        self.params = DetectorParams.from_config(cfg)
        self.limits = limits or default_limits()
        self.on_event = on_event
        self.evidence = evidence
        self.clock = clock
        self.since = clock() if since is None else since  # the run's start: warm-up counts from here
        self.series = tuple(series)
        self._verdicts: dict[str, Verdict] = {}
        self._states: dict[str, Persistence] = {}
        self._lock = threading.Lock()

    # The scheduler-facing trio (open, evaluate, close).
    def open(self) -> None:
        if self.evidence is not None:
            self.evidence.open()

    def close(self) -> None:
        if self.evidence is not None:
            self.evidence.close()

    def evaluate(self, now: float | None = None) -> dict[str, Verdict]:
        """Judge every series that has data; update gauges; report flips. Returns the verdicts."""
        with self._lock:
            now = self.clock() if now is None else now
            if self.evidence is not None:
                self.evidence.tick()
            for name in self.series:
                t, v = self.store.read(name)
                if t.size == 0:
                    continue
                try:
                    self._evaluate_one(name, t, v, now)
                except Exception:  # one bad series must not stop the others
                    log.exception("leak evaluation of %s failed", name)
            return dict(self._verdicts)

    def verdicts(self) -> dict[str, Verdict]:
        """The latest verdict per judged series (the session reads these, never the gauges). No
        lock: copying a dict is atomic under the GIL, and /status must not wait for an evaluation."""
        return dict(self._verdicts)

    def _evaluate_one(self, name: str, t: Any, v: Any, now: float) -> None:
        floor = floor_for(name, self.cfg.min_slope_bytes_per_hour)
        j = judge(t, v, self.params, floor, now=now, since=self.since)
        state = self._states.setdefault(name, Persistence(self.params.persistence))
        flipped = state.update(now, j.keeps(state.suspected))
        eta = self._eta(name, j)
        verdict = Verdict(name, state.suspected, j, eta)
        self._verdicts[name] = verdict
        self._export(verdict)
        if flipped:
            self._report(verdict, now)  # evidence first: the snapshot needs the ring still on
        if self.evidence is not None:
            self.evidence.building(name, state.rising)

    def _eta(self, name: str, j: Judgement) -> float:
        slope = j.slope_bytes_per_hour
        if not (math.isfinite(slope) and slope > 0 and j.p_value < self.params.alpha):
            return math.inf
        headroom = self.limits(name)
        if headroom is None:
            return math.nan
        return max(0.0, headroom) / (slope / 3600.0)

    def _export(self, v: Verdict) -> None:
        if self.metrics is None:
            return
        m, s, j = self.metrics, v.series, v.judgement
        m.leak_suspected.labels(s).set(1 if v.suspected else 0)
        m.leak_slope.labels(s).set(j.slope_bytes_per_hour)
        m.leak_p_value.labels(s).set(j.p_value if math.isfinite(j.slope_bytes_per_hour) else math.nan)
        m.memory_exhaustion_eta.labels(s).set(v.eta_seconds)

    def _report(self, v: Verdict, now: float) -> None:
        j = v.judgement
        detail: dict[str, Any] = {
            "series": v.series,
            "slope_bytes_per_hour": round(j.slope_bytes_per_hour, 1),
            "p_value": j.p_value,
            "exhaustion_eta_seconds": None if not math.isfinite(v.eta_seconds) else round(v.eta_seconds),
            "judged_from": j.start,
            "reason": j.reason,
        }
        if v.suspected:
            kind = "leak_suspected"
            if self.evidence is not None:
                growth = max(0.0, j.slope_bytes_per_hour) * max(0.0, now - j.start) / 3600.0
                detail.update(self.evidence.collect(v.series, growth))
            log.warning("leak suspected in %s: %s; exhaustion in %s", v.series, j.reason,
                        "never" if not math.isfinite(v.eta_seconds) else f"{v.eta_seconds / 3600:.1f} h")
        else:
            kind = "leak_cleared"
            log.info("leak verdict cleared for %s: %s", v.series, j.reason)
        if self.on_event is not None:
            try:
                self.on_event(kind, detail)
            except Exception:
                log.exception("leak event callback failed")


def monitor_for_run(cfg: Any, metrics: Metrics, store: SeriesStore, cuda_device: int | None,
                    on_event: OnEvent | None = None) -> LeakMonitor:
    """The monitor ``soakd run`` uses: real limits, evidence into the state dir."""
    from soakd.store import default_state_dir

    lk: LeakConfig = cfg.leak
    cuda = None
    if cuda_device is not None:  # leak.cuda_history decides when it records; "off" still snapshots
        from soakd.analysis.evidence import CudaHistory

        cuda = CudaHistory(lk.cuda_history_max_entries, cuda_device)
    evidence = Evidence(default_state_dir(cfg.state.dir), cuda_history=lk.cuda_history, cuda=cuda,
                        malloc_trim=lk.malloc_trim_probe)
    return LeakMonitor(store, metrics, lk, default_limits(cuda_device), on_event, evidence=evidence)
