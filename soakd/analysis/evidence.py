"""Evidence gathered when a leak verdict flips to suspected, so the verdict can be acted on.

* CUDA series: a torch memory snapshot (``torch.cuda.memory._dump_snapshot``, loadable in
  https://pytorch.org/memory_viz) written to the state dir. Allocation stack traces come from
  ``torch.cuda.memory._record_memory_history(max_entries=N)``, a bounded ring that is on only
  through warm-up and while suspicion builds (``leak.cuda_history = "auto"``: a strong leak is
  flagged at its first judgement), always (``"always"``), or
  never (``"off"``: the snapshot then has segments and blocks without traces).
* Host series: whether ``malloc_trim(0)`` gives the memory back (glibc keeping freed memory
  is allocator retention, not a leak) and, when tracemalloc is tracing, the allocation sites
  that grew most since the monitor started.

torch is imported only by :class:`CudaHistory`, which is built only for a CUDA run.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("soakd.leak")

HOST_SERIES = frozenset({"host_rss", "host_uss", "malloc_in_use"})  # soakd's own host memory
TARGET_HOST_SERIES = frozenset({"target_rss", "target_uss"})  # a watched server's: same limit, no probes here
CUDA_SERIES = frozenset({"torch_cuda_allocated", "torch_cuda_reserved", "gpu_process_memory", "gpu_memory_used"})
TOP_SITES = 10


class CudaHistory:
    """torch's allocation history ring: on and off on demand, always bounded."""

    def __init__(self, max_entries: int, device: int | None = None) -> None:
        import torch  # CUDA runs only: `soakd analyze` imports this package without torch

        # torch again: the flag the snapshot sampler reads lives beside it
        from soakd.telemetry.torch_cuda import HISTORY_RECORDING

        self._torch = torch
        self._flag = HISTORY_RECORDING
        self.max_entries = max_entries
        self.device = device
        self.recording = False
        self.unavailable: str | None = None  # why this allocator keeps no history (said once)
        try:
            backend = torch.cuda.get_allocator_backend()
        except (AttributeError, RuntimeError):  # a torch built without CUDA
            backend = "native"
        if backend != "native":
            self._give_up(f"the {backend} allocator (PYTORCH_CUDA_ALLOC_CONF backend:{backend}) keeps no history")

    def _give_up(self, why: str) -> None:
        self.unavailable = why
        log.warning("leak.cuda_history: %s: leak verdicts go on without allocation history or memory snapshots", why)

    def start(self) -> None:
        if self.recording or self.unavailable:
            return
        try:
            # Python stacks only: symbolising C++ frames makes a dump take minutes.
            self._torch.cuda.memory._record_memory_history(
                max_entries=self.max_entries, stacks="python", device=self.device
            )
        except RuntimeError as exc:  # an allocator that cannot record: say so once, go on
            self._give_up(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return
        self.recording = True
        self._flag.set()
        log.info("recording CUDA allocation history (ring of %d entries)", self.max_entries)

    def stop(self) -> None:
        if self.recording:
            self._torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
            self.recording = False
            self._flag.clear()

    def dump(self, path: Path) -> None:
        self._torch.cuda.memory._dump_snapshot(str(path))  # type: ignore[no-untyped-call]


def _libc_malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)``; None where there is no glibc (musl, macOS)."""
    try:  # dlopen(NULL), not ctypes.util.find_library("c"): that starts an ldconfig process
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


def _rss() -> float:
    return float(psutil.Process().memory_info().rss)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class Evidence:
    """Collects evidence for a series whose verdict flips; the monitor drives it."""

    def __init__(
        self,
        state_dir: Path | None,
        *,
        cuda_history: str = "auto",
        cuda: CudaHistory | None = None,
        malloc_trim: Callable[[], int] | bool | None = True,
        rss: Callable[[], float] = _rss,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = state_dir
        self.mode = cuda_history
        self.cuda = cuda
        if malloc_trim is True:
            self.malloc_trim: Callable[[], int] | None = _libc_malloc_trim()
        elif malloc_trim is False:
            self.malloc_trim = None
        else:
            self.malloc_trim = malloc_trim
        self.rss = rss
        self.clock = clock
        self._building: set[str] = set()  # CUDA series whose suspicion is building
        self._baseline: tracemalloc.Snapshot | None = None
        if self.cuda is not None and self.mode == "always":
            self.cuda.start()

    def open(self) -> None:
        self.tick()

    def tick(self) -> None:
        """Every evaluation: the tracemalloc baseline, as soon as tracing is on (the telemetry
        source may start it after the monitor opened)."""
        if self._baseline is None and tracemalloc.is_tracing():
            self._baseline = tracemalloc.take_snapshot()

    def close(self) -> None:
        if self.cuda is not None:
            self.cuda.stop()
        self._baseline = None

    # ---------------------------------------------------------------- suspicion building

    def building(self, series: str, rising: bool) -> None:
        """Called every evaluation: ``rising`` while not judged yet (warm-up) or near a leak (p within 20x alpha)."""
        if series not in CUDA_SERIES or self.cuda is None or self.mode != "auto":
            return
        if rising:
            self._building.add(series)
        else:
            self._building.discard(series)
        if self._building:
            self.cuda.start()
        else:
            self.cuda.stop()

    # ---------------------------------------------------------------- on a flip

    def collect(self, series: str, growth_bytes: float) -> dict[str, Any]:
        """Evidence for ``series`` just judged leaking; ``growth_bytes`` is the growth judged."""
        try:
            if series in CUDA_SERIES:
                return self._cuda_snapshot(series)
            if series in HOST_SERIES:
                return {**self._trim_probe(growth_bytes), **self._top_sites()}
        except Exception as exc:  # evidence must never take the monitor down
            log.warning("leak evidence for %s failed: %s", series, exc)
            return {"evidence_error": str(exc)}
        return {}

    def _cuda_snapshot(self, series: str) -> dict[str, Any]:
        if self.cuda is None:
            return {}
        if self.cuda.unavailable:
            return {"snapshot": None, "snapshot_error": self.cuda.unavailable}
        if self.state_dir is None:
            return {"snapshot": None, "snapshot_error": "no state dir"}
        self.state_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        path = self.state_dir / f"leak-{_safe(series)}-{stamp}-{os.getpid()}.pickle"
        traced = self.cuda.recording
        self.cuda.dump(path)
        if self.mode == "auto" and not self._building - {series}:
            self.cuda.stop()  # dumped; the ring goes off until suspicion builds again
        self._building.discard(series)
        log.warning("CUDA memory snapshot for %s written to %s (open in https://pytorch.org/memory_viz)", series, path)
        return {"snapshot": str(path), "allocation_history": traced}

    def _trim_probe(self, growth_bytes: float) -> dict[str, Any]:
        if self.malloc_trim is None:
            return {}
        before = self.rss()
        self.malloc_trim()
        released = max(0.0, before - self.rss())
        # Most of the growth came back: glibc was holding freed memory, not a leak.
        retention = bool(growth_bytes > 0 and released >= 0.5 * growth_bytes)  # a JSON bool, not numpy's
        return {"malloc_trim_released_bytes": released, "allocator_retention": retention}

    def _top_sites(self) -> dict[str, Any]:
        if self._baseline is None or not tracemalloc.is_tracing():
            return {}
        stats = tracemalloc.take_snapshot().compare_to(self._baseline, "lineno")
        growing = [s for s in stats if s.size_diff > 0][:TOP_SITES]
        sites = [
            {"site": str(s.traceback), "size_diff_bytes": s.size_diff, "count_diff": s.count_diff} for s in growing
        ]
        return {"top_growing_sites": sites}
