"""The steps a soak and a sweep share, each built from its own config section: load the target,
pick the request source, warm up, time the model alone, fingerprint the run; and for a served
model, open the client and check its URL instead of loading anything."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from soakd.allocator import ALLOCATOR_DOC, fault_warning, keep_large_blocks
from soakd.config import Config
from soakd.fingerprint import fingerprint
from soakd.models.loader import LoadedModel, load_model
from soakd.targets.base import WarmupResult
from soakd.targets.client import ClientTarget
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.bodies import BodySource
from soakd.workload.prompts import PromptSource
from soakd.workload.replay import LengthSizer, local_replay, network_replay, open_trace
from soakd.workload.shapes import ShapeSource
from soakd.workload.sources import RequestSource, build_source
from soakd.workload.traces import Trace, TraceInfo

log = logging.getLogger("soakd")


DEMO_MODEL = "builtin:convnet"  # the default model: what `make demo` and a bare `soakd run` soak


def demo_allocator(cfg: Config) -> None:
    """soakd's own demo model runs at its honest pace: with glibc keeping large blocks (set in
    process, before any model thread starts), its activations stop faulting in afresh on every
    call, which otherwise makes glibc, not the model, set the pace (docs/model-threads.md).
    A user's model runs under whatever allocator soakd was started with."""
    if cfg.model.spec != DEMO_MODEL or cfg.target.url is not None:
        return
    applied = keep_large_blocks()
    if applied is not None:
        log.info(  # one line, said once: the demo's own setting, not advice about the user's model
            "%s (the demo model) runs with glibc keeping large blocks: %s (%s)", DEMO_MODEL, applied, ALLOCATOR_DOC
        )


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


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
    out: dict[str, Any] = {
        "model_load_seconds": round(model.load_seconds, 4),
        "first_inference_seconds": round(warm.first_seconds, 4),
        "warmup_seconds": round(warm.total_seconds, 4),
        "warmup_runs": runs,
    }
    if warm.failures:
        out["warmup_failures"] = warm.failures
    return out


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
    if probe.page_faults_per_call is not None and probe.kernel_share is not None:
        out["page_faults_per_call"] = round(probe.page_faults_per_call, 1)
        out["kernel_time_ratio"] = round(probe.kernel_share, 4)
        warning = fault_warning(probe.page_faults_per_call, probe.kernel_share)
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


def load_mode(cfg: Config) -> str:
    ld = cfg.load
    if ld.replay is not None:
        return f"replay={ld.replay_speed:g}x"
    return f"rate={ld.rate}/{ld.arrival}" if ld.open_loop else f"concurrency={ld.concurrency}"


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


# ---------------------------------------------------------------------- network targets

OPEN_LOOP_CONNECTIONS = 256  # open loop's default pool: past it, requests wait (the queue stage)


# Each protocol's module is imported by its builder, only when --api names it: aiohttp, grpc and
# tritonclient cost start-up time, and an image without them (the GPU check's) still runs a model.


def _http_target(cfg: Config, metrics: Metrics, limit: int) -> ClientTarget:
    from soakd.targets.http import HttpTarget  # only for --api http (see above)

    assert cfg.target.url is not None
    return HttpTarget(cfg.target.url, metrics, max_connections=limit, timeout=cfg.target.timeout)


def _openai_target(cfg: Config, metrics: Metrics, limit: int) -> ClientTarget:
    from soakd.targets.openai import OpenAITarget  # only for --api openai (see above)

    tg = cfg.target
    assert tg.url is not None
    return OpenAITarget(
        tg.url,
        metrics,
        model=tg.model,
        endpoint=tg.openai_endpoint,
        stream=tg.stream,
        chunk_timeout=tg.chunk_timeout,
        ttft_slo_ms=cfg.slo.ttft_ms,
        tpot_slo_ms=cfg.slo.tpot_ms,
        max_connections=limit,
        timeout=tg.timeout,
    )


def _kserve_target(cfg: Config, metrics: Metrics, limit: int) -> ClientTarget:
    from soakd.targets.kserve import V2Model, kserve_target  # only for --api kserve-v2 (see above)

    tg = cfg.target
    assert tg.url is not None and tg.model is not None  # config validation requires both
    model = V2Model(
        tg.url, tg.model, cfg.input.shapes, tg.datatype, samples=cfg.input.samples is not None, pool=cfg.input.pool
    )
    return kserve_target(tg.url, metrics, model=model, max_connections=limit, timeout=tg.timeout)


# One client per --api: (the target, built from the config and the connection limit).
PROTOCOLS: dict[str, Callable[[Config, Metrics, int], ClientTarget]] = {
    "http": _http_target,
    "openai": _openai_target,
    "kserve-v2": _kserve_target,  # the URL scheme picks REST (http://) or gRPC (grpc://)
}


def open_network_target(cfg: Config, metrics: Metrics) -> tuple[ClientTarget, float]:
    """The client of a served model, its URL checked (TargetError naming it when nothing answers)."""
    tg = cfg.target
    assert tg.url is not None
    limit = tg.max_connections or (OPEN_LOOP_CONNECTIONS if cfg.load.open_loop else cfg.load.concurrency or 1)
    target = PROTOCOLS[tg.api](cfg, metrics, limit)
    seconds = target.open()
    log.info(
        "target %s (api %s): reachable in %.3fs; up to %d connections, %.0fs timeout per request",
        tg.url,
        tg.api,
        seconds,
        limit,
        tg.timeout,
    )
    return target, seconds


def read_inputs(cfg: Config) -> BodySource | PromptSource | None:
    """What can be read before anything connects (ConfigError, exit 2, on bad samples or
    prompts): openai's prompts, or the bodies ``--samples`` holds. None: kserve-v2 tensors,
    made once the model's metadata is known (:func:`network_source`), or a replayed trace's
    openai prompts (made per row)."""
    if cfg.target.api == "openai":
        if cfg.load.replay is not None:
            return None
        source = PromptSource(cfg)
        log.info("%s", source.describe)
        return source
    return body_source(cfg)


def open_replay(cfg: Config) -> tuple[Trace, TraceInfo] | None:
    """``--replay``'s trace, scanned before anything connects (exit 2 naming file and line)."""
    return open_trace(cfg) if cfg.load.replay is not None else None


def body_source(cfg: Config) -> BodySource | None:
    """The request bodies ``--samples`` holds (read before anything connects); ConfigError naming
    the dir when it holds none. None without ``--samples`` (kserve-v2 then makes tensors)."""
    if cfg.input.samples is None:  # config validation requires it for --api http
        return None
    source = BodySource(cfg.input.samples)
    log.info("%d request bodies (%.1f KiB) from %s", len(source.bodies), source.total_bytes / 1024, cfg.input.samples)
    return source


def network_source(
    cfg: Config,
    target: ClientTarget,
    early: BodySource | PromptSource | None,
    replay: tuple[Trace, TraceInfo] | None = None,
) -> RequestSource:
    """What the soak sends, made once now that the target is checked; with ``replay`` (the
    trace, scanned before connecting) those sized and timed by the trace."""
    if replay is None:
        return _network_payloads(cfg, target, early)
    if target.api == "openai":
        return network_replay(cfg, replay, None)
    return network_replay(cfg, replay, _network_payloads(cfg, target, early), _v2_lengths(cfg, target, early))


def _v2_lengths(cfg: Config, target: ClientTarget, early: BodySource | PromptSource | None) -> LengthSizer | None:
    """kserve-v2 tensors (no ``--samples``) whose last dimension the model lets vary: a replayed
    row's length sets it. None: the trace sets the timing only."""
    if target.api != "kserve-v2" or early is not None:
        return None
    from soakd.targets.kserve import KServeGrpcTarget, KServeRestTarget  # loaded already (a kserve-v2 target)

    assert isinstance(target, KServeGrpcTarget | KServeRestTarget)
    shape = target.model.sequence_axis
    return None if shape is None else LengthSizer(shape, target.encode, cfg.load.seed)


def _network_payloads(cfg: Config, target: ClientTarget, early: BodySource | PromptSource | None) -> RequestSource:
    """openai's prompts, the bodies as they are, or (kserve-v2) JSON bodies as gRPC messages,
    or the pooled tensors of ``--input-shapes`` (else the model's declared shape) encoded for
    the model's input."""
    if isinstance(early, PromptSource):
        return early
    bodies = early
    if target.api != "kserve-v2":
        assert bodies is not None  # config validation requires --samples for --api http
        return bodies
    # A kserve-v2 target exists, so its module is loaded already: this import costs nothing.
    from soakd.targets.kserve import KServeGrpcTarget, KServeRestTarget

    assert isinstance(target, KServeGrpcTarget | KServeRestTarget)
    if bodies is None:
        v2 = target.model.input
        assert v2 is not None  # settled by the start check
        source = ShapeSource(v2.spec, pool=cfg.input.pool, seed=cfg.load.seed, encode=target.encode)
        log.info("%d pooled %s tensors per shape of %s, for input %r", cfg.input.pool, v2.datatype, v2.spec, v2.name)
        return source
    if isinstance(target, KServeGrpcTarget):
        bodies.encode(target.encode_body)
    return bodies


def warm_up_target(
    cfg: Config, target: ClientTarget, source: RequestSource, stop: threading.Event, metrics: Metrics | None = None
) -> WarmupResult:
    """``model.warmup`` requests one by one, kept out of the histograms and counters."""
    res = target.warm_up([payload for _, payload in source.warmup_inputs()], cfg.model.warmup, stop)
    if metrics is not None:
        metrics.first_inference.set(res.first_seconds)
        metrics.warmup.set(res.total_seconds)
    log.info(
        "warmup: %d requests in %.2fs (first %.3fs)%s",
        res.calls,
        res.total_seconds,
        res.first_seconds,
        f", {res.failures} failed" if res.failures else "",
    )
    return res


def target_cold_start(connect_seconds: float, warm: WarmupResult, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "target_connect_seconds": round(connect_seconds, 4),
        "first_inference_seconds": round(warm.first_seconds, 4),
        "warmup_seconds": round(warm.total_seconds, 4),
        "warmup_runs": runs,
    }
    if warm.failures:
        out["warmup_failures"] = warm.failures
    return out


def target_fingerprint(cfg: Config, run_id: str) -> dict[str, Any]:
    tg = cfg.target
    return fingerprint(
        cfg,
        run_id=run_id,
        model_spec=f"{tg.api}:{tg.url}",
        model_sha256=None,
        device=None,
        input_desc=f"samples {cfg.input.samples}"
        if cfg.input.samples
        else f"shapes {cfg.input.shapes or '(the model declares)'}",
        target={"url": tg.url, "api": tg.api, "model": tg.model},
    )


def export_target_run_info(metrics: Metrics, run_id: str, cfg: Config, fp: dict[str, Any]) -> None:
    metrics.run_info.labels(
        run_id, fp["model"], "", "remote", "", torch.__version__, str(torch.version.cuda), load_mode(cfg)
    ).set(1)
    metrics.run_start_time.set(time.time())
