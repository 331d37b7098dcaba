"""Python garbage collector: collections per generation (sampled) and pauses (from ``gc.callbacks``).

Pauses are timed by a callback because a sample every few seconds cannot see them; the
callback costs two clock reads per collection, and collections are serialised by the
interpreter, so one start timestamp suffices.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from soakd.telemetry.catalogue import Metrics


class GcSampler:
    name = "gc"

    def __init__(self, metrics: Metrics, *, callbacks: list[Any] | None = None) -> None:
        self.metrics = metrics
        self._callbacks = gc.callbacks if callbacks is None else callbacks
        self._pause = [metrics.gc_pause.labels(str(g)) for g in range(3)]
        self._start = 0.0
        self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif phase == "stop" and self._start:
            gen = info.get("generation", 0)
            if 0 <= gen < len(self._pause):
                self._pause[gen].observe(time.perf_counter() - self._start)
            self._start = 0.0

    def open(self) -> None:
        if not self._installed:
            self._callbacks.append(self._on_gc)
            self._installed = True

    def sample(self) -> None:
        for gen, stats in enumerate(gc.get_stats()):
            self.metrics.gc_collections.set([str(gen)], stats["collections"])

    def close(self) -> None:
        if self._installed:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(self._on_gc)
            self._installed = False
