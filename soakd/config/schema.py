"""The config's sections as dataclasses. Each key is one declaration: its type, its default, and
a :func:`~soakd.config.keys.doc` with what it means (``--help``), its unit and its bounds, which
msgspec enforces while it reads the TOML (:mod:`soakd.config.convert`); a duration adds
:data:`SECONDS` or :data:`SECONDS_OR_OFF`. Every key is also in ``examples/soak.toml``.
Checks across keys, and of text formats, are :mod:`soakd.config.validate`'s."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from msgspec import Meta

from soakd.config.bounds import (
    MAX_BURSTINESS,
    MAX_INT,
    MAX_RATE,
    MAX_RESAMPLES,
    MAX_WORKERS,
    MIN_FLUSH_INTERVAL,
    MIN_MEMORY_INTERVAL,
)
from soakd.config.keys import INT_AS_TEXT, SECONDS, SECONDS_OR_OFF, doc
from soakd.config.redact import redact_secrets

TargetApi = Literal["http", "openai", "kserve-v2"]
TARGET_APIS: tuple[str, ...] = typing.get_args(TargetApi)


@dataclass
class ModelConfig:
    spec: Annotated[str, doc("the model: builtin:NAME, torchscript:PATH, export:PATH, python:MOD:FN")] = (
        "builtin:convnet"
    )
    device: Annotated[str, doc("where the model runs: auto (CUDA if present), cpu or cuda[:N]")] = "auto"
    warmup: Annotated[int, doc("calls before measuring, kept out of every figure", unit="calls", ge=0)] = 50
    # The model alone at the max batch size: the figure achieved throughput is held against.
    offline_probe: Annotated[
        float, SECONDS_OR_OFF, doc("after warm-up, the model alone at the max batch size this long (0: skip)")
    ] = 1.0
    dtype: Annotated[Literal["float32", "float16", "bfloat16"], doc("the model's floating-point type")] = "float32"
    options: Annotated[dict[str, Any], doc("keyword arguments for builtin and python model factories")] = field(
        default_factory=dict
    )


@dataclass
class LoadConfig:
    concurrency: (
        Annotated[
            int, doc("closed loop: requests in flight (8 when neither this nor a rate is set)", unit="requests", ge=1)
        ]
        | None
    ) = None
    rate: (
        Annotated[
            float,
            doc(
                "open loop: arrivals per second, latency from the intended send",
                unit="requests/s",
                gt=0,
                le=MAX_RATE,
                why="one arrival per microsecond: soakd's sender stamps each arrival in about 1 µs and could "
                "never catch up",
            ),
        ]
        | None
    ) = None
    arrival: Annotated[Literal["constant", "poisson", "gamma"], doc("open loop's arrival process")] = "poisson"
    burstiness: Annotated[
        float,
        doc(
            "gamma arrivals: squared coefficient of variation of the gaps (1: Poisson)",
            gt=0,
            le=MAX_BURSTINESS,
            why="gamma shape 1/burstiness: most gaps underflow to exactly 0, one unbounded burst",
        ),
    ] = 1.0
    max_inflight: Annotated[
        int, doc("open loop: requests beyond this are dropped (and counted), not delayed", unit="requests", ge=1)
    ] = 1024
    duration: Annotated[float, SECONDS, doc("how long to soak (none: until stopped)")] | None = None
    drain_timeout: Annotated[float, SECONDS, doc("on stop: what is still queued then is dropped (counted)")] = 10.0
    seed: Annotated[int, doc("seed of the arrival and input draws", ge=0, le=MAX_INT, why="numpy seeds")] = 0
    # Trace replay (docs/replay.md): arrivals and sizes from a recorded trace, an open loop.
    replay: (
        Annotated[str, doc("replay a trace's arrivals and sizes (Mooncake, Azure, BurstGPT or soakd's own log)")] | None
    ) = None
    replay_format: Annotated[
        Literal["auto", "mooncake", "azure", "burstgpt", "soakd"], doc("the trace's format (auto: from the file)")
    ] = "auto"
    replay_speed: Annotated[
        float, doc("replay X times as fast as recorded (send time = row offset / speed)", unit="x", gt=0, le=1e6)
    ] = 1.0
    replay_loop: Annotated[bool, doc("wrap the trace until the duration (each pass offset by its span)")] = False
    replay_block_tokens: Annotated[int, doc("Mooncake: tokens per hash_id block", unit="tokens", ge=1, le=MAX_INT)] = (
        512
    )
    replay_keep_failed: Annotated[bool, doc("BurstGPT: keep the rows with 0 response tokens (failed requests)")] = False
    replay_sort_window: Annotated[
        int,
        doc(
            "rows held to sort timestamps that step back (0: a step back is exit 2 naming the line)",
            unit="rows",
            ge=0,
            le=1_000_000,
            why="the rows are held in memory",
        ),
    ] = 0
    # Many drivers, one soak (docs/shards.md).
    shard: Annotated[
        str,
        doc(
            "shard I of one soak split over N drivers (hosts, pods), as I/N: the arrivals of the soak's one "
            "process whose index is I mod N, or its share of concurrency (empty: the whole soak)"
        ),
    ] = ""
    start_at: Annotated[
        str, doc("wall-clock instant every shard's schedule counts from (ISO 8601 with a zone, or unix seconds)")
    ] = ""
    workers: Annotated[
        int,
        doc(
            "driver processes on this host, one soak (a served model, --target): the parent merges them",
            unit="processes",
            ge=1,
            le=MAX_WORKERS,
        ),
    ] = 1

    @property
    def open_loop(self) -> bool:
        """A rate or a replayed trace means open loop; otherwise closed loop. Every part asks here."""
        return self.rate is not None or self.replay is not None


@dataclass
class BatcherConfig:
    max_batch_size: Annotated[int, doc("dynamic batcher: requests per batch at most", unit="requests", ge=1)] = 8
    max_queue_delay_ms: Annotated[
        float, doc("dynamic batcher: the longest the oldest request waits for a fuller batch", unit="ms", ge=0)
    ] = 2.0
    instances: Annotated[
        int, doc("model threads taking batches concurrently (CPU hosts may gain from 2+)", unit="threads", ge=1)
    ] = 1
    inference_timeout: Annotated[float, SECONDS, doc('slower batches count outcome="timeout" (none: no limit)')] | (
        None
    ) = None
    empty_cache_on_oom: Annotated[bool, doc("torch.cuda.empty_cache() after an out-of-memory error")] = False


@dataclass
class InputConfig:
    shapes: Annotated[
        str, doc("tensor shapes (3x224x224=0.7,...) or seq:... token lengths (empty: the model's default)")
    ] = ""
    samples: Annotated[str, doc("request files (images, JSON, text) instead of made tensors")] | None = None
    pool: Annotated[int, doc("distinct pre-made tensors per shape, cycled", unit="tensors", ge=1)] = 8
    preprocess_workers: Annotated[int, doc("threads decoding the sample files", unit="threads", ge=1, le=256)] = 2
    postprocess: Annotated[
        Literal["auto", "none", "classify", "detect"],
        doc("what the postprocess stage does (auto: on with samples; kind by output shape)"),
    ] = "auto"
    pad: Annotated[bool, doc("token sequences: one batch key, padded to the batch's longest")] = False
    max_tokens: Annotated[int, doc("text samples: tokens kept per request", unit="tokens", ge=1)] = 512
    max_sample_bytes: Annotated[
        int, doc("a larger sample file (or text line) is bad_input, read no further", unit="bytes", ge=1)
    ] = 64 * 1024 * 1024


@dataclass
class MetricsConfig:
    addr: Annotated[str, doc("where /metrics, /healthz and /status listen (HOST:PORT)")] = "127.0.0.1:9464"
    status_interval: Annotated[float, SECONDS, doc("how often the live status line is logged")] = 5.0


@dataclass
class OutputConfig:
    summary_json: Annotated[str, doc("write the summary JSON here at the end")] | None = None
    log_file: Annotated[str, doc("also log here; SIGHUP reopens it (logrotate)")] | None = None
    record_requests: (
        Annotated[str, doc("log each request (intended time, size, outcome) as JSONL for --replay")] | None
    ) = None
    record_max_bytes: Annotated[
        int,
        doc(
            "the request log stops growing here (said in the log)",
            unit="bytes",
            ge=4096,
            le=MAX_INT,
            why="room for a few records",
        ),
    ] = 256 * 1024 * 1024


@dataclass
class StateConfig:
    dir: Annotated[str, doc("SQLite state and reports (none: $STATE_DIRECTORY or ./soakd-state)")] | None = None
    run_id: Annotated[str, doc("name of the run (none: a timestamp and random suffix)")] | None = None
    resume: Annotated[bool, doc("continue the state dir's unfinished run (none: only under systemd)")] | None = None
    flush_interval: Annotated[
        float,
        SECONDS,
        doc("a kill -9 loses at most this much", ge=MIN_FLUSH_INTERVAL, why="each flush is one SQLite transaction"),
    ] = 2.0
    window: Annotated[float, SECONDS, doc("one latency histogram row per window")] = 60.0
    retention: Annotated[float, SECONDS, doc("samples, windows and events older than this are deleted")] = 30 * 86400.0


@dataclass
class PhasesConfig:
    ramp: Annotated[float, SECONDS_OR_OFF, doc("linear ramp to the target load (0: start at the target)")] = 0.0
    ramp_from: Annotated[float, doc("share of the target load the ramp starts from", gt=0, le=1)] = 0.1
    probe_schedule: Annotated[str, doc('crontab of load probes, e.g. "0 * * * *": every hour (empty: none)')] = ""
    probe_duration: Annotated[float, SECONDS, doc("how long each probe lasts")] = 60.0
    probe_factor: Annotated[float, doc("load multiplier during a probe (burst or concurrency step)", gt=0)] = 2.0


@dataclass
class DaemonConfig:
    stall_timeout: Annotated[
        float, SECONDS, doc("no request finished this long with some in flight: the model is hung")
    ] = 60.0
    sampler_stale_after: (
        Annotated[
            float, SECONDS, doc("a memory sampler silent this long is stale (none: max(5 x memory.interval, 30 s))")
        ]
        | None
    ) = None


@dataclass
class MemoryConfig:
    interval: Annotated[
        float,
        SECONDS,
        doc(
            "how often memory is sampled",
            ge=MIN_MEMORY_INTERVAL,
            why="one round of every memory collector takes milliseconds",
        ),
    ] = 10.0
    sample_timeout: Annotated[float, SECONDS, doc("a source call slower than this is marked down")] = 2.0
    snapshot_interval: (
        Annotated[float, SECONDS, doc("largest free block via torch.cuda.memory_snapshot() (none: never)")] | None
    ) = None
    tracemalloc: Annotated[bool, doc("Python allocation sites (slows allocation 3-5x)")] = False
    ring_size: Annotated[int, doc("samples kept in memory per series", unit="samples", ge=10)] = 100_000


@dataclass
class LeakConfig:
    # Defaults measured with bench/leak/detection.py and bench/leak/power.py (docs/leak-verdicts.md).
    warmup: Annotated[
        float, SECONDS_OR_OFF, doc("memory growth this early is not judged (the data may show a longer warm-up)")
    ] = 900.0
    window: Annotated[
        float, SECONDS, doc("longest span of memory a leak verdict looks at; a shorter one scales the others")
    ] = 6 * 3600.0
    evaluate_interval: Annotated[float, SECONDS, doc("how often the leak verdicts are computed")] = 60.0
    min_slope_bytes_per_hour: Annotated[
        dict[str, float],
        doc("per series (host_rss, ..., or default: 2 MiB/h): slower growth is never a leak", unit="bytes/h"),
    ] = field(default_factory=dict)
    trough_span: Annotated[float, SECONDS, doc("lower envelope: rides out sawtooth up to this period")] = 1800.0
    bin: Annotated[float, SECONDS, doc("spacing of the trough points")] = 60.0
    alpha: Annotated[float, doc("false-alarm probability over a whole leak-free run, however long", gt=0, lt=0.5)] = (
        0.01
    )
    # A slower creep is a finding (summary, report), not a page.
    horizon: Annotated[
        float, SECONDS, doc("a leak pages only when it would exhaust the headroom within this uptime")
    ] = 30 * 86400.0
    persistence: Annotated[float, SECONDS_OR_OFF, doc("a suspected verdict clears after this long unheld")] = 1800.0
    min_span: Annotated[float, SECONDS, doc("the shortest span judged")] = 900.0
    # A known load period: memory is judged at the same point of each cycle (docs/leak-verdicts.md).
    cycle: (
        Annotated[
            float,
            SECONDS,
            doc("the load repeats with this period: judge each cycle against the last (none: phases.probe_schedule's)"),
        ]
        | None
    ) = None
    cuda_history: Annotated[
        Literal["auto", "always", "off"], doc("record CUDA allocations (auto: while suspicion builds)")
    ] = "auto"
    cuda_history_max_entries: Annotated[
        int, doc("ring size of torch's allocation history", unit="entries", ge=1, le=10_000_000)
    ] = 100_000
    malloc_trim_probe: Annotated[bool, doc("host series: does malloc_trim(0) give the growth back?")] = True


@dataclass
class OtelConfig:
    enabled: Annotated[bool, doc("export OpenTelemetry (none: on when OTEL_EXPORTER_OTLP_*ENDPOINT is set)")] | (
        None
    ) = None
    export_interval: Annotated[float, SECONDS, doc("how often metrics are exported")] = 10.0
    trace_sample_ratio: Annotated[float, doc("share of requests traced", ge=0, le=1)] = 0.01


@dataclass
class SloConfig:
    p99_ms: Annotated[float, doc("end-to-end p99 latency at most", unit="ms", ge=0)] | None = None
    # Unset: the default gate (DEFAULT_MAX_ERROR_RATIO) applies, so a soak whose requests failed
    # never exits 0; "none" turns the error gate off on purpose.
    max_error_ratio: Annotated[float, doc('share of requests not ok at most ("none": no error gate)', ge=0, le=1)] | (
        Literal["none"] | None
    ) = None
    min_throughput_rps: Annotated[float, doc("throughput at least", unit="requests/s", ge=0)] | None = None
    stage_p99_ms: Annotated[dict[str, float], doc("p99 per stage, e.g. {inference = 20.0}", unit="ms")] = field(
        default_factory=dict
    )
    no_leak: Annotated[list[str], doc("memory series that must not be judged leaking")] = field(default_factory=list)
    min_duration: Annotated[float, SECONDS, doc("a shorter run cannot pass (too short to judge)")] | None = None
    # --api openai, per request: one that meets both counts toward goodput.
    ttft_ms: Annotated[float, doc("openai: time to first token at most", unit="ms", ge=0)] | None = None
    tpot_ms: Annotated[float, doc("openai: time per output token at most", unit="ms", ge=0)] | None = None


@dataclass
class CompareConfig:
    """``soakd compare`` gates: a change counts as a regression only when it is past the
    threshold and outside the noise (a bootstrap interval over per-window values)."""

    max_throughput_drop: Annotated[float, doc("share of A's throughput B may lose", ge=0, lt=1)] = 0.05
    max_p99_increase: Annotated[float, doc("share of A's p99 B may add, per stage", ge=0)] = 0.10
    max_error_ratio_increase: Annotated[float, doc("error ratio B may add (absolute)", ge=0)] = 0.001
    leak: Annotated[bool, doc("a leak suspected in B and not in A is a regression")] = True
    confidence: Annotated[float, doc("confidence of the bootstrap interval", ge=0.5, lt=1)] = 0.95
    resamples: Annotated[
        int,
        doc(
            "resamples of the bootstrap interval",
            unit="resamples",
            ge=100,
            le=MAX_RESAMPLES,
            why="past a million a 95% interval no longer moves",
        ),
    ] = 2000


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

    url: Annotated[str, doc("a served model's URL, instead of a model in soakd's process")] | None = None
    api: Annotated[TargetApi, doc("the served model's protocol")] = "http"
    model: Annotated[str, doc("the served model's name (openai: none = the first of /models)")] | None = None
    openai_endpoint: Annotated[
        Literal["chat", "completions"], doc("openai: chat (/chat/completions) or completions (/completions)")
    ] = "chat"
    stream: Annotated[bool, doc("openai: SSE; false: one JSON answer per request (no TTFT/ITL/TPOT then)")] = True
    output_tokens: (
        Annotated[str, INT_AS_TEXT, doc("openai: max_tokens per request, N or a seq: length spec (none: the server's)")]
        | None
    ) = None
    tokenizer: Annotated[str, doc("openai: a local tokenizer dir for prompts of exact token lengths")] | None = None
    chunk_timeout: Annotated[float, SECONDS, doc("streamed: the longest wait for the next chunk")] = 10.0
    datatype: Annotated[str, doc("kserve-v2 tensors (none: the model's declared one, else FP32)")] | None = None
    timeout: Annotated[float, SECONDS, doc("per request, connection wait included; later: outcome timeout")] = 30.0
    max_connections: (
        Annotated[int, doc("none: load.concurrency (closed loop) or 256 (open loop)", unit="connections", ge=1)] | None
    ) = None
    watch_pid: Annotated[list[Annotated[int, Meta(ge=1)]], doc("server processes whose RSS/USS are sampled")] = field(
        default_factory=list
    )
    watch_unit: Annotated[
        list[str], doc("systemd units whose MainPID's memory is sampled, followed across restarts")
    ] = field(default_factory=list)
    scrape: Annotated[list[str], doc("the server's own Prometheus endpoints")] = field(default_factory=list)
    scrape_metrics: Annotated[list[str], doc("the gauges kept from each scrape")] = field(
        default_factory=lambda: list(SCRAPE_METRICS)
    )
    scrape_timeout: Annotated[
        float, SECONDS, doc("per scrape; a slow endpoint is a failed sample, not a stall", le=30)
    ] = 1.0


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
