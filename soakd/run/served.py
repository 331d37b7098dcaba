"""The steps of a soak and a sweep of a model served over the network (``--target``): open the
client and check its URL, read the bodies or prompts before anything connects, make what is sent,
warm up, fingerprint. Nothing here imports torch: a served model's driver runs none, and each
protocol's module is imported by its builder, only when ``--api`` names it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from soakd.config import Config
from soakd.fingerprint import fingerprint
from soakd.run.health import Health
from soakd.run.identity import load_mode
from soakd.targets.base import AnyTarget, WarmupResult
from soakd.targets.client import ClientTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.bodies import BodySource
from soakd.workload.prompts import PromptSource
from soakd.workload.replay import LengthSizer, network_replay, open_trace
from soakd.workload.shapes import ShapeSource
from soakd.workload.sources import RequestSource
from soakd.workload.traces import Trace, TraceInfo

log = logging.getLogger("soakd")

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
    return {"target_connect_seconds": round(connect_seconds, 4), **warm.cold_start(runs)}


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
        run_id, fp["model"], "", "remote", "", fp["torch_version"], str(fp["cuda_version"]), load_mode(cfg)
    ).set(1)
    metrics.run_start_time.set(time.time())


class Served:
    """A model served over the network (``--target``): its client opened and its URL checked."""

    opening = "connecting"
    device: None = None  # no model here: telemetry samples this host; the server's memory is watched apart
    cuda_index: int | None = None

    def __init__(self, cfg: Config, metrics: Metrics, health: Health) -> None:
        self.cfg, self.metrics = cfg, metrics
        health.starting = "starting: connecting to and warming up the target"
        replay = open_replay(cfg)  # a bad trace, bodies or prompts: exit 2 before anything connects
        early = read_inputs(cfg)
        self.client, self.connect_seconds = open_network_target(cfg, metrics)
        self.target: AnyTarget = self.client
        health.target_down = self.client.down_reason
        self.label = self.client.spec
        self.summary: Callable[[], dict[str, Any]] | None = self.client.summary
        try:
            self._source = network_source(cfg, self.client, early, replay)
        except BaseException:
            self.client.close()
            raise

    def source(self) -> RequestSource:
        return self._source

    def warm_up(self, source: RequestSource, stop: threading.Event) -> WarmupResult:
        return warm_up_target(self.cfg, self.client, source, stop, self.metrics)

    def probe_offline(self, source: RequestSource, stop: threading.Event) -> dict[str, Any] | None:
        return None  # a served model batches itself: there is no offline loop to time here

    def fingerprint(self, run_id: str) -> dict[str, Any]:
        fp = target_fingerprint(self.cfg, run_id)
        export_target_run_info(self.metrics, run_id, self.cfg, fp)
        return fp

    def cold_start(self, warm: WarmupResult) -> dict[str, Any]:
        return target_cold_start(self.connect_seconds, warm, self.cfg.model.warmup)

    def close(self) -> None:
        self.client.close()
