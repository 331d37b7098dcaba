"""A server process soakd does not own (``--watch-pid``): its RSS and USS from /proc, the same
reads as soakd's own (:class:`~soakd.telemetry.host.ProcFS`, pointed at the pid).

One sampler per pid, so each has its own ``collector_up{source="target_process:PID"}``. The
first pid given is the server's main process: its samples are also the leak series
``target_rss`` / ``target_uss``; the others get gauges only. A process that exits is a failing
source (collector_up 0, one log line), never a crash.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.host import ProcFS
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore


class TargetProcessSampler:
    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        pid: int,
        *,
        leak_series: bool = True,
        proc_root: str | os.PathLike[str] = "/proc",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = f"target_process:{pid}"
        self.pid = pid
        self.series = series if leak_series else None
        self.proc_root = proc_root
        self.clock = clock
        self.proc: ProcFS | None = None
        self._rss = metrics.target_process_rss.labels(str(pid))
        self._uss = metrics.target_process_uss.labels(str(pid))

    def open(self) -> None:
        proc = ProcFS(self.proc_root, str(self.pid))
        if not proc.has_stat:
            raise SourceUnavailable(f"no process {self.pid} ({proc.pid_dir} missing)")
        self.proc = proc

    def sample(self) -> None:
        assert self.proc is not None
        pid_dir = self.proc.pid_dir
        try:
            rss = self.proc.read().rss
        except FileNotFoundError:
            raise ProcessLookupError(f"process {self.pid} has exited") from None
        now = self.clock()
        self._rss.set(rss)
        if self.series is not None:
            self.series.append("target_rss", now, rss)
        # smaps_rollup of another user's process needs ptrace rights: RSS alone then.
        uss = self.proc.uss() if self.proc.has_rollup and os.access(pid_dir / "smaps_rollup", os.R_OK) else None
        if uss is not None:
            self._uss.set(uss)
            if self.series is not None:
                self.series.append("target_uss", now, uss)

    def close(self) -> None:
        pass
