"""Host memory and process samplers: /proc (RSS, USS, CPU, threads, fds), glibc malloc, tracemalloc.

The process numbers come from ``{proc_root}/self/...`` files, so tests point ``proc_root`` at
a fake tree. USS comes from ``smaps_rollup`` (Linux >= 4.14), one pre-summed record that is
far cheaper to parse than ``smaps``; where the kernel lacks it psutil's full smaps walk is the
fallback. Off Linux, psutil supplies everything but USS.

USS is its own source: the kernel walks the page tables to answer (measured here about 80 ms
per GiB resident), so on a process with tens of GiB resident it can take seconds, and must
not hold up RSS, CPU and the rest, which come from cheap counters (statm, stat).
"""

from __future__ import annotations

import ctypes
import os
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore

_KB = 1024


@dataclass(frozen=True)
class ProcessReading:
    rss: int
    cpu_seconds: float
    threads: int
    open_fds: int | None
    host_available: int


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """``Rss:  1668 kB`` lines -> {"Rss": 1708032, ...} in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key] = int(parts[0]) * _KB
    return out


def uss_from_rollup(fields: dict[str, int]) -> int:
    """Private pages only: what the process would give back if it exited (psutil's definition)."""
    return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0) + fields.get("Private_Hugetlb", 0)


class ProcFS:
    """Reads this process's numbers from a procfs tree (``/proc`` or a test's fake one)."""

    def __init__(self, root: str | os.PathLike[str] = "/proc", pid: str = "self") -> None:
        self.root = Path(root)
        self.pid_dir = self.root / pid
        self._clk_tck = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.has_rollup = (self.pid_dir / "smaps_rollup").is_file()
        self.has_stat = (self.pid_dir / "stat").is_file()
        self._psutil_pid = None if pid == "self" else int(pid)  # psutil.Process(None) is this process
        self._process = psutil.Process(self._psutil_pid) if not self.has_stat else None

    def read(self) -> ProcessReading:
        if self._process is not None:  # not Linux: psutil covers all but USS
            with self._process.oneshot():
                mem = self._process.memory_info()
                cpu = self._process.cpu_times()
                nfds = self._process.num_fds() if hasattr(self._process, "num_fds") else None
                return ProcessReading(
                    mem.rss,
                    cpu.user + cpu.system,
                    self._process.num_threads(),
                    nfds,
                    int(psutil.virtual_memory().available),
                )
        rss = int((self.pid_dir / "statm").read_text().split()[1]) * self._page
        stat = (self.pid_dir / "stat").read_text()
        # Fields after the parenthesised command (which may contain spaces): state is field 3.
        fields = stat[stat.rindex(")") + 2 :].split()
        utime, stime, threads = int(fields[11]), int(fields[12]), int(fields[17])
        try:
            fds: int | None = len(os.listdir(self.pid_dir / "fd"))
        except OSError:
            fds = None
        return ProcessReading(rss, (utime + stime) / self._clk_tck, threads, fds, self._available())

    def uss(self) -> int | None:
        """Private bytes (smaps_rollup, else psutil's smaps walk on the real /proc, else None)."""
        if self.has_rollup:
            return uss_from_rollup(parse_smaps_rollup((self.pid_dir / "smaps_rollup").read_text()))
        if self.root == Path("/proc"):
            return int(psutil.Process(self._psutil_pid).memory_full_info().uss)
        return None

    def _available(self) -> int:
        for line in (self.root / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * _KB
        return int(psutil.virtual_memory().available)


class _ProcSampler:
    """A sampler that reads ``/proc`` (or a fake root) into the metrics and the series store."""

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        proc: ProcFS | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.series = series
        self.proc = proc if proc is not None else ProcFS()
        self.clock = clock


class HostSampler(_ProcSampler):
    """RSS, CPU seconds, threads, open fds, host available memory."""

    name = "host"

    def open(self) -> None:
        pass

    def sample(self) -> None:
        r = self.proc.read()
        now = self.clock()
        m = self.metrics
        m.process_rss.set(r.rss)
        m.process_cpu.set([], r.cpu_seconds)
        m.process_threads.set(r.threads)
        m.host_available.set(r.host_available)
        if r.open_fds is not None:
            m.process_open_fds.set(r.open_fds)
        if self.series is not None:
            self.series.append("host_rss", now, r.rss)

    def close(self) -> None:
        pass


class UssSampler(_ProcSampler):
    """Unique set size: what the process would give back on exit, the truest leak signal."""

    name = "host_uss"

    def open(self) -> None:
        if self.proc.uss() is None:
            raise SourceUnavailable(f"no {self.proc.pid_dir}/smaps_rollup")

    def sample(self) -> None:
        uss = self.proc.uss()
        if uss is None:
            raise FileNotFoundError(f"{self.proc.pid_dir}/smaps_rollup")
        self.metrics.process_uss.set(uss)
        if self.series is not None:
            self.series.append("host_uss", self.clock(), uss)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- glibc malloc


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): size_t fields, no 2 GiB wrap like ``mallinfo``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


MallInfoFn = Callable[[], MallInfo2]


def glibc_mallinfo2() -> MallInfoFn:
    """The real ``mallinfo2``; raises SourceUnavailable off glibc or before glibc 2.33."""
    # dlopen(NULL): the symbols this process already has, the C library's among them. Not
    # ctypes.util.find_library("c"), which starts an ldconfig process to find a file name.
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        raise SourceUnavailable("no glibc mallinfo2() in this process's C library") from None
    fn.restype = MallInfo2
    fn.argtypes = []
    return fn


class MallocSampler:
    """glibc malloc: arena (arena + hblkhd), in use (uordblks + hblkhd), free (fordblks)."""

    name = "malloc"

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        mallinfo2: MallInfoFn | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.series = series
        self._fn = mallinfo2
        self.clock = clock

    def open(self) -> None:
        if self._fn is None:
            self._fn = glibc_mallinfo2()

    def sample(self) -> None:
        assert self._fn is not None
        mi = self._fn()
        in_use = mi.uordblks + mi.hblkhd
        self.metrics.malloc_arena.set(mi.arena + mi.hblkhd)
        self.metrics.malloc_in_use.set(in_use)
        self.metrics.malloc_free.set(mi.fordblks)
        if self.series is not None:
            self.series.append("malloc_in_use", self.clock(), in_use)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- tracemalloc


class TracemallocSampler:
    """Python allocations traced (config memory.tracemalloc; costs every allocation, so off by default)."""

    name = "tracemalloc"

    def __init__(self, metrics: Metrics, frames: int = 1) -> None:
        self.metrics = metrics
        self.frames = frames
        self._started_here = False

    def open(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
            self._started_here = True

    def sample(self) -> None:
        current, _peak = tracemalloc.get_traced_memory()
        self.metrics.tracemalloc_traced.set(current)

    def close(self) -> None:
        if self._started_here:
            tracemalloc.stop()
