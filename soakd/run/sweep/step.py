"""One sweep step: its own Engine on the shared target, marked at each window boundary until the
last three windows agree within the tolerance (or its time is up)."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from soakd.config import Config
from soakd.load.engine import Engine, EngineStats
from soakd.run.sweep.planner import SweepPlan, step_config
from soakd.targets.base import AnyTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.sources import RequestSource

if TYPE_CHECKING:
    from soakd.models.loader import LoadedModel

log = logging.getLogger("soakd.sweep")

_POLL_S = 0.1


@dataclass
class Mark:
    """The engine's cumulative state at a window boundary."""

    t: float
    stats: EngineStats
    batch_sum: float
    batch_count: float
    pre_busy: float


@dataclass
class StepResult:
    settings: dict[str, Any]
    marks: list[Mark] = field(default_factory=list)
    peak_rss: int = 0
    peak_gpu: int | None = None
    stable: bool = False
    workers: int = 1


def _mark(engine: Engine, metrics: Metrics) -> Mark:
    pool = engine.preprocess_pool
    # Sum and count from one collect() of the batch-size histogram, so they describe the same batches.
    samples = {s.name: s.value for family in metrics.batch_size.collect() for s in family.samples}
    return Mark(
        t=time.perf_counter(),
        stats=engine.stats(),
        batch_sum=samples.get("soakd_batch_size_sum", 0.0),
        batch_count=samples.get("soakd_batch_size_count", 0.0),
        pre_busy=pool.busy_seconds() if pool is not None else 0.0,
    )


def _window_figures(a: Mark, b: Mark) -> tuple[float, float]:
    dt = max(1e-9, b.t - a.t)
    ok = b.stats.completed.get("ok", 0) - a.stats.completed.get("ok", 0)
    p99 = (b.stats.stages["e2e"] - a.stats.stages["e2e"]).percentile(0.99)
    return ok / dt, p99


def is_stable(marks: list[Mark], tolerance: float) -> bool:
    """Throughput and p99 of the last three windows each within ``tolerance`` of their mean."""
    if len(marks) < 4:
        return False
    figures = [_window_figures(a, b) for a, b in itertools.pairwise(marks[-4:])]
    for series in zip(*figures, strict=True):
        if any(math.isnan(v) for v in series) or min(series) <= 0:
            return False
        mean = sum(series) / len(series)
        if (max(series) - min(series)) / mean > tolerance:
            return False
    return True


@dataclass
class SweepTarget:
    """What every step drives: an in-process model (``model`` set) or a served one."""

    target: AnyTarget
    source: Callable[[Config], RequestSource]  # a step's request source, from its config
    model: LoadedModel | None = None

    @property
    def cuda(self) -> bool:
        return self.model is not None and self.model.device.type == "cuda"


def run_step(st: SweepTarget, cfg: Config, sweep: SweepPlan, settings: dict[str, Any]) -> StepResult:
    step_cfg = step_config(cfg, settings)
    metrics = Metrics()
    engine = Engine(st.target, st.source(step_cfg), step_cfg, metrics)
    result = StepResult(settings, workers=step_cfg.input.preprocess_workers)
    cuda = st.cuda
    model = st.model
    if cuda and model is not None:
        import torch  # loaded already: the model is on a CUDA device

        # Give back what earlier steps cached, so each step's peak is what its own batches need.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(model.device)
    proc = psutil.Process()
    engine.start()
    result.marks.append(_mark(engine, metrics))
    start = result.marks[0].t
    next_mark = start + sweep.window
    try:
        while True:
            now = time.perf_counter()
            result.peak_rss = max(result.peak_rss, proc.memory_info().rss)
            if now < next_mark:
                time.sleep(min(_POLL_S, next_mark - now))
                continue
            result.marks.append(_mark(engine, metrics))
            next_mark += sweep.window
            elapsed = result.marks[-1].t - start
            if sweep.step_duration is not None:
                done = elapsed >= sweep.step_duration - 1e-3
            else:
                settled = elapsed >= sweep.min_step and is_stable(result.marks, sweep.tolerance)
                done = settled or elapsed >= sweep.max_step
            if done:
                break
    finally:
        drained = engine.stop(drain_timeout=min(cfg.load.drain_timeout, 10.0))
    if not drained:
        log.warning("step %s: drain timed out with %d requests in flight", settings, engine.inflight)
    result.stable = is_stable(result.marks, sweep.tolerance)
    if cuda and model is not None:
        import torch  # loaded already (see above)

        result.peak_gpu = int(torch.cuda.max_memory_reserved(model.device))
    return result
