"""One answer to "is this soak healthy?": it serves /healthz and gates the watchdog pings."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from soakd.telemetry.catalogue import Metrics

if TYPE_CHECKING:
    from soakd.load.engine import Engine


class Health:
    """Healthy while the engine completes requests, no model worker has died, and every sampler
    that has ever succeeded succeeded recently."""

    def __init__(
        self,
        metrics: Metrics,
        stall_timeout: float,
        sampler_stale_after: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.stall_timeout = stall_timeout
        self.sampler_stale_after = sampler_stale_after
        self.clock = clock
        self.wall = wall
        self.engine: Engine | None = None
        self.stopping = False
        self.starting = "starting: loading and warming up the model"
        # A network target's "why it is down now" (None while it answers); None for in-process runs.
        self.target_down: Callable[[], str | None] | None = None

    def __call__(self) -> tuple[bool, str]:
        engine = self.engine
        if self.stopping:
            return False, "stopping: draining in-flight requests"
        if engine is None:
            return False, self.starting
        died = engine.target.dead()
        if died is not None:
            return False, f"a model worker ended: {type(died).__name__}: {died}"
        down = self.target_down() if self.target_down is not None else None
        if down is not None:
            return False, down
        idle = self.clock() - engine.last_progress
        if engine.inflight > 0 and idle > self.stall_timeout:
            return False, (
                f"engine stalled: no request completed for {idle:.0f}s with {engine.inflight} in "
                f"flight (hung inference?)"
            )
        now = self.wall()
        stale = [
            f"{src} (last success {now - t:.0f}s ago)"
            for src, t in sorted(self.metrics.collector_last_successes().items())
            if t > 0 and now - t > self.sampler_stale_after
        ]
        if stale:
            return False, "samplers stale: " + ", ".join(stale)
        return True, "ok"
