"""In-memory time series of memory samples, bounded per series, for the leak analysis.

The durable copy lives in the state store; this ring is what the live verdicts read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt


class SeriesRing:
    """A fixed-capacity ring of (unix time, value) for one series."""

    def __init__(self, capacity: int) -> None:
        self._t = np.zeros(capacity, dtype=np.float64)
        self._v = np.zeros(capacity, dtype=np.float64)
        self._n = 0  # total appended
        self.capacity = capacity

    def append(self, t: float, value: float) -> None:
        i = self._n % self.capacity
        self._t[i] = t
        self._v[i] = value
        self._n += 1

    def read(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Oldest first, copies."""
        if self._n <= self.capacity:
            return self._t[: self._n].copy(), self._v[: self._n].copy()
        i = self._n % self.capacity
        return np.concatenate([self._t[i:], self._t[:i]]), np.concatenate([self._v[i:], self._v[:i]])

    def __len__(self) -> int:
        return min(self._n, self.capacity)


class SeriesStore:
    """Named rings; samplers append, the leak monitor reads. Thread-safe."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._rings: dict[str, SeriesRing] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str, float, float], None]] = []
        self._resets: dict[str, float] = {}
        self._reset_listeners: list[Callable[[tuple[str, ...], float, str], None]] = []

    def add_listener(self, fn: Callable[[str, float, float], None]) -> None:
        """Call ``fn(series, t, value)`` on every append (the state store keeps a durable copy)."""
        self._listeners.append(fn)

    def add_reset_listener(self, fn: Callable[[tuple[str, ...], float, str], None]) -> None:
        """Call ``fn(series, t, why)`` on every :meth:`mark_reset` (the state store keeps an event)."""
        self._reset_listeners.append(fn)

    def mark_reset(self, series: Sequence[str], t: float, why: str) -> None:
        """The level of ``series`` was reset at ``t`` (a watched server restarted): samples before
        it belong to another process, and the leak monitor judges from ``t`` on. The ring keeps
        them (the summary and the state store show the whole run)."""
        names = tuple(series)
        with self._lock:
            for name in names:
                self._resets[name] = t
        for fn in self._reset_listeners:
            fn(names, t, why)

    def reset_at(self, series: str) -> float | None:
        """Time of the latest reset of ``series``; None when it never had one."""
        with self._lock:
            return self._resets.get(series)

    def append(self, series: str, t: float, value: float) -> None:
        with self._lock:
            ring = self._rings.get(series)
            if ring is None:
                ring = self._rings[series] = SeriesRing(self.capacity)
            ring.append(t, value)
        for fn in self._listeners:
            fn(series, t, value)

    def read(self, series: str) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        with self._lock:
            ring = self._rings.get(series)
            if ring is None:
                return np.zeros(0), np.zeros(0)
            return ring.read()

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._rings)
