"""A server process soakd does not own: its RSS and USS from /proc, the same reads as soakd's own
(:class:`~soakd.telemetry.host.ProcFS`, pointed at the pid), and its GPU memory from NVML's
per-process list.

``--watch-pid PID`` watches one process; ``--watch-unit UNIT`` watches a systemd unit's
``MainPID`` and follows it when the unit restarts: whenever the pid it samples is gone (or its
number now names another process) it asks the resolver again, logs the new pid once, and goes
on with the same series. A restart is a level reset, not a drop and not a leak: the sampler
marks the leak series reset (:meth:`SeriesStore.mark_reset`), and the leak monitor judges them
from there, warm-up included.

One sampler per pid or unit, so each has its own ``collector_up{source="target_process:PID"}``
(``target_unit:UNIT``). The first one is the server's main process: its samples are also the
leak series ``target_rss`` / ``target_uss`` (and ``target_gpu_memory``); the others get gauges
only. A process that exits is a failing source (collector_up 0, one log line), never a crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from soakd.errors import TargetError
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.host import ProcFS
from soakd.telemetry.nvml import open_nvml, unsupported_errors
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore

log = logging.getLogger("soakd.telemetry")

TARGET_SERIES = ("target_rss", "target_uss", "target_gpu_memory")  # the main watched process's
_NOT_SUPPORTED = (3, 4, 13)  # NVML: NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND (no per-process list here)


class UnitResolver:
    """A systemd unit's ``MainPID`` from ``systemctl show`` (whichever ``systemctl`` is first on
    PATH: the tests put a fake one there, since this host need not run systemd as PID 1)."""

    def __init__(self, unit: str, *, systemctl: str = "systemctl", timeout: float = 1.5) -> None:
        self.unit = unit
        self.systemctl = systemctl
        self.timeout = timeout

    def main_pid(self) -> int | None:
        """The unit's main pid; None while it has none (stopped, starting). Raises TargetError
        when the unit is unknown or systemd cannot be asked."""
        exe = shutil.which(self.systemctl)
        if exe is None:
            raise TargetError(f"target.watch_unit: {self.unit}: no {self.systemctl} on PATH to ask systemd")
        try:
            res = subprocess.run(
                [exe, "show", "-p", "LoadState", "-p", "MainPID", "--", self.unit],
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TargetError(f"target.watch_unit: {self.unit}: systemctl failed: {exc}") from None
        if res.returncode != 0:
            why = (res.stderr or res.stdout).strip().splitlines()
            raise TargetError(
                f"target.watch_unit: {self.unit}: systemctl show exited {res.returncode}"
                + (f": {why[0]}" if why else "")
            )
        props = dict(line.partition("=")[::2] for line in res.stdout.splitlines() if "=" in line)
        if props.get("LoadState") != "loaded":
            raise TargetError(f"target.watch_unit: {self.unit}: unknown unit (LoadState={props.get('LoadState', '?')})")
        pid = props.get("MainPID", "0").strip()
        return int(pid) if pid.isdigit() and int(pid) > 0 else None


def _start_time(proc: ProcFS) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): a pid number reused by another
    process has another start time."""
    try:
        stat = (proc.pid_dir / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


class TargetProcessSampler:
    """RSS/USS of one watched pid, or of a unit's MainPID (``resolver``), followed across restarts."""

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        pid: int | None = None,
        *,
        resolver: UnitResolver | None = None,
        leak_series: bool = True,
        proc_root: str | os.PathLike[str] = "/proc",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (pid is None) == (resolver is None):
            raise ValueError("a pid or a unit resolver, one of them")
        self.resolver = resolver
        self.name = f"target_unit:{resolver.unit}" if resolver is not None else f"target_process:{pid}"
        self.pid = pid
        self.main = leak_series
        self.series = series if leak_series else None
        self.proc_root = proc_root
        self.clock = clock
        self.metrics = metrics
        self.proc: ProcFS | None = None
        self._started: str | None = None
        self.restarts = 0

    def open(self) -> None:
        if self.resolver is None:
            assert self.pid is not None
            proc = ProcFS(self.proc_root, str(self.pid))
            if not proc.has_stat:
                raise SourceUnavailable(f"no process {self.pid} ({proc.pid_dir} missing)")
            self._attach(self.pid, proc)
        # A unit: attach on the first sample (it may have no MainPID yet).

    def _attach(self, pid: int, proc: ProcFS) -> None:
        self.pid, self.proc, self._started = pid, proc, _start_time(proc)

    def _alive(self) -> bool:
        return self.proc is not None and self._started is not None and _start_time(self.proc) == self._started

    def _follow(self) -> None:
        """A unit's process is gone or was never found: ask systemd for its MainPID now."""
        assert self.resolver is not None
        unit, old = self.resolver.unit, self.pid
        pid = self.resolver.main_pid()
        if pid is None:  # stopped or starting: the scheduler logs the failure once
            raise ProcessLookupError(f"unit {unit} has no main process" + (f" (was pid {old})" if old else ""))
        proc = ProcFS(self.proc_root, str(pid))
        if not proc.has_stat:
            raise ProcessLookupError(f"unit {unit}: MainPID {pid} has no {proc.pid_dir}")
        if old is not None and old != pid:
            self._forget(old)
        self._attach(pid, proc)
        if old is None:
            log.info("watched unit %s: main process %d", unit, pid)
            return
        self.restarts += 1
        log.warning("watched unit %s restarted: main process %d -> %d (leak series reset)", unit, old, pid)
        if self.series is not None:
            self.series.mark_reset(TARGET_SERIES, self.clock(), f"unit {unit} restarted: pid {old} -> {pid}")

    def _forget(self, pid: int) -> None:
        """Drop the gauges of a pid that is gone: a stale value would read as current."""
        for gauge in (self.metrics.target_process_rss, self.metrics.target_process_uss):
            with contextlib.suppress(KeyError):
                gauge.remove(str(pid))

    def sample(self) -> None:
        if self.resolver is not None and not self._alive():
            self._follow()
        assert self.proc is not None and self.pid is not None
        pid_dir = self.proc.pid_dir
        try:
            rss = self.proc.read().rss
        except FileNotFoundError:
            raise ProcessLookupError(f"process {self.pid} has exited") from None
        now = self.clock()
        self.metrics.target_process_rss.labels(str(self.pid)).set(rss)
        if self.series is not None:
            self.series.append("target_rss", now, rss)
        # smaps_rollup of another user's process needs ptrace rights: RSS alone then.
        uss = self.proc.uss() if self.proc.has_rollup and os.access(pid_dir / "smaps_rollup", os.R_OK) else None
        if uss is not None:
            self.metrics.target_process_uss.labels(str(self.pid)).set(uss)
            if self.series is not None:
                self.series.append("target_uss", now, uss)

    def close(self) -> None:
        pass


class TargetGpuSampler:
    """NVML's per-process GPU memory of the watched processes (whatever pid each follows now):
    ``soakd_target_gpu_process_memory_bytes{pid,gpu}``, and the main process's sum over GPUs as
    the leak series ``target_gpu_memory``. A process without a context on a GPU is not listed
    there, and gets no number (a made-up 0 would hide a leak)."""

    name = "target_gpu"

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        watched: Sequence[TargetProcessSampler],
        nvml: Any = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.series = series
        self.watched = list(watched)
        self.nvml: Any = nvml  # the backend; None: pynvml, imported by open()
        self.clock = clock
        self.handles: list[Any] = []
        self._exported: set[tuple[str, str]] = set()

    def open(self) -> None:
        self.nvml, self.handles = open_nvml(self.nvml)

    def sample(self) -> None:
        nv = self.nvml
        pids = {str(w.pid): w for w in self.watched if w.pid is not None}
        main = next((str(w.pid) for w in self.watched if w.main and w.pid is not None), None)
        seen: dict[tuple[str, str], int] = {}
        for gpu, h in enumerate(self.handles):
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except unsupported_errors(nv) as exc:
                if not isinstance(exc, nv.NVMLError) or getattr(exc, "value", None) in _NOT_SUPPORTED:
                    continue
                raise
            for p in procs or ():
                key = (str(p.pid), str(gpu))
                if key[0] in pids and p.usedGpuMemory is not None:  # None: NVML cannot tell, not 0
                    seen[key] = seen.get(key, 0) + int(p.usedGpuMemory)
        gauge = self.metrics.target_gpu_process_memory
        for key in self._exported - seen.keys():  # a restarted or exited process's old pid
            with contextlib.suppress(KeyError):
                gauge.remove(*key)
        for key, used in seen.items():
            gauge.labels(*key).set(used)
        self._exported = set(seen)
        mine = [used for (pid, _), used in seen.items() if pid == main]
        if self.series is not None and mine:
            self.series.append("target_gpu_memory", self.clock(), sum(mine))

    def close(self) -> None:
        if self.handles:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.handles = []


def resolve_units(units: Sequence[str], resolver: Callable[[str], UnitResolver] = UnitResolver) -> list[UnitResolver]:
    """A resolver per unit, each asked once now: an unknown unit (or no systemd to ask) is a
    TargetError naming it, at start, before any load is sent. A known unit without a main
    process yet is fine: its sampler waits for one."""
    out = []
    for unit in dict.fromkeys(units):
        r = resolver(unit)
        r.main_pid()
        out.append(r)
    return out
