"""The run's telemetry pipeline: which samplers a soak runs, the scheduler they run on, and
the optional OTLP push. The session builds the samplers (:func:`run_samplers`) once the model
is on its device (the CUDA samplers need the device index) and hands them to :class:`Telemetry`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from soakd.config import Config
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.gc_stats import GcSampler
from soakd.telemetry.host import HostSampler, MallocSampler, TracemallocSampler, UssSampler
from soakd.telemetry.nvml import NvmlSampler
from soakd.telemetry.otlp_env import otlp_wanted
from soakd.telemetry.scheduler import Sampler, SamplerScheduler
from soakd.telemetry.scrape import ScrapeSampler
from soakd.telemetry.series import SeriesStore
from soakd.telemetry.torch_cuda import TorchCudaSampler, TorchCudaSnapshotSampler
from soakd.telemetry.watched import TargetGpuSampler, TargetProcessSampler, UnitResolver

if TYPE_CHECKING:
    import torch

log = logging.getLogger("soakd.telemetry")

BatchHook = Callable[[int, float, float, str], None]


def cuda_devices(device: torch.device | None) -> list[int]:
    """CUDA device indices the model uses (empty on CPU, and with no model in this process)."""
    if device is None or device.type != "cuda":
        return []
    import torch  # loaded already: a model is on this device

    return [device.index if device.index is not None else torch.cuda.current_device()]


def gpu_uuids(devices: list[int]) -> list[str] | None:
    """NVML-style UUIDs of the model's devices, to pick the GPUs for the leak series: each as a
    board ("GPU-...") and as a MIG instance ("MIG-..."; torch gives the bare UUID for both)."""
    if not devices:
        return None
    import torch  # loaded already: a model is on these devices

    try:
        bare = [str(torch.cuda.get_device_properties(i).uuid) for i in devices]
    except (AttributeError, RuntimeError):  # older torch without .uuid
        return None
    return [f"{kind}-{u}" for u in bare for kind in ("GPU", "MIG")]


def watched_samplers(
    cfg: Config, metrics: Metrics, series: SeriesStore, units: Sequence[UnitResolver] = ()
) -> list[Sampler]:
    """The served model watched from outside: its processes (``--watch-pid``, then the units of
    ``--watch-unit``, resolved at start), their GPU memory, and its own /metrics (``--scrape``).
    The first process is the server's main one: the one the leak series follow."""
    tg = cfg.target
    procs = [TargetProcessSampler(metrics, series, pid, leak_series=False) for pid in dict.fromkeys(tg.watch_pid)]
    procs += [TargetProcessSampler(metrics, series, resolver=r, leak_series=False) for r in units]
    if procs:
        procs[0].main, procs[0].series = True, series
    out: list[Sampler] = [*procs]
    if procs:
        out.append(TargetGpuSampler(metrics, series, procs))
    claims: dict[str, str] = {}  # a metric found on two URLs is kept from the first
    out += [
        ScrapeSampler(metrics, series, url, tg.scrape_metrics, timeout=tg.scrape_timeout, claims=claims)
        for url in dict.fromkeys(tg.scrape)
    ]
    return out


def run_samplers(
    cfg: Config,
    metrics: Metrics,
    series: SeriesStore,
    device: torch.device | None,
    units: Sequence[UnitResolver] = (),
) -> list[tuple[Sampler, float]]:
    """The samplers of a soak on ``device`` (None: a served target's, no model in this process),
    each with its interval (``units``: the resolved ``--watch-unit`` units,
    :func:`soakd.telemetry.watched.resolve_units`)."""
    mem = cfg.memory
    devices = cuda_devices(device)
    samplers: list[Sampler] = [
        HostSampler(metrics, series),
        UssSampler(metrics, series),
        MallocSampler(metrics, series),
        GcSampler(metrics),
        TorchCudaSampler(metrics, series, devices),
        NvmlSampler(metrics, series, uuids=gpu_uuids(devices)),
    ]
    if mem.tracemalloc:
        samplers.append(TracemallocSampler(metrics))
    samplers += watched_samplers(cfg, metrics, series, units)
    out = [(s, mem.interval) for s in samplers]
    if mem.snapshot_interval is not None:
        out.append((TorchCudaSnapshotSampler(metrics, devices), mem.snapshot_interval))
    return out


def resource_attributes(device: torch.device | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """OTLP resource attributes of a run on ``device`` (the GPU's name and UUID on CUDA; a served
    target's driver, ``device`` None, runs on this host's CPU)."""
    attrs: dict[str, Any] = {"soakd.device": "cpu" if device is None else str(device), **(extra or {})}
    devices = cuda_devices(device)
    if devices:
        import torch  # in-process only: a served target's soak never loads torch

        attrs["soakd.gpu.name"] = torch.cuda.get_device_name(devices[0])
        uuids = gpu_uuids(devices)
        if uuids:
            attrs["soakd.gpu.uuid"] = uuids[0]
    return attrs


class Telemetry:
    """The given samplers on one scheduler, and OTLP when asked for."""

    def __init__(
        self,
        cfg: Config,
        metrics: Metrics,
        samplers: Sequence[tuple[Sampler, float]],
        *,
        resource_attributes: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.scheduler = SamplerScheduler(metrics, sample_timeout=cfg.memory.sample_timeout)
        for sampler, interval in samplers:
            self.scheduler.add(sampler, interval)
        self._resource_attributes: dict[str, Any] = dict(resource_attributes or {})
        self.bridge: Any = None
        self.tracer: Any = None
        self.batch_hook: BatchHook | None = None
        self._log_filter: Any = None

    def start(self) -> None:
        self.scheduler.start()
        self._start_otlp()

    def _start_otlp(self) -> None:
        want_metrics, want_traces = otlp_wanted(self.cfg.otel.enabled)
        if not (want_metrics or want_traces):
            return
        # The OpenTelemetry SDK loads only for runs that push OTLP (~0.3 s at start; the exporters
        # pull in requests and protobuf): a GPU image without it still runs every other soak.
        from soakd.telemetry.otlp import BatchTracer, RegistryBridge, RepeatFilter, build_resource

        self._log_filter = RepeatFilter()
        self._log_filter.install()
        resource = build_resource(self._resource_attributes)
        if want_metrics:
            self.bridge = RegistryBridge(self.metrics.registry, resource, self.cfg.otel.export_interval)
            self.bridge.start()
            log.info("OTLP metrics push every %.0fs", self.cfg.otel.export_interval)
        if want_traces and self.cfg.otel.trace_sample_ratio > 0:
            self.tracer = BatchTracer(resource, self.cfg.otel.trace_sample_ratio)
            self.batch_hook = self.tracer

    def stop(self) -> None:
        self.scheduler.shutdown()
        if self.bridge is not None:
            self.bridge.stop()
            self.bridge = None
        if self.tracer is not None:
            self.tracer.shutdown()
            self.tracer = None
        if self._log_filter is not None:
            self._log_filter.remove()
            self._log_filter = None
