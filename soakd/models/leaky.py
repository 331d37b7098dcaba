"""Builtin test models that misbehave with memory on purpose, for demos and leak tests.

* ``leak_host``: keeps host memory it allocates, ``bytes_per_call`` per forward or
  ``mib_per_s`` of wall time (independent of throughput), up to ``max_mib``.
* ``leak_cuda``: the same with tensors on the input's device (host memory on a CPU run).
* ``fragment_cuda``: allocates and frees blocks of ever-changing sizes, keeping ``keep`` of
  them alive, so the caching allocator's reserved memory outgrows what is allocated.

Each returns its input, so the harness around it costs what ``builtin:noop`` costs.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import torch
from torch import nn

from soakd.config import ConfigError

MIB = 1 << 20


class _Leak(nn.Module):
    def __init__(self, bytes_per_call: int = 0, mib_per_s: float = 0.0, max_mib: float = 4096.0) -> None:
        super().__init__()
        for key, value in (("bytes_per_call", bytes_per_call), ("mib_per_s", mib_per_s), ("max_mib", max_mib)):
            if value < 0:
                raise ConfigError(f"model.options.{key}: must be >= 0, got {value}")
        if not bytes_per_call and not mib_per_s:
            mib_per_s = 1.0
        self.bytes_per_call = int(bytes_per_call)
        self.mib_per_s = float(mib_per_s)
        self.max_bytes = int(max_mib * MIB)
        self.leaked = 0
        self._owed = 0.0
        self._last: float | None = None
        self._lock = threading.Lock()

    def _due(self) -> int:
        """Bytes to leak on this call: per call, or the time since the last call at the rate."""
        with self._lock:
            n = float(self.bytes_per_call)
            now = time.monotonic()
            if self.mib_per_s:
                if self._last is not None:
                    self._owed += (now - self._last) * self.mib_per_s * MIB
                self._last = now
                n += self._owed
            n = min(n, float(self.max_bytes - self.leaked))
            if n < 4096 and self.mib_per_s:  # accumulate; tiny allocations would be all overhead
                return 0
            self._owed = 0.0
            self.leaked += int(max(n, 0))
            return int(max(n, 0))


class LeakHost(_Leak):
    """Keeps host memory: touched pages, so it shows in RSS and USS."""

    def __init__(self, bytes_per_call: int = 0, mib_per_s: float = 0.0, max_mib: float = 4096.0) -> None:
        super().__init__(bytes_per_call, mib_per_s, max_mib)
        self._kept: list[bytearray] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self._due()
        if n:
            self._kept.append(bytearray(b"\xa5") * n)
        return x


class LeakCuda(_Leak):
    """Keeps tensors on the input's device (CUDA memory on a CUDA run)."""

    def __init__(self, bytes_per_call: int = 0, mib_per_s: float = 0.0, max_mib: float = 4096.0) -> None:
        super().__init__(bytes_per_call, mib_per_s, max_mib)
        self._kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self._due()
        if n:
            self._kept.append(torch.ones(n, dtype=torch.uint8, device=x.device))
        return x


class FragmentCuda(nn.Module):
    """Allocates a block of a new random size every call and frees the oldest beyond ``keep``:
    the caching allocator splits and caches blocks of every size and its reserved memory grows
    well past what is allocated (fragmentation, not a leak of tensors)."""

    def __init__(self, keep: int = 64, min_kib: int = 64, max_kib: int = 8192, seed: int = 0) -> None:
        super().__init__()
        if keep < 1:
            raise ConfigError(f"model.options.keep: must be >= 1, got {keep}")
        if not 1 <= min_kib <= max_kib:
            raise ConfigError(f"model.options.min_kib, max_kib: need 1 <= min_kib <= max_kib, got {min_kib}, {max_kib}")
        self.keep = keep
        self._rng = np.random.default_rng(seed)
        self._lo, self._hi = min_kib * 1024, max_kib * 1024
        self._live: deque[torch.Tensor] = deque()
        self._lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            size = int(self._rng.integers(self._lo, self._hi, endpoint=True))
            self._live.append(torch.empty(size, dtype=torch.uint8, device=x.device))
            while len(self._live) > self.keep:
                # Free from the middle as well as the oldest: holes between live blocks.
                self._live.rotate(-int(self._rng.integers(0, len(self._live))))
                self._live.popleft()
        return x
