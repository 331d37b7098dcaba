"""The ``/status`` document: what a run is doing now, for people and scripts."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from soakd.config import Config
from soakd.run.health import Health
from soakd.run.summary import live_verdicts
from soakd.run.windows import Delta

if TYPE_CHECKING:
    from soakd.analysis.monitor import Verdict
    from soakd.load.engine import Engine
    from soakd.run.lifecycle import Lifecycle


def _ms(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)


def status_document(
    cfg: Config,
    life: Lifecycle | None,
    engine: Engine | None,
    win: Delta | None,
    health: Health,
    verdicts: dict[str, Verdict],
    target: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``target``: a network target's summary block (up, down time, answers by class)."""
    ok, reason = health()
    out: dict[str, Any] = {
        "run_id": life.run_id if life else None,
        "segment": life.segment if life else None,
        "phase": life.phase if life else "loading",
        "healthy": ok,
        "health": reason,
        "uptime_seconds": round(time.monotonic() - life.started, 3) if life else 0.0,
        "run_elapsed_seconds": round(life.elapsed_before + time.monotonic() - life.started, 3) if life else 0.0,
        "throughput_rps": None,
        "p50_ms": None,
        "p99_ms": None,
        "window_seconds": cfg.metrics.status_interval,
    }
    if win is not None:
        out["throughput_rps"] = round(win.rps, 3)
        out["p50_ms"] = _ms(win.percentile_ms(0.5))
        out["p99_ms"] = _ms(win.percentile_ms(0.99))
    if engine is not None:
        stats = engine.stats()
        out["requests"] = stats.completed
        out["inflight"] = stats.inflight
        out["target_load"] = {"rate" if engine.open_loop else "concurrency": engine.target_load}
    if target is not None:
        out["target"] = target
    leak = live_verdicts(verdicts)
    out["leak"] = leak
    out["leak_suspected"] = sorted(s for s, v in leak.items() if v.get("suspected"))
    if life is not None:
        watchdog = life.watchdog
        out["watchdog"] = {
            "interval_seconds": life.notifier.watchdog_interval,
            "pings": watchdog.pings if watchdog else 0,
        }
        if life.store is not None:
            out["state"] = {
                "path": str(life.store.path),
                "write_errors": life.store.write_errors,
                "dropped": life.store.dropped,
            }
    return out
