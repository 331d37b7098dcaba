"""What differs between soaking a model in this process and a served one, behind one interface,
so that the run session has one path: open the target (load the model, or connect and check the
URL), make the request source, warm up, time the model alone (in process only), fingerprint.

The session asks :func:`prepare` for the target kind the config names and then runs one soak;
the protocol modules of a served model load only when that target is used (``steps.PROTOCOLS``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from soakd.config import Config
from soakd.models.loader import LoadedModel
from soakd.run import steps
from soakd.run.health import Health
from soakd.targets.base import AnyTarget, WarmupResult
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.pipeline import cuda_devices
from soakd.workload.sources import RequestSource


class Preparation(Protocol):
    """An opened target and the steps before its soak, whatever its kind."""

    target: AnyTarget
    opening: str  # what a stop during open interrupts: "loading" | "connecting"
    device: torch.device  # where telemetry looks: the model's device, or this host's CPU
    cuda_index: int | None
    label: str  # the model spec or the target spec, for telemetry's resource attributes

    def source(self) -> RequestSource: ...
    def warm_up(self, source: RequestSource, stop: threading.Event) -> WarmupResult: ...
    def probe_offline(self, source: RequestSource, stop: threading.Event) -> dict[str, Any] | None: ...
    def fingerprint(self, run_id: str) -> dict[str, Any]: ...
    def cold_start(self, warm: WarmupResult) -> dict[str, Any]: ...

    # A served model's summary block (where it was, how long it was down); None in process.
    summary: Callable[[], dict[str, Any]] | None

    def close(self) -> None: ...


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


class Served:
    """A model served over the network (``--target``): its client opened and its URL checked."""

    opening = "connecting"
    device = torch.device("cpu")  # telemetry samples this host; the server's memory is watched apart
    cuda_index: int | None = None

    def __init__(self, cfg: Config, metrics: Metrics, health: Health) -> None:
        self.cfg, self.metrics = cfg, metrics
        health.starting = "starting: connecting to and warming up the target"
        replay = steps.open_replay(cfg)  # a bad trace, bodies or prompts: exit 2 before anything connects
        early = steps.read_inputs(cfg)
        self.client, self.connect_seconds = steps.open_network_target(cfg, metrics)
        self.target: AnyTarget = self.client
        health.target_down = self.client.down_reason
        self.label = self.client.spec
        self.summary: Callable[[], dict[str, Any]] | None = self.client.summary
        try:
            self._source = steps.network_source(cfg, self.client, early, replay)
        except BaseException:
            self.client.close()
            raise

    def source(self) -> RequestSource:
        return self._source

    def warm_up(self, source: RequestSource, stop: threading.Event) -> WarmupResult:
        return steps.warm_up_target(self.cfg, self.client, source, stop, self.metrics)

    def probe_offline(self, source: RequestSource, stop: threading.Event) -> dict[str, Any] | None:
        return None  # a served model batches itself: there is no offline loop to time here

    def fingerprint(self, run_id: str) -> dict[str, Any]:
        fp = steps.target_fingerprint(self.cfg, run_id)
        steps.export_target_run_info(self.metrics, run_id, self.cfg, fp)
        return fp

    def cold_start(self, warm: WarmupResult) -> dict[str, Any]:
        return steps.target_cold_start(self.connect_seconds, warm, self.cfg.model.warmup)

    def close(self) -> None:
        self.client.close()


def prepare(cfg: Config, metrics: Metrics, health: Health) -> Preparation:
    """The target the config names, opened: a served model (``target.url``) or a loaded one
    (ModelLoadError, TargetError or ConfigError, exit 2, when it cannot be)."""
    if cfg.target.url is not None:
        return Served(cfg, metrics, health)
    return InProcess(cfg, metrics)
