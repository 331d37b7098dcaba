"""What differs between soaking a model in this process and a served one, behind one interface,
so that the run session has one path: open the target (load the model, or connect and check the
URL), make the request source, warm up, time the model alone (in process only), fingerprint.

The session asks :func:`prepare` for the target kind the config names and then runs one soak;
the protocol modules of a served model load only when that target is used (``served.PROTOCOLS``),
and torch only when the model runs in this process (:mod:`soakd.run.in_process`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from soakd.config import Config
from soakd.run.health import Health
from soakd.run.served import Served
from soakd.targets.base import AnyTarget, WarmupResult
from soakd.telemetry.catalogue import Metrics
from soakd.workload.sources import RequestSource

if TYPE_CHECKING:
    import torch


class Preparation(Protocol):
    """An opened target and the steps before its soak, whatever its kind."""

    target: AnyTarget
    opening: str  # what a stop during open interrupts: "loading" | "connecting"
    cuda_index: int | None
    label: str  # the model spec or the target spec, for telemetry's resource attributes

    @property
    def device(self) -> torch.device | None:
        """Where telemetry looks: the model's device; None: no model in this process."""

    def source(self) -> RequestSource: ...
    def warm_up(self, source: RequestSource, stop: threading.Event) -> WarmupResult: ...
    def probe_offline(self, source: RequestSource, stop: threading.Event) -> dict[str, Any] | None: ...
    def fingerprint(self, run_id: str) -> dict[str, Any]: ...
    def cold_start(self, warm: WarmupResult) -> dict[str, Any]: ...

    # A served model's summary block (where it was, how long it was down); None in process.
    summary: Callable[[], dict[str, Any]] | None

    def close(self) -> None: ...


def prepare(cfg: Config, metrics: Metrics, health: Health) -> Preparation:
    """The target the config names, opened: a served model (``target.url``) or a loaded one
    (ModelLoadError, TargetError or ConfigError, exit 2, when it cannot be)."""
    if cfg.target.url is not None:
        return Served(cfg, metrics, health)
    from soakd.run.in_process import InProcess  # torch, and the model's modules

    return InProcess(cfg, metrics)
