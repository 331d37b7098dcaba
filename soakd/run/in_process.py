"""A model loaded into this process, behind :class:`soakd.run.prepare.Preparation`. Imported only
when the run soaks one: it brings torch and the model's modules with it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from soakd.config import Config
from soakd.models.loader import LoadedModel
from soakd.run import steps
from soakd.targets.base import AnyTarget, WarmupResult
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.pipeline import cuda_devices
from soakd.workload.sources import RequestSource


class InProcess:
    """A model loaded into this process, on its own worker threads."""

    opening = "loading"

    def __init__(self, cfg: Config, metrics: Metrics) -> None:
        self.cfg, self.metrics = cfg, metrics
        self.model: LoadedModel
        self.model, self.local = steps.load_target(cfg, metrics)
        self.target: AnyTarget = self.local
        self.device = self.model.device
        self.cuda_index = cuda_devices(self.device)[0] if self.device.type == "cuda" else None
        self.label = cfg.model.spec
        self.summary: Callable[[], dict[str, Any]] | None = None

    def source(self) -> RequestSource:
        return steps.request_source(self.cfg, self.model)

    def warm_up(self, source: RequestSource, stop: threading.Event) -> WarmupResult:
        return steps.warm_up(self.cfg, self.local, source, self.cfg.batcher.max_batch_size, stop, self.metrics)

    def probe_offline(self, source: RequestSource, stop: threading.Event) -> dict[str, Any] | None:
        return steps.probe_offline(self.cfg, self.local, source, stop, self.metrics)

    def fingerprint(self, run_id: str) -> dict[str, Any]:
        fp = steps.run_fingerprint(self.cfg, run_id, self.model)
        steps.export_run_info(self.metrics, run_id, self.cfg, self.model, fp)
        return fp

    def cold_start(self, warm: WarmupResult) -> dict[str, Any]:
        return steps.cold_start(self.model, warm, self.cfg.model.warmup)

    def close(self) -> None:
        self.local.close()
