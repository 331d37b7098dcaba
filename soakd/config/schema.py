"""The config's sections as dataclasses: every key, its type and its default (every key also in
``examples/soak.toml``). A duration key carries ``_duration`` metadata that
:mod:`soakd.config.coerce` reads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from soakd.config.redact import redact_secrets


def _duration(default: float | None, *, positive: bool = True, allow_zero: bool = False) -> Any:
    return field(default=default, metadata={"duration": True, "positive": positive, "zero": allow_zero})


@dataclass
class ModelConfig:
    spec: str = "builtin:convnet"
    device: str = "auto"
    warmup: int = 50
    # After warm-up: the model alone at the max batch size for this long (0: skip), the figure
    # soakd's achieved throughput is held against (soakd_model_offline_rps).
    offline_probe: float = _duration(1.0, allow_zero=True)
    dtype: str = "float32"
    # Keyword arguments for builtin and python factories (e.g. a test model's stall period).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadConfig:
    concurrency: int | None = None  # closed loop; the default when neither this nor rate is set
    rate: float | None = None  # open loop, requests per second
    arrival: str = "poisson"
    burstiness: float = 1.0  # gamma arrivals: squared coefficient of variation of the gaps
    max_inflight: int = 1024  # open loop: requests beyond this are dropped, not delayed
    duration: float | None = _duration(None)  # None: run until stopped
    drain_timeout: float = _duration(10.0)  # what is still queued then is dropped (counted)
    seed: int = 0
    # "I/N": this driver is shard I of one soak split over N drivers (hosts, pods): it sends the
    # arrivals of the soak's one process whose index is I mod N (a Poisson process thinned by
    # index, so the shards' arrivals interleave as one process's) or its share of concurrency.
    shard: str = ""
    # A wall-clock instant (ISO 8601 or unix seconds) every shard's schedule counts from; "": now.
    start_at: str = ""
    # N driver processes on this host, one soak (a served model: --target): each shard I of N,
    # the parent merging their histograms into one /metrics and one summary.
    workers: int = 1

    @property
    def open_loop(self) -> bool:
        """A rate means open loop; otherwise closed loop. Every part asks here."""
        return self.rate is not None


@dataclass
class BatcherConfig:
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    instances: int = 1  # model threads taking batches concurrently (CPU hosts may gain from 2+)
    inference_timeout: float | None = _duration(None)  # slower batches count outcome="timeout"
    empty_cache_on_oom: bool = False  # torch.cuda.empty_cache() after an out-of-memory error


@dataclass
class InputConfig:
    shapes: str = ""  # empty: the model's default input shape
    samples: str | None = None
    pool: int = 8  # distinct pre-made tensors per shape, cycled
    # Production-like requests (see soakd/workload/): sample decoding runs in this many threads.
    preprocess_workers: int = 2
    postprocess: str = "auto"  # auto (on with samples; kind by output shape) | none | classify | detect
    pad: bool = False  # token sequences: one batch key, padded to the batch's longest
    max_tokens: int = 512  # text samples: tokens kept per request
    # A sample file (or one line of a text file) larger than this is bad_input, read no further.
    max_sample_bytes: int = 64 * 1024 * 1024


@dataclass
class MetricsConfig:
    addr: str = "127.0.0.1:9464"
    status_interval: float = _duration(5.0)


@dataclass
class OutputConfig:
    summary_json: str | None = None
    log_file: str | None = None  # also log here; SIGHUP re-opens it (logrotate)


@dataclass
class StateConfig:
    dir: str | None = None  # None: $STATE_DIRECTORY under systemd, else ./soakd-state
    run_id: str | None = None
    resume: bool | None = None  # continue the state dir's unfinished run; None: only under systemd
    flush_interval: float = _duration(2.0)  # a kill -9 loses at most this much
    window: float = _duration(60.0)  # one latency histogram row per window
    retention: float = _duration(30 * 86400.0)


@dataclass
class PhasesConfig:
    ramp: float = _duration(0.0, allow_zero=True)  # 0: start at the target load
    ramp_from: float = 0.1  # share of the target load the ramp starts from
    probe_schedule: str = ""  # crontab, e.g. "0 * * * *": a probe at the top of every hour
    probe_duration: float = _duration(60.0)
    probe_factor: float = 2.0  # load multiplier during a probe (burst or concurrency step)


@dataclass
class DaemonConfig:
    stall_timeout: float = _duration(60.0)  # no request finished this long with some in flight: hung
    sampler_stale_after: float | None = _duration(None)  # None: max(5 x memory.interval, 30 s)


@dataclass
class MemoryConfig:
    interval: float = _duration(10.0)
    sample_timeout: float = _duration(2.0)
    snapshot_interval: float | None = _duration(None)  # largest free block via memory_snapshot()
    tracemalloc: bool = False
    ring_size: int = 100_000  # samples kept in memory per series


@dataclass
class LeakConfig:
    # Defaults measured with bench/leak_detection.py and bench/leak_power.py (docs/leak-verdicts.md).
    warmup: float = _duration(900.0, allow_zero=True)  # a floor: the data may show warm-up lasts longer
    window: float = _duration(6 * 3600.0)  # the longest span judged; a shorter one scales the others down
    evaluate_interval: float = _duration(60.0)
    # Per series (host_rss, ..., or "default"; default 2 MiB/h): slower growth is never a leak.
    min_slope_bytes_per_hour: dict[str, float] = field(default_factory=dict)
    trough_span: float = _duration(1800.0)  # lower envelope: rides out sawtooth up to this period
    bin: float = _duration(60.0)  # spacing of the trough points
    alpha: float = 0.01  # false-alarm probability over a whole leak-free run, however long
    # A suspected leak pages only when it would exhaust the measured headroom within this much
    # uptime; slower creep is a finding (summary, report), not a page.
    horizon: float = _duration(30 * 86400.0)
    persistence: float = _duration(1800.0, allow_zero=True)  # a suspected verdict clears after this long unheld
    min_span: float = _duration(900.0)  # the shortest span judged
    cuda_history: str = "auto"  # auto: record allocations while suspicion builds | always | off
    cuda_history_max_entries: int = 100_000  # ring size of torch's allocation history
    malloc_trim_probe: bool = True  # host series: does malloc_trim(0) give the growth back?


@dataclass
class OtelConfig:
    enabled: bool | None = None  # None: on when an OTEL_EXPORTER_OTLP_*ENDPOINT variable is set
    export_interval: float = _duration(10.0)
    trace_sample_ratio: float = 0.01


@dataclass
class SloConfig:
    p99_ms: float | None = None  # end-to-end
    # Share of requests not ok. Unset: the default gate (DEFAULT_MAX_ERROR_RATIO) applies, so a
    # soak whose requests failed never exits 0; "none" turns the error gate off on purpose.
    max_error_ratio: float | Literal["none"] | None = field(default=None, metadata={"off_word": "none"})
    min_throughput_rps: float | None = None
    stage_p99_ms: dict[str, float] = field(default_factory=dict)  # per stage, e.g. {inference = 20.0}
    no_leak: list[str] = field(default_factory=list)  # memory series that must not be judged leaking
    min_duration: float | None = _duration(None)  # a shorter run cannot pass (too short to judge)
    # --api openai, per request: one that meets both counts toward goodput (None: no limit).
    ttft_ms: float | None = None
    tpot_ms: float | None = None


@dataclass
class CompareConfig:
    """``soakd compare`` gates: a change counts as a regression only when it is past the
    threshold and outside the noise (a bootstrap interval over per-window values)."""

    max_throughput_drop: float = 0.05  # share of A's throughput
    max_p99_increase: float = 0.10  # share of A's p99, per stage
    max_error_ratio_increase: float = 0.001  # absolute
    leak: bool = True  # a leak suspected in B and not in A is a regression
    confidence: float = 0.95
    resamples: int = 2000


# Server gauges kept from --scrape by default: what creeps when a server leaks or backs up.
# vLLM renamed its KV-cache gauge (gpu_ -> kv_): both are listed, a missing name is not sampled.
SCRAPE_METRICS = (
    "vllm:gpu_cache_usage_perc",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting",
    "nv_gpu_memory_used_bytes",
    "nv_inference_queue_duration_us",
)


@dataclass
class TargetConfig:
    """A served model instead of ``[model]`` (soakd/targets/): soakd is then only the client."""

    url: str | None = None  # None: the model in [model] runs in soakd's own process
    api: str = "http"  # http | openai | kserve-v2
    model: str | None = None  # the served model's name (openai: None = the first of GET /models)
    # --api openai (soakd/targets/openai.py):
    openai_endpoint: str = "chat"  # chat: /chat/completions | completions: /completions
    stream: bool = True  # SSE; false: one JSON answer per request (no TTFT/ITL/TPOT then)
    # max_tokens per request: N (TOML int or string) or a seq: length spec; None: the server's default
    output_tokens: str | None = field(default=None, metadata={"int_as_text": True})
    tokenizer: str | None = None  # a local tokenizer dir: synthetic prompts of exact token lengths
    chunk_timeout: float = _duration(10.0)  # streamed: the longest wait for the next chunk
    datatype: str | None = None  # kserve-v2 tensors: None = the model's declared one, else FP32
    timeout: float = _duration(30.0)  # per request, connection wait included; later: outcome timeout
    max_connections: int | None = None  # None: load.concurrency (closed loop) or 256 (open loop)
    watch_pid: list[int] = field(default_factory=list)  # server processes whose RSS/USS are sampled
    watch_unit: list[str] = field(default_factory=list)  # systemd units: their MainPID, followed across restarts
    scrape: list[str] = field(default_factory=list)  # the server's own Prometheus endpoints
    scrape_metrics: list[str] = field(default_factory=lambda: list(SCRAPE_METRICS))  # the gauges kept
    scrape_timeout: float = _duration(1.0)  # per scrape; a slow endpoint is a failed sample, not a stall


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    input: InputConfig = field(default_factory=InputConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    state: StateConfig = field(default_factory=StateConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    leak: LeakConfig = field(default_factory=LeakConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    phases: PhasesConfig = field(default_factory=PhasesConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    target: TargetConfig = field(default_factory=TargetConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def redacted(self) -> dict[str, Any]:
        """:meth:`to_dict` with credential-like values replaced: what every output may hold."""
        redacted: dict[str, Any] = redact_secrets(self.to_dict())
        return redacted
