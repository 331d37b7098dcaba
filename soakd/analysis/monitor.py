"""The live leak monitor: judges every memory series in the SeriesStore on a schedule, keeps
one persistent verdict per series, exports the ``soakd_leak_*`` gauges, and reports flips.

``evaluate()`` is the whole job; the runner schedules it every ``leak.evaluate_interval`` on
the telemetry APScheduler. Verdict changes go to ``on_event(kind, detail)`` (logged too) so
the state store can keep them; evidence for a new suspicion comes from
:mod:`soakd.analysis.evidence`.

Two verdicts per series. The detector's (with persistence) says the troughs rise; the page
(``soakd_leak_suspected``, state "leak") adds the consequence: it is raised only when the
rise would exhaust the measured headroom within ``leak.horizon`` (unknown headroom: paged,
the consequence cannot be ruled out) and the evidence does not show allocator retention
(``malloc_trim(0)`` gave the growth back). A rise that is not paged is a finding (state "ok",
``finding`` "creep" or "allocator_retention", a ``leak_finding`` event, a finite
``soakd_memory_exhaustion_eta_seconds``): the summary and the report say it; nobody is woken."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import psutil

from soakd.analysis.detector import judge
from soakd.analysis.evidence import CUDA_SERIES, HOST_SERIES, TARGET_HOST_SERIES, CudaHistory, Evidence
from soakd.analysis.judgement import Judgement
from soakd.analysis.pages import beyond_horizon, early_why, held_early
from soakd.analysis.params import MIB, DetectorParams, floor_for, in_bytes
from soakd.analysis.replay import Persistence
from soakd.names import TARGET_METRIC_PREFIX
from soakd.state import default_state_dir
from soakd.telemetry.catalogue import LEAK_SERIES
from soakd.telemetry.series import SeriesStore

if TYPE_CHECKING:
    from soakd.config import LeakConfig
    from soakd.telemetry.catalogue import Metrics

log = logging.getLogger("soakd.leak")

OnEvent = Callable[[str, dict[str, Any]], None]
Limits = Callable[[str], "float | None"]  # headroom in bytes before the series' limit; None: unknown
# A rise that is not paged: "creep" (the headroom outlasts leak.horizon), "allocator_retention"
# (malloc_trim gave the growth back), "early" (too slow to page for how long it has gone on: a
# swing may make it; soakd.analysis.pages). soakd_leak_finding{finding} and SoakdMemoryGrowthFinding.
FINDINGS = ("creep", "allocator_retention", "early")


def host_available() -> float:
    return float(psutil.virtual_memory().available)


def default_limits(cuda_device: int | None = None, cuda_free: Callable[[], float] | None = None) -> Limits:
    """Host series: host available memory (psutil). CUDA series: free device memory
    (``torch.cuda.mem_get_info``: the device total minus what every process holds)."""
    if cuda_free is None and cuda_device is not None:
        import torch  # a CUDA run has it loaded; `soakd analyze` imports this module without it

        def cuda_free() -> float:
            return float(torch.cuda.mem_get_info(cuda_device)[0])

    def limits(series: str) -> float | None:
        if series in HOST_SERIES or series in TARGET_HOST_SERIES:  # both run out of this host's memory
            return host_available()
        if series in CUDA_SERIES and cuda_free is not None:
            return cuda_free()
        return None

    return limits


@dataclass(frozen=True)
class Verdict:
    """The latest verdict on one series, as /status, the summary and the report show it."""

    series: str
    state: str  # "leak" | "ok" | "not_judged" (warm-up, too short or too noisy to judge)
    suspected: bool
    slope_bytes_per_hour: float  # nan while not judged
    p_value: float  # over the run (compare with leak.alpha); 1.0 while not judged
    eta_seconds: float  # +inf when not growing, nan when the limit is unknown
    detectable_slope_bytes_per_hour: float  # caught with 90% probability at this noise; nan: not judged
    judged_seconds: float  # span of data judged
    reason: str
    judgement: Judgement
    finding: str = ""  # a rise that is not paged: one of FINDINGS

    @classmethod
    def of(cls, series: str, suspected: bool, j: Judgement, eta: float, finding: str = "", why: str = "") -> Verdict:
        judged = j.judged and math.isfinite(j.detectable_bytes_per_hour)
        state = "leak" if suspected else "ok" if judged else "not_judged"
        # A rise kept by its signs says so and shows the rise that holds it, never "no leak above".
        shown = j.reason if j.positive else f"still holding: troughs rise {j.slope_bytes_per_hour / MIB:.2f} MiB/h"
        reason = f"leak suspected and {shown}" if suspected and not j.positive else j.reason
        if finding:
            reason = f"{why} ({shown})"
        return cls(
            series,
            state,
            suspected,
            j.slope_bytes_per_hour,
            j.p_value if j.judged else 1.0,
            eta,
            j.detectable_bytes_per_hour if judged else math.nan,
            j.judged_seconds,
            reason,
            j,
            finding,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers as None, except an infinite ETA as None too)."""

        def num(x: float, digits: int | None = None) -> float | None:
            return None if not math.isfinite(x) else (round(x, digits) if digits is not None else float(x))

        return {
            "state": self.state,
            "suspected": self.suspected,
            "slope_bytes_per_hour": num(self.slope_bytes_per_hour, 1),
            "p_value": num(self.p_value) if self.state != "not_judged" else None,
            "exhaustion_eta_seconds": num(self.eta_seconds, 0),
            "detectable_slope_bytes_per_hour": num(self.detectable_slope_bytes_per_hour, 1),
            "judged_seconds": round(self.judged_seconds, 1),
            "reason": self.reason,
            "finding": self.finding or None,
        }


class LeakMonitor:
    """Judges ``series`` (default: every leak series) from ``store``; thread-safe ``evaluate``."""

    name = "leak"

    def __init__(
        self,
        store: SeriesStore,
        metrics: Metrics | None,
        cfg: LeakConfig,
        limits: Limits | None = None,
        on_event: OnEvent | None = None,
        *,
        evidence: Evidence | None = None,
        since: float | None = None,
        clock: Callable[[], float] = time.time,
        series: Sequence[str] = LEAK_SERIES,
    ) -> None:
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
        self._states: dict[str, Persistence] = {}  # the detector's verdict, with persistence
        self._paged: set[str] = set()  # series whose rise is paged (soakd_leak_suspected)
        self._findings: dict[str, tuple[str, str]] = {}  # series -> (finding, why) while it rises unpaged
        self._lock = threading.Lock()

    # The scheduler-facing trio (open, evaluate, close).
    def open(self) -> None:
        if self.evidence is not None:
            self.evidence.open()

    def close(self) -> None:
        if self.evidence is not None:
            self.evidence.close()

    def evaluate(self, now: float | None = None, *, final: bool = False) -> dict[str, Verdict]:
        """Judge every series that has data; update gauges; report flips. Returns the verdicts.
        ``final``: the run's closing look, which has no later to wait for (no early hold)."""
        with self._lock:
            now = self.clock() if now is None else now
            if self.evidence is not None:
                self.evidence.tick()
            for name in self._names():
                t, v = self.store.read(name)
                reset = self.store.reset_at(name)
                if reset is not None:  # a watched server restarted: its new process from there on
                    keep = t >= reset
                    t, v = t[keep], v[keep]
                if t.size == 0:
                    continue
                try:
                    since = self.since if reset is None else max(self.since, reset)
                    self._evaluate_one(name, t, v, now, since=since, final=final)
                except Exception:  # one bad series must not stop the others
                    log.exception("leak evaluation of %s failed", name)
            return dict(self._verdicts)

    def _names(self) -> list[str]:
        """The configured series, then every scraped server gauge the store has (their names
        are known only once a scrape has found them)."""
        extra = [n for n in self.store.names() if n.startswith(TARGET_METRIC_PREFIX) and n not in self.series]
        return [*self.series, *extra]

    def verdicts(self) -> dict[str, Verdict]:
        """The latest verdict per judged series (the session reads these, never the gauges). No
        lock: copying a dict is atomic under the GIL, and /status must not wait for an evaluation."""
        return dict(self._verdicts)

    def _evaluate_one(self, name: str, t: Any, v: Any, now: float, *, since: float, final: bool = False) -> None:
        floor = floor_for(name, self.cfg.min_slope_bytes_per_hour, self.params.floor_scale)
        j = judge(t, v, self.params, floor, now=now, since=since)
        state = self._states.setdefault(name, Persistence(self.params.persistence))
        state.update(now, j.keeps(state.suspected), j.refutes)
        eta = self._eta(name, j)
        was = name in self._paged
        evidence: dict[str, Any] = {}
        if not state.suspected:
            self._paged.discard(name)
            self._findings.pop(name, None)
        elif not was and (j.positive or final) and self._findings.get(name, ("", ""))[0] != "allocator_retention":
            # A rise the detector is sure of at this look (not one only held by persistence, but
            # at the run's closing look, which has no later): page it only when it matters within
            # the horizon, and only if the allocator does not give it back (probed once per rise).
            finding, why = self._beyond_horizon(name, j)
            if not finding and held_early(j, final=final, in_bytes=in_bytes(name)):  # too young a rise
                finding, why = "early", early_why(j)
            if not finding:  # worth a page: the evidence may still show the allocator keeps it
                evidence = self._evidence(name, j, now)
                finding, why = self._retention(evidence)
            if finding:
                if self._findings.get(name, ("", ""))[0] != finding:
                    self._finding_event(name, j, eta, finding, why, evidence)
                self._findings[name] = (finding, why)
            else:
                self._findings.pop(name, None)
                self._paged.add(name)
        paged = name in self._paged
        finding, why = self._findings.get(name, ("", ""))
        verdict = Verdict.of(name, paged, j, eta, finding, why)
        self._verdicts[name] = verdict
        self._export(verdict)
        if paged != was:
            self._report(verdict, now, evidence)
        if self.evidence is not None:
            # Through warm-up too: a strong leak is flagged at its first judgement, and the
            # snapshot then still has the allocations that led up to it.
            self.evidence.building(name, not state.suspected and (j.building or not j.judged))

    def _evidence(self, name: str, j: Judgement, now: float) -> dict[str, Any]:
        """Evidence for a rise about to be paged (the snapshot needs the ring still on)."""
        if self.evidence is None:
            return {}
        growth = max(0.0, j.slope_bytes_per_hour) * max(0.0, now - j.start) / 3600.0
        return self.evidence.collect(name, growth)

    def _beyond_horizon(self, name: str, j: Judgement) -> tuple[str, str]:
        """("creep", why) when the headroom may outlast ``leak.horizon``: judged at the rate's
        90% lower bound, so a page's consequence is likely, not just possible. Else ("", "")."""
        headroom = self.limits(name)
        if headroom is None:
            return "", ""  # the consequence cannot be measured, so it cannot be ruled out
        why = beyond_horizon(j, headroom, self.cfg.horizon)
        return ("creep", why) if why else ("", "")

    @staticmethod
    def _retention(evidence: dict[str, Any]) -> tuple[str, str]:
        """("allocator_retention", why) when malloc_trim gave the growth back; else ("", "")."""
        if evidence.get("allocator_retention"):
            released = float(evidence.get("malloc_trim_released_bytes", 0.0)) / MIB
            return "allocator_retention", f"allocator retention, not a leak: malloc_trim gave back {released:.1f} MiB"
        return "", ""

    def _finding_event(
        self, name: str, j: Judgement, eta: float, finding: str, why: str, evidence: dict[str, Any]
    ) -> None:
        log.info("memory finding in %s: %s; %s", name, why, j.reason)
        if self.on_event is None:
            return
        detail = {
            "series": name,
            "finding": finding,
            "slope_bytes_per_hour": round(j.slope_bytes_per_hour, 1),
            "exhaustion_eta_seconds": None if not math.isfinite(eta) else round(eta),
            "reason": f"{why} ({j.reason})",
            **evidence,
        }
        try:
            self.on_event("leak_finding", detail)
        except Exception:
            log.exception("leak event callback failed")

    def _eta(self, name: str, j: Judgement) -> float:
        slope = j.slope_bytes_per_hour
        if not (math.isfinite(slope) and slope > 0 and (j.positive or j.holds)):
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
        m.leak_detectable_slope.labels(s).set(v.detectable_slope_bytes_per_hour)
        for kind in FINDINGS:  # every kind exported, so the info alert resolves when a finding ends
            m.leak_finding.labels(s, kind).set(1 if v.finding == kind else 0)

    def _report(self, v: Verdict, now: float, evidence: dict[str, Any]) -> None:
        j = v.judgement
        detail: dict[str, Any] = {
            "series": v.series,
            "slope_bytes_per_hour": round(j.slope_bytes_per_hour, 1),
            "p_value": j.p_value,
            "exhaustion_eta_seconds": None if not math.isfinite(v.eta_seconds) else round(v.eta_seconds),
            "judged_from": j.start,
            "detectable_slope_bytes_per_hour": None
            if not math.isfinite(v.detectable_slope_bytes_per_hour)
            else round(v.detectable_slope_bytes_per_hour, 1),
            "reason": j.reason,
        }
        if v.suspected:
            kind = "leak_suspected"
            detail.update(evidence)
            log.warning(
                "leak suspected in %s: %s; exhaustion in %s",
                v.series,
                j.reason,
                "never" if not math.isfinite(v.eta_seconds) else f"{v.eta_seconds / 3600:.1f} h",
            )
        else:
            kind = "leak_cleared"
            log.info("leak verdict cleared for %s: %s", v.series, j.reason)
        if self.on_event is not None:
            try:
                self.on_event(kind, detail)
            except Exception:
                log.exception("leak event callback failed")


def monitor_for_run(
    cfg: Any,
    metrics: Metrics,
    store: SeriesStore,
    cuda_device: int | None,
    on_event: OnEvent | None = None,
    *,
    cycle: float | None = None,
) -> LeakMonitor:
    """The monitor ``soakd run`` uses: real limits, evidence into the state dir. ``cycle``: the
    load's period when the phases repeat evenly (``[leak] cycle`` wins over it)."""

    lk: LeakConfig = cfg.leak
    if lk.cycle is None and cycle is not None:
        lk = replace(lk, cycle=cycle)
        log.info("leak verdicts judge memory cycle by cycle: the load repeats every %.0f s", cycle)
    cuda = None
    if cuda_device is not None:  # leak.cuda_history decides when it records; "off" still snapshots
        cuda = CudaHistory(lk.cuda_history_max_entries, cuda_device)
    evidence = Evidence(
        default_state_dir(cfg.state.dir), cuda_history=lk.cuda_history, cuda=cuda, malloc_trim=lk.malloc_trim_probe
    )
    return LeakMonitor(store, metrics, lk, default_limits(cuda_device), on_event, evidence=evidence)
