"""torch's CUDA caching allocator, read from ``memory_stats()``, ``mem_get_info()`` and, on a
slower schedule, ``memory_snapshot()`` (largest free block). Read-only: torch's peak and
accumulated counters are never reset, so a user's own ``memory_summary()`` stays true.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore

POOLS = {"all": "all", "large_pool": "large", "small_pool": "small"}
log = logging.getLogger("soakd.telemetry")

# Set while soakd records torch's allocation history (analysis/evidence.py's CudaHistory): a
# snapshot on a torch without include_traces then symbolises the whole history ring.
HISTORY_RECORDING = threading.Event()


class CudaBackend(Protocol):
    """The slice of ``torch.cuda`` the samplers read; tests pass a fake with recorded answers."""

    def is_available(self) -> bool: ...

    def memory_stats(self, device: int) -> Mapping[str, Any]: ...

    def mem_get_info(self, device: int) -> tuple[int, int]: ...

    def memory_snapshot(self) -> Sequence[Mapping[str, Any]] | None: ...


class TorchCuda:
    """The real backend. Each method imports torch where it reads it: the samplers of a run with
    no CUDA device (a served target's: no model here) stop at ``open()`` and never load it."""

    def is_available(self) -> bool:
        import torch  # in-process only: a served target's soak never loads torch

        return bool(torch.cuda.is_available())

    def memory_stats(self, device: int) -> Mapping[str, Any]:
        import torch  # in-process only: a served target's soak never loads torch

        return torch.cuda.memory_stats(device)

    def mem_get_info(self, device: int) -> tuple[int, int]:
        import torch  # in-process only: a served target's soak never loads torch

        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    @functools.cached_property
    def skips_traces(self) -> bool:
        """memory_snapshot(include_traces=False) arrived in torch 2.11 (pytorch PR 172672); before
        it every snapshot symbolises the allocation-history ring with the GIL held (~0.7 s at
        100k entries), so while soakd records history the snapshot is not read at all."""
        import torch  # in-process only: a served target's soak never loads torch

        return "include_traces" in inspect.signature(torch.cuda.memory_snapshot).parameters

    def memory_snapshot(self) -> Sequence[Mapping[str, Any]] | None:
        """The segments, or None when reading them now would symbolise the history ring."""
        import torch  # in-process only: a served target's soak never loads torch

        if self.skips_traces:
            snap = torch.cuda.memory_snapshot(include_traces=False)  # type: ignore[no-untyped-call,unused-ignore]
        elif HISTORY_RECORDING.is_set():
            return None
        else:
            snap = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call,unused-ignore]
        return list(snap)


def _device_label(index: int) -> str:
    return f"cuda:{index}"


def _check_devices(backend: CudaBackend, devices: Sequence[int]) -> None:
    if not devices:
        raise SourceUnavailable("the model does not run on a CUDA device")
    if not backend.is_available():
        raise SourceUnavailable("CUDA is not available")


class TorchCudaSampler:
    """Allocator bytes per pool, segments, retries, OOMs, device allocs/frees, fragmentation."""

    name = "torch_cuda"

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        devices: Sequence[int],
        backend: CudaBackend | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.series = series
        self.devices = list(devices)
        self.backend: CudaBackend = backend if backend is not None else TorchCuda()
        self.clock = clock

    def open(self) -> None:
        _check_devices(self.backend, self.devices)

    def sample(self) -> None:
        m = self.metrics
        total_alloc = total_reserved = 0
        for index in self.devices:
            dev = _device_label(index)
            s = self.backend.memory_stats(index)
            for key, pool in POOLS.items():
                m.cuda_allocated.labels(dev, pool).set(s.get(f"allocated_bytes.{key}.current", 0))
                m.cuda_reserved.labels(dev, pool).set(s.get(f"reserved_bytes.{key}.current", 0))
                m.cuda_active.labels(dev, pool).set(s.get(f"active_bytes.{key}.current", 0))
                m.cuda_inactive_split.labels(dev, pool).set(s.get(f"inactive_split_bytes.{key}.current", 0))
                m.cuda_requested.labels(dev, pool).set(s.get(f"requested_bytes.{key}.current", 0))
                m.cuda_segments.labels(dev, pool).set(s.get(f"segment.{key}.current", 0))
            m.cuda_alloc_retries.set([dev], s.get("num_alloc_retries", 0))
            m.cuda_ooms.set([dev], s.get("num_ooms", 0))
            # num_device_alloc/free (torch >= 2.4) also count cuMemMap with expandable segments;
            # older torch only has the cudaMalloc'd segment totals.
            m.cuda_device_allocs.set([dev], s.get("num_device_alloc", s.get("segment.all.allocated", 0)))
            m.cuda_device_frees.set([dev], s.get("num_device_free", s.get("segment.all.freed", 0)))
            allocated = int(s.get("allocated_bytes.all.current", 0))
            reserved = int(s.get("reserved_bytes.all.current", 0))
            inactive = int(s.get("inactive_split_bytes.all.current", 0))
            ru, isplit = fragmentation(allocated, reserved, inactive)
            m.cuda_fragmentation.labels(dev, "reserved_unallocated").set(ru)
            m.cuda_fragmentation.labels(dev, "inactive_split").set(isplit)
            free, _total = self.backend.mem_get_info(index)
            m.cuda_device_free.labels(dev).set(free)
            total_alloc += allocated
            total_reserved += reserved
        if self.series is not None:
            now = self.clock()
            self.series.append("torch_cuda_allocated", now, total_alloc)
            self.series.append("torch_cuda_reserved", now, total_reserved)

    def close(self) -> None:
        pass


def fragmentation(allocated: int, reserved: int, inactive_split: int) -> tuple[float, float]:
    """(1 - allocated/reserved, inactive_split/reserved); both 0 while nothing is reserved."""
    if reserved <= 0:
        return 0.0, 0.0
    return max(0.0, 1.0 - allocated / reserved), inactive_split / reserved


def largest_free_blocks(segments: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Largest ``inactive`` block per device in a ``memory_snapshot()`` segment list."""
    out: dict[int, int] = {}
    for seg in segments:
        dev = int(seg.get("device", 0))
        best = out.get(dev, 0)
        for block in seg.get("blocks", ()):
            if block.get("state") == "inactive" and block.get("size", 0) > best:
                best = int(block["size"])
        out[dev] = best
    return out


class TorchCudaSnapshotSampler:
    """Largest free block from ``memory_snapshot()``: it takes the allocator lock and walks
    every block, so it runs on its own, slower schedule (memory.snapshot_interval)."""

    name = "torch_cuda_snapshot"

    def __init__(self, metrics: Metrics, devices: Sequence[int], backend: CudaBackend | None = None) -> None:
        self.metrics = metrics
        self.devices = list(devices)
        self.backend: CudaBackend = backend if backend is not None else TorchCuda()
        self._said = False

    def open(self) -> None:
        _check_devices(self.backend, self.devices)

    def sample(self) -> None:
        snap = self.backend.memory_snapshot()
        if snap is None:  # the last figure stands until history recording stops
            if not self._said:
                import torch  # in-process only: a served target's soak never loads torch

                self._said = True
                log.info(
                    "torch %s has no memory_snapshot(include_traces=...) (torch 2.11+): the largest free "
                    "block is not read while allocation history is recorded",
                    torch.__version__,
                )
            return
        largest = largest_free_blocks(snap)
        for index in self.devices:
            self.metrics.cuda_largest_free_block.labels(_device_label(index)).set(largest.get(index, 0))

    def close(self) -> None:
        pass
