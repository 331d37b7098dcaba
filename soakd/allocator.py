"""What soakd knows about the CPU memory allocator behind a model (docs/model-threads.md, section 3).

torch's CPU tensors come from glibc's ``malloc``. Blocks above the mmap threshold are mapped and
unmapped per allocation, freed heap memory above the trim threshold goes back to the kernel, and a
thread's own arena grows in heaps of at most 64 MB, mapping anything larger afresh: a model whose
activations are megabytes then faults its pages in, zeroed, on every call. soakd does not change
the allocator (production's is the one to soak under); it measures the faults and says what keeps
the blocks. Torch-free, so bench/limit.py's parent can import it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
from dataclasses import dataclass

import psutil

from soakd.config import Config

log = logging.getLogger("soakd")

# glibc: one arena (the main one grows by sbrk, without the 64 MB heap limit), nothing mapped
# per block, nothing trimmed. The builtin convnet at batch 8: 75,267 faults a call -> 0, 60 -> 160 req/s.
GLIBC_KEEP_BLOCKS = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "4000000000",
    "MALLOC_TRIM_THRESHOLD_": "4000000000",
}
# jemalloc (LD_PRELOAD): blocks above oversize_threshold (8 MB) otherwise go to an arena purged at once.
JEMALLOC_KEEP_BLOCKS = "oversize_threshold:0,dirty_decay_ms:-1"

# mallopt(3) parameters for the same settings, applied in process: glibc reads the MALLOC_*
# variables only when the process starts.
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_ARENA_MAX": -8}

ALLOCATOR_DOC = "docs/model-threads.md#3-the-allocator-behind-the-model"

PAGE_BYTES = resource.getpagesize()
# Warn when each call faults in at least this much fresh memory while the process spends this
# share of its CPU time in the kernel; a model that reuses its memory faults ~0.
FAULT_WARN_BYTES = 1 << 20
KERNEL_WARN_RATIO = 0.2


@dataclass(frozen=True)
class FaultRates:
    """Page faults per model call between two moments, and the kernel's share of the CPU time."""

    faults: float  # every minor fault, per call
    churn: float  # those whose pages the process did not keep: memory given back and faulted in again
    kernel_share: float


@dataclass(frozen=True)
class CpuFaults:
    """The process's minor page faults, resident memory and CPU time at one moment: two of them,
    and the model calls made between, give faults per call and the kernel's share (the offline
    probe, the soak)."""

    faults: int
    rss_bytes: int
    user_s: float
    kernel_s: float

    @classmethod
    def now(cls) -> CpuFaults:
        r = resource.getrusage(resource.RUSAGE_SELF)  # the whole process: intra-op threads count
        return cls(r.ru_minflt, psutil.Process().memory_info().rss, r.ru_utime, r.ru_stime)

    def per_call(self, later: CpuFaults, calls: int) -> FaultRates:
        """The rates from this moment to ``later``. A fault whose page the process keeps (a heap
        growing to its working set, code touched once) is paid once, yet a short run divides it
        over few calls (the demo's 10-call probe once read 644 a call); only the rest, pages
        returned to the kernel and faulted in again, is a cost every call pays, and is warned of."""
        user, kernel = later.user_s - self.user_s, later.kernel_s - self.kernel_s
        share = kernel / (user + kernel) if user + kernel > 0 else 0.0
        faults = later.faults - self.faults
        kept = max(0, later.rss_bytes - self.rss_bytes) // PAGE_BYTES
        n = max(1, calls)
        return FaultRates(faults / n, max(0, faults - kept) / n, share)


def fault_warning(rates: FaultRates) -> str | None:
    """The warning for a model bound by page faults, or None when it is not."""
    churned = rates.churn * PAGE_BYTES
    if churned < FAULT_WARN_BYTES or rates.kernel_share < KERNEL_WARN_RATIO:
        return None
    return (
        f"the model page-faults {rates.churn:.0f} times a call ({churned / 1e6:.1f} MB given back to the kernel "
        f"and faulted in again, zeroed; {100 * rates.kernel_share:.0f}% of CPU time in the kernel): its pace here "
        f"is set by the memory allocator, not by the model or soakd; {ALLOCATOR_DOC} says which allocator "
        "settings keep the blocks"
    )


def keep_large_blocks() -> str | None:
    """Set GLIBC_KEEP_BLOCKS in this process with mallopt(3), for soakd's own demo model: the
    builtin ConvNet's activations otherwise fault in afresh on every call and its pace is glibc's
    (docs/model-threads.md). Call it before the model's threads start, so they share the main
    arena. The settings applied, as variables, or None where the C library has no mallopt or
    the environment already sets them (the user's allocator is theirs to choose)."""
    if any(k in os.environ for k in GLIBC_KEEP_BLOCKS) or "LD_PRELOAD" in os.environ:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc; musl and macOS have none
    except (AttributeError, OSError):
        return None
    for name, value in GLIBC_KEEP_BLOCKS.items():
        if mallopt(_MALLOPT[name], min(int(value), 2**31 - 1)) != 1:  # mallopt takes a C int
            return None
    return " ".join(f"{k}={v}" for k, v in GLIBC_KEEP_BLOCKS.items())


DEMO_MODEL = "builtin:convnet"  # the default model: what `make demo` and a bare `soakd run` soak


def demo_allocator(cfg: Config) -> None:
    """soakd's own demo model runs at its honest pace: with glibc keeping large blocks (set in
    process, before any model thread starts), its activations stop faulting in afresh on every
    call, which otherwise makes glibc, not the model, set the pace (docs/model-threads.md).
    A user's model runs under whatever allocator soakd was started with."""
    if cfg.model.spec != DEMO_MODEL or cfg.target.url is not None:
        return
    applied = keep_large_blocks()
    if applied is not None:
        log.info(  # one line, said once: the demo's own setting, not advice about the user's model
            "%s (the demo model) runs with glibc keeping large blocks: %s (%s)", DEMO_MODEL, applied, ALLOCATOR_DOC
        )
