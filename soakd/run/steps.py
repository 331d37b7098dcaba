"""The steps a soak and a sweep of a model in this process share, each built from its own config
section: load the target, pick the request source, warm up, time the model alone, fingerprint the
run. A served model's steps are in :mod:`soakd.run.served`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from soakd.allocator import fault_warning
from soakd.config import Config
from soakd.fingerprint import fingerprint
from soakd.models.loader import LoadedModel, load_model
from soakd.run.identity import load_mode
from soakd.targets.base import WarmupResult
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.replay import local_replay
from soakd.workload.sources import RequestSource, build_source

log = logging.getLogger("soakd")


def load_target(cfg: Config, metrics: Metrics | None = None) -> tuple[LoadedModel, LocalModelTarget]:
    """The model, loaded and placed, behind the target its worker threads will call for the whole
    run (ModelLoadError / ConfigError when it cannot be).

    The cores go to the model threads: the rest of the process (this thread's loading and input
    pools, the pre- and postprocess threads) runs torch single-threaded, so it never opens an
    OpenMP team of its own beside theirs (docs/model-threads.md)."""
    cores = torch.get_num_threads()
    torch.set_num_threads(1)
    model = load_model(cfg.model.spec, cfg.model.device, cfg.model.dtype, cfg.model.options)
    if metrics is not None:
        metrics.model_load.set(model.load_seconds)
    log.info("loaded %s on %s in %.2fs", cfg.model.spec, model.device, model.load_seconds)
    target = LocalModelTarget(
        model.fn, model.device, spec=cfg.model.spec, instances=cfg.batcher.instances, cpu_threads=cores
    )
    log.info(
        "%d model instance%s, %d intra-op thread%s each",
        target.workers,
        "s" if target.workers > 1 else "",
        target.threads_per_worker,
        "s" if target.threads_per_worker > 1 else "",
    )
    if model.device.type == "cpu" and target.workers > cores:
        # Each instance still takes one thread, so they time-share the cores: at batch 1 on one CPU
        # two instances reached 0.79-0.92 of the model's offline rate, one instance 0.98-0.99
        # (bench/limit.py --side-by-side, docs/model-threads.md).
        log.warning(
            "batcher.instances = %d on %d CPU thread%s: the instances time-share the cores, and a CPU-bound "
            "model loses throughput to the switching; instances <= %d give each a core of its own",
            target.workers,
            cores,
            "s" if cores > 1 else "",
            cores,
        )
    target.start()
    return model, target


def request_source(cfg: Config, model: LoadedModel) -> RequestSource:
    """Sample files, a sequence-length mix or pre-made shapes; ConfigError when there is no shape.
    With ``--replay``, those sized and timed by the trace (docs/replay.md)."""
    base = build_source(cfg, model.default_shape, model.dtype)
    if cfg.load.replay is None:
        return base
    return local_replay(cfg, base, cfg.input.shapes or model.default_shape, model.dtype)


def warm_up(
    cfg: Config,
    target: LocalModelTarget,
    source: RequestSource,
    max_batch: int,
    stop: threading.Event,
    metrics: Metrics | None = None,
) -> WarmupResult:
    """``model.warmup`` calls on each worker thread, outside measurement."""
    inputs = [tensor for _, tensor in source.warmup_inputs()]
    res = target.warm_up(inputs, cfg.model.warmup, max_batch, stop)
    if metrics is not None:
        metrics.first_inference.set(res.first_seconds)
        metrics.warmup.set(res.total_seconds)
    log.info("warmup: %d runs in %.2fs (first inference %.3fs)", res.calls, res.total_seconds, res.first_seconds)
    return res


def cold_start(model: LoadedModel, warm: WarmupResult, runs: int) -> dict[str, Any]:
    return {"model_load_seconds": round(model.load_seconds, 4), **warm.cold_start(runs)}


def probe_offline(
    cfg: Config, target: LocalModelTarget, source: RequestSource, stop: threading.Event, metrics: Metrics | None = None
) -> dict[str, Any] | None:
    """The model alone at the max batch size for ``model.offline_probe`` seconds (and at most as
    many calls as the warm-up made), on its own threads and one reused input: the limit the
    soak's throughput is compared with."""
    seconds = cfg.model.offline_probe
    if seconds <= 0 or source.preprocess is not None:  # raw samples: no single input stands for them
        return None
    _, tensor = source.warmup_inputs()[0]
    batch = cfg.batcher.max_batch_size
    x = tensor.unsqueeze(0).expand(batch, *tensor.shape).contiguous()
    probe = target.measure_offline(x, seconds, max(3, cfg.model.warmup), stop)
    if metrics is not None:
        metrics.model_offline_rps.set(probe.rps)
    log.info(
        "model alone at batch %d: %.1f req/s (%s)",
        batch,
        probe.rps,
        f"{target.workers} instances" if target.workers > 1 else "one instance",
    )
    out: dict[str, Any] = {
        "rps": round(probe.rps, 3),
        "batch_size": batch,
        "seconds": seconds,
        "instances": target.workers,
    }
    if probe.faults is not None:
        out["page_faults_per_call"] = round(probe.faults.faults, 1)
        out["churn_faults_per_call"] = round(probe.faults.churn, 1)
        out["kernel_time_ratio"] = round(probe.faults.kernel_share, 4)
        warning = fault_warning(probe.faults)
        if warning is not None:
            log.warning("%s", warning)
            out["allocator_warning"] = warning
    return out


def run_fingerprint(cfg: Config, run_id: str, model: LoadedModel) -> dict[str, Any]:
    shapes = cfg.input.shapes or model.default_shape
    return fingerprint(
        cfg,
        run_id=run_id,
        model_spec=cfg.model.spec,
        model_sha256=model.sha256,
        device=model.device,
        input_desc=f"samples {cfg.input.samples}" if cfg.input.samples else f"shapes {shapes}",
    )


def export_run_info(metrics: Metrics, run_id: str, cfg: Config, model: LoadedModel, fp: dict[str, Any]) -> None:
    metrics.run_info.labels(
        run_id,
        cfg.model.spec,
        model.sha256[:16],
        str(model.device),
        fp["device_name"],
        torch.__version__,
        str(torch.version.cuda),
        load_mode(cfg),
    ).set(1)
    metrics.run_start_time.set(time.time())
