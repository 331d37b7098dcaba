"""The metric catalogue: every metric soakd exports, in one place.

Names, labels and units follow ``shared/DESIGN.md``; dashboards and alert rules depend on
them. Everything is registered on an injected registry so tests (and several engines in one
process) never share global state.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from soakd.names import LEAK_SERIES, OUTCOMES, STAGES
from soakd.telemetry.histogram import LogHistogram

__all__ = ["LEAK_SERIES", "OUTCOMES", "PREFIX", "STAGES", "Metrics"]  # the names live in soakd.names

PREFIX = "soakd_"
RESPONSE_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")  # none: no HTTP answer (refused, reset, timeout)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
GC_PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class LogHistogramCollector(Collector):
    """Exposes labelled :class:`LogHistogram` s as one Prometheus histogram family."""

    def __init__(self, name: str, documentation: str, label: str) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self._children: dict[str, LogHistogram] = {}
        self._lock = threading.Lock()

    def labels(self, value: str) -> LogHistogram:
        with self._lock:
            child = self._children.get(value)
            if child is None:
                child = self._children[value] = LogHistogram()
            return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label] if self.label else [])
        with self._lock:
            children = list(self._children.items())
        for value, hist in children:
            snap = hist.snapshot()
            buckets: list[tuple[str, float]] = [(repr(b), float(c)) for b, c in snap.le_counts()]
            buckets.append(("+Inf", float(snap.count)))
            family.add_metric([value] if self.label else [], buckets, snap.total)
        yield family

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=[self.label] if self.label else [])]


class BatchSizeCollector(Collector):
    """``soakd_batch_size`` as a Prometheus histogram, kept as batches per exact size.

    One place for the batch sizes: the summary's percentiles and the exported buckets read the
    same counts. Recording is one dict update (a prometheus_client Histogram walks its bucket
    bounds under a lock on every batch, work a batch-1 soak pays per request); ``count`` is
    called under the engine's completion lock, so the update needs no lock of its own."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[int]) -> None:
        self.name = name
        self.documentation = documentation
        self.buckets = tuple(buckets)
        self._by_size: dict[int, int] = {}

    def count(self, size: int) -> None:
        by_size = self._by_size
        by_size[size] = by_size.get(size, 0) + 1

    def total(self) -> int:
        """Batches so far, of any size."""
        return sum(self.by_size().values())

    def by_size(self) -> dict[int, int]:
        """Batches per exact size, a copy."""
        return dict(self._by_size)  # one C-level copy: consistent under the GIL

    def collect(self) -> Iterator[Metric]:
        by_size = self.by_size()
        family = HistogramMetricFamily(self.name, self.documentation)
        buckets: list[tuple[str, float]] = [
            (str(float(le)), float(sum(n for size, n in by_size.items() if size <= le))) for le in self.buckets
        ]
        buckets.append(("+Inf", float(sum(by_size.values()))))
        family.add_metric([], buckets, float(sum(size * n for size, n in by_size.items())))
        yield family

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation)]


class OutcomeCounter(Collector):
    """``soakd_requests_total{outcome}``: the one place requests are counted by outcome. The engine
    adds to it and reads it back for the summary and the status line, /metrics reads the same
    counts. One dict update under one lock a batch (a prometheus_client Counter child, beside
    the engine's own counts, took two locks and four Python calls, per request at batch 1)."""

    def __init__(self, name: str, documentation: str, outcomes: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self._counts = dict.fromkeys(outcomes, 0)
        self._lock = threading.Lock()

    def add(self, outcome: str, n: int) -> None:
        with self._lock:
            self._counts[outcome] += n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["outcome"])
        for outcome, n in self.counts().items():
            family.add_metric([outcome], float(n))
        yield family

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=["outcome"])]


class MirrorCounter(Collector):
    """A counter whose value is copied from a monotonic source counter (torch, NVML, gc).

    prometheus_client's Counter can only be incremented; the sources already count, and
    copying their totals keeps the exported value equal to the source's across scrapes.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def set(self, labels: Sequence[str], value: float) -> None:
        key = tuple(labels)
        with self._lock:
            # Never let the exported value go down: a source reset would look like a counter
            # reset to Prometheus and give wrong rates.
            if value >= self._values.get(key, 0.0):
                self._values[key] = value

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            items = list(self._values.items())
        for labels, value in items:
            family.add_metric(list(labels), value)
        yield family

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]


class Metrics:
    """All of soakd's metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        p = PREFIX

        # ---- load
        self.request_duration = LogHistogramCollector(
            p + "request_duration_seconds", "Request latency per pipeline stage", "stage"
        )
        r.register(self.request_duration)
        self.schedule_lag = LogHistogramCollector(
            p + "schedule_lag_seconds", "Open loop: actual minus intended send time", ""
        )
        r.register(self.schedule_lag)
        self.requests = OutcomeCounter(p + "requests", "Requests by outcome", OUTCOMES)
        r.register(self.requests)
        self.batch_size = BatchSizeCollector(p + "batch_size", "Requests per model batch", BATCH_BUCKETS)
        r.register(self.batch_size)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting in the batcher", registry=r)
        self.inflight = Gauge(p + "inflight_requests", "Requests sent and not yet completed", registry=r)
        self.distinct_shapes = Gauge(p + "input_shapes_seen", "Distinct input shapes seen so far", registry=r)
        self.preprocess_busy = Gauge(
            p + "preprocess_pool_busy_ratio", "Share of preprocess workers busy (last interval)", registry=r
        )
        self.model_load = Gauge(
            p + "model_load_seconds", "Time to load the model and move it to the device", registry=r
        )
        self.first_inference = Gauge(
            p + "first_inference_seconds", "Time of the first inference after load (cold start)", registry=r
        )
        self.warmup = Gauge(p + "warmup_seconds", "Time spent in warmup runs", registry=r)
        self.model_offline_rps = Gauge(
            p + "model_offline_rps", "The model alone at the max batch size after warm-up (requests/s)", registry=r
        )
        self.harness_overhead_ratio = Gauge(
            p + "harness_overhead_ratio",
            "soakd's own per-batch work in the model threads over model time",
            registry=r,
        )
        self.run_info = Gauge(
            p + "run_info",
            "Run fingerprint (value 1)",
            ["run_id", "model", "model_sha256", "device", "device_name", "torch_version", "cuda_version", "mode"],
            registry=r,
        )
        self.build_info = Gauge(p + "build_info", "soakd build (value 1)", ["version"], registry=r)
        self.run_start_time = Gauge(p + "run_start_time_seconds", "Unix time the run started", registry=r)
        self.phase_info = Gauge(p + "phase_info", "Current phase of the run (value 1)", ["phase"], registry=r)

        # ---- torch CUDA allocator (labels: device, pool)
        dp = ["device", "pool"]
        self.cuda_allocated = Gauge(p + "torch_cuda_allocated_bytes", "Allocated by tensors", dp, registry=r)
        self.cuda_reserved = Gauge(p + "torch_cuda_reserved_bytes", "Reserved by the caching allocator", dp, registry=r)
        self.cuda_active = Gauge(p + "torch_cuda_active_bytes", "Active blocks", dp, registry=r)
        self.cuda_inactive_split = Gauge(
            p + "torch_cuda_inactive_split_bytes", "Inactive, non-releasable split blocks", dp, registry=r
        )
        self.cuda_requested = Gauge(p + "torch_cuda_requested_bytes", "Bytes requested by callers", dp, registry=r)
        self.cuda_segments = Gauge(p + "torch_cuda_segments", "Reserved segments (cudaMalloc blocks)", dp, registry=r)
        self.cuda_alloc_retries = MirrorCounter(
            p + "torch_cuda_alloc_retries_total", "Allocations that freed the cache and retried", ["device"]
        )
        self.cuda_ooms = MirrorCounter(p + "torch_cuda_ooms_total", "Out-of-memory errors raised", ["device"])
        self.cuda_device_allocs = MirrorCounter(
            p + "torch_cuda_device_allocs_total", "cudaMalloc calls by the allocator", ["device"]
        )
        self.cuda_device_frees = MirrorCounter(
            p + "torch_cuda_device_frees_total", "cudaFree calls by the allocator", ["device"]
        )
        for c in (self.cuda_alloc_retries, self.cuda_ooms, self.cuda_device_allocs, self.cuda_device_frees):
            r.register(c)
        self.cuda_fragmentation = Gauge(
            p + "torch_cuda_fragmentation_ratio",
            "reserved_unallocated = 1 - allocated/reserved; inactive_split = inactive_split/reserved",
            ["device", "kind"],
            registry=r,
        )
        self.cuda_largest_free_block = Gauge(
            p + "torch_cuda_largest_free_block_bytes", "Largest free block in reserved segments", ["device"], registry=r
        )
        self.cuda_device_free = Gauge(
            p + "torch_cuda_device_free_bytes", "Free device memory (cudaMemGetInfo)", ["device"], registry=r
        )

        # ---- NVML (labels: gpu, uuid)
        gu = ["gpu", "uuid"]
        self.gpu_memory_used = Gauge(p + "gpu_memory_used_bytes", "GPU memory used (all processes)", gu, registry=r)
        self.gpu_memory_total = Gauge(p + "gpu_memory_total_bytes", "GPU memory total", gu, registry=r)
        self.gpu_memory_reserved = Gauge(
            p + "gpu_memory_reserved_bytes", "GPU memory reserved by the driver", gu, registry=r
        )
        self.gpu_process_memory = Gauge(
            p + "gpu_process_memory_bytes", "GPU memory used by a process", [*gu, "pid"], registry=r
        )
        self.gpu_utilization = Gauge(p + "gpu_utilization_ratio", "GPU busy share", gu, registry=r)
        self.gpu_sm_clock = Gauge(p + "gpu_sm_clock_hertz", "SM clock", gu, registry=r)
        self.gpu_power = Gauge(p + "gpu_power_watts", "Power draw", gu, registry=r)
        self.gpu_energy = MirrorCounter(p + "gpu_energy_joules_total", "Energy since driver load", gu)
        r.register(self.gpu_energy)
        self.gpu_temperature = Gauge(p + "gpu_temperature_celsius", "GPU temperature", gu, registry=r)
        self.gpu_clock_event = Gauge(
            p + "gpu_clock_event_reason_active", "Clock event (throttle) reason active", [*gu, "reason"], registry=r
        )

        # ---- host
        self.process_rss = Gauge(p + "process_resident_memory_bytes", "Resident set size", registry=r)
        self.process_uss = Gauge(p + "process_unique_memory_bytes", "Unique set size (private pages)", registry=r)
        self.process_cpu = MirrorCounter(p + "process_cpu_seconds_total", "CPU time of this process", [])
        r.register(self.process_cpu)
        self.process_threads = Gauge(p + "process_threads", "Threads in this process", registry=r)
        self.process_open_fds = Gauge(p + "process_open_fds", "Open file descriptors", registry=r)
        self.host_available = Gauge(p + "host_memory_available_bytes", "Host memory available", registry=r)
        self.malloc_arena = Gauge(p + "malloc_arena_bytes", "glibc malloc: bytes obtained from the OS", registry=r)
        self.malloc_in_use = Gauge(p + "malloc_in_use_bytes", "glibc malloc: bytes in use", registry=r)
        self.malloc_free = Gauge(p + "malloc_free_bytes", "glibc malloc: free bytes held", registry=r)
        self.tracemalloc_traced = Gauge(p + "tracemalloc_traced_bytes", "Python allocations traced", registry=r)
        self.gc_collections = MirrorCounter(p + "python_gc_collections_total", "Python GC collections", ["generation"])
        r.register(self.gc_collections)
        self.gc_pause = Histogram(
            p + "python_gc_pause_seconds", "Python GC pause", ["generation"], buckets=GC_PAUSE_BUCKETS, registry=r
        )

        # ---- network targets
        # Labelled by the target URL, so an in-process run exports none of them (no false "down").
        self.target_up = Gauge(
            p + "target_up",
            "1 while the network target answers HTTP; 0 after a refused or reset connection",
            ["target"],
            registry=r,
        )
        self.target_responses = Counter(
            p + "target_responses",
            "Network target answers by HTTP status class (none: no HTTP answer)",
            ["target", "class"],
            registry=r,
        )
        # ---- streams (--api openai): recorded by the target, per measured request
        self.ttft = LogHistogramCollector(
            p + "time_to_first_token_seconds", "From the intended send to the first content token", ""
        )
        r.register(self.ttft)
        self.itl = LogHistogramCollector(p + "inter_token_latency_seconds", "Between content chunks of a stream", "")
        r.register(self.itl)
        self.tpot = LogHistogramCollector(
            p + "time_per_output_token_seconds", "Per request: (last token - first token) / (output tokens - 1)", ""
        )
        r.register(self.tpot)
        self.tokens = Counter(p + "tokens", "Prompt (input) and generated (output) tokens", ["kind"], registry=r)
        self.goodput = Counter(
            p + "goodput_requests", "Requests that ended ok within the per-request TTFT/TPOT SLOs", registry=r
        )
        self.target_process_rss = Gauge(
            p + "target_process_resident_memory_bytes",
            "Resident set size of a watched server process",
            ["pid"],
            registry=r,
        )
        self.target_process_uss = Gauge(
            p + "target_process_unique_memory_bytes",
            "Unique set size of a watched server process",
            ["pid"],
            registry=r,
        )
        self.target_gpu_process_memory = Gauge(
            p + "target_gpu_process_memory_bytes",
            "GPU memory used by a watched server process (NVML's per-process list)",
            ["pid", "gpu"],
            registry=r,
        )
        self.target_metric = Gauge(
            p + "target_metric",
            "A gauge scraped from the served model's own /metrics (summed over its labels; a counter as its rate/s)",
            ["name"],
            registry=r,
        )

        # ---- collectors
        self.collector_up = Gauge(
            p + "collector_up", "1 when the source's last sample succeeded", ["source"], registry=r
        )
        self.collector_duration = Gauge(
            p + "collector_duration_seconds", "Duration of the source's last sample", ["source"], registry=r
        )
        self.collector_last_success = Gauge(
            p + "collector_last_success_timestamp_seconds", "Unix time of the last good sample", ["source"], registry=r
        )

        # ---- leak verdicts (label: series)
        self.leak_suspected = Gauge(p + "leak_suspected", "1 when the series is judged to leak", ["series"], registry=r)
        self.leak_slope = Gauge(
            p + "leak_slope_bytes_per_hour", "Robust trend of the series after warm-up", ["series"], registry=r
        )
        self.leak_p_value = Gauge(p + "leak_p_value", "Trend test p-value", ["series"], registry=r)
        self.leak_detectable_slope = Gauge(
            p + "leak_detectable_slope_bytes_per_hour",
            "Smallest slope the data so far would have caught with 90% probability (NaN: not judged)",
            ["series"],
            registry=r,
        )
        self.leak_finding = Gauge(
            p + "leak_finding",
            "1 while the series rises but is not paged: finding = creep (the headroom outlasts leak.horizon)"
            " | allocator_retention (malloc_trim gave the growth back) | early (too slow to page before the"
            " series' swings could show)",
            ["series", "finding"],
            registry=r,
        )
        self.memory_exhaustion_eta = Gauge(
            p + "memory_exhaustion_eta_seconds",
            "Time to the limit at the current slope (+Inf: never)",
            ["series"],
            registry=r,
        )

    def collector_last_successes(self) -> dict[str, float]:
        """``{source: unix time of its last good sample}``: the one figure soakd reads back from
        its own registry, since the gauge is where the scheduler keeps it."""
        out: dict[str, float] = {}
        for family in self.collector_last_success.collect():
            for sample in family.samples:
                out[sample.labels["source"]] = float(sample.value)
        return out
