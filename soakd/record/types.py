"""The run record as types: what ``soakd-summary.json``, ``soakd report --format json`` and a
fleet JSON hold (the keys are a contract: DESIGN.md).

One record type, :class:`RunRecord`, holds a summary and a report alike: the figures both have
(``throughput_rps``, ``requests``, ``latency_ms``...) and those only one writes, each typed
``X | UnsetType = UNSET``: a key a file does not have stays absent when it is written again, and
a reader tells "not there" (an older soakd, or the other kind of document) from ``null``. The
fields are declared in the order the summary writes its keys. Open-ended blocks (the run's
fingerprint and config, cold start, the offline probe) stay mappings: soakd reads a few known
keys from them and passes the rest through untouched.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

Number = int | float  # an int stays an int when read and written again


class Record(msgspec.Struct, kw_only=True):
    """Base of every record type: ``UNSET`` fields are left out when written. (``kw_only`` holds
    for the fields a class declares itself, so a class with a required field after optional ones
    says it again.)"""


class Percentiles(Record):
    """A timing's figures over a run, in ms (null: no requests, so no percentile)."""

    p50: Number | None = None
    p90: Number | None = None
    p99: Number | None = None
    p999: Number | None = None
    max: Number | None = None
    mean: Number | None = None
    count: int | UnsetType = UNSET


class WindowPercentiles(Record):
    p50: Number | None = None
    p90: Number | None = None
    p99: Number | None = None


class ScheduleLag(Record):
    """How late an open loop sent its requests against their intended times, in ms."""

    p50: Number | None = None
    p99: Number | None = None
    max: Number | None = None


class BatchBucket(Record):
    le: Number
    count: int


class BatchSize(Record):
    batches: int = 0
    mean: Number | None = None
    p50: Number | None = None
    p99: Number | None = None
    max: Number | None = None
    buckets: list[BatchBucket] | UnsetType = UNSET


class WindowRow(Record):
    """One window of the run: its end (seconds from the start), length, throughput, counts."""

    t: Number | None = None
    seconds: Number | None = None
    throughput_rps: Number | None = None
    ok: int | None = None
    errors: int | None = None
    latency_ms: dict[str, WindowPercentiles] | UnsetType = UNSET

    @property
    def latency(self) -> dict[str, WindowPercentiles]:
        """Per-stage percentiles (empty where the row has none, or an older record no key)."""
        return self.latency_ms if isinstance(self.latency_ms, dict) else {}


class MemorySeries(Record):
    """One memory series: its range, trend and leak verdict (``leak_suspected`` None: not
    judged). A series without samples has only ``samples``, ``leak_suspected`` and ``verdict``."""

    samples: int | UnsetType = UNSET
    first: Number | UnsetType | None = UNSET
    last: Number | UnsetType | None = UNSET
    min: Number | UnsetType | None = UNSET
    max: Number | UnsetType | None = UNSET
    seconds: Number | UnsetType | None = UNSET
    trend_bytes_per_hour: Number | UnsetType | None = UNSET
    leak_state: str | UnsetType | None = UNSET
    leak_suspected: bool | UnsetType | None = UNSET
    slope_bytes_per_hour: Number | UnsetType | None = UNSET
    p_value: Number | UnsetType | None = UNSET
    detectable_slope_bytes_per_hour: Number | UnsetType | None = UNSET
    judged_seconds: Number | UnsetType | None = UNSET
    exhaustion_eta_seconds: Number | UnsetType | None = UNSET
    verdict_source: str | UnsetType = UNSET
    verdict: str | UnsetType = UNSET

    @property
    def leak(self) -> bool | None:
        """True: a leak suspected; False: judged, no leak; None: not judged (or not recorded)."""
        return self.leak_suspected if isinstance(self.leak_suspected, bool) else None

    @property
    def slope(self) -> float | None:
        """Bytes per hour: the leak detector's slope, else the robust trend (older records)."""
        for v in (self.slope_bytes_per_hour, self.trend_bytes_per_hour):
            if isinstance(v, int | float):
                return float(v)
        return None


class SloCheck(Record):
    name: str
    limit: Number | None = None
    observed: Number | str | None = None
    op: str = ""
    unit: str = ""
    passed: bool | None = None
    status: str = ""


class SloBlock(Record):
    """The gate: passed unless a check failed (an unjudged check is shown, not counted)."""

    passed: bool = True
    failed: list[str] = msgspec.field(default_factory=list)
    checks: list[SloCheck] = msgspec.field(default_factory=list)


class LlmBlock(Record):
    """A streaming target's per-token timings and token counts."""

    ttft_ms: Percentiles | None = None
    itl_ms: Percentiles | None = None
    tpot_ms: Percentiles | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_per_second: Number | None = None
    goodput_requests: int | None = None
    goodput_rps: Number | None = None
    # ttft, itl, tpot in seconds, as ``latency_histograms`` holds them: drivers merge them exactly
    histograms: dict[str, dict[str, Any]] | None = None


class TargetBlock(Record):
    """A served model: where it was, how it answered, how long it was down."""

    url: str | None = None
    api: str | None = None
    up: bool | None = None
    down_seconds: Number | None = None
    outages: int | None = None
    responses: dict[str, int] = msgspec.field(default_factory=dict)
    max_connections: int | UnsetType | None = UNSET
    timeout_seconds: Number | UnsetType | None = UNSET
    # --api openai: the served model's name, chat or completions, and whether it streamed
    model: str | UnsetType | None = UNSET
    endpoint: str | UnsetType | None = UNSET
    stream: bool | UnsetType | None = UNSET


class ReplayArrivals(Record):
    """A replayed trace per bucket of ``bucket_seconds`` (60; wider past two days, so the lists
    stay bounded) from the soak's start: rows due by their intended time (sent or dropped), rows
    sent by the time sent, requests completed (any outcome) by the time they finished."""

    bucket_seconds: Number = 60.0
    intended: list[int] = msgspec.field(default_factory=list)
    sent: list[int] = msgspec.field(default_factory=list)
    completed: list[int] = msgspec.field(default_factory=list)


class ReplayBlock(Record):
    """A replayed trace (docs/replay.md): its fingerprint, how it was replayed, the rows sent,
    dropped, skipped and bad, and its arrivals per minute beside the achieved ones. Every key is
    optional: a record written before a key existed reads and writes back without it."""

    path: str | UnsetType = UNSET
    sha256: str | UnsetType = UNSET
    format: str | UnsetType = UNSET
    rows: int | UnsetType = UNSET
    span_seconds: Number | UnsetType = UNSET
    speed: Number | UnsetType = UNSET
    loop: bool | UnsetType = UNSET
    passes: int | UnsetType = UNSET
    rows_sent: int | UnsetType = UNSET
    rows_dropped: int | UnsetType = UNSET
    rows_skipped: int | UnsetType = UNSET
    rows_bad: int | UnsetType = UNSET
    bad_lines: list[str] | UnsetType = UNSET
    rows_bad_met: int | UnsetType = UNSET
    on_time_ratio: Number | UnsetType | None = UNSET
    intended_rps: Number | UnsetType | None = UNSET
    offered_rps: Number | UnsetType | None = UNSET
    arrivals: ReplayArrivals | UnsetType = UNSET
    rows_clipped: int | UnsetType = UNSET


class Segment(Record):
    """One process's part of a run (a restart starts the next)."""

    id: int
    pid: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    last_seen: str | None = None
    duration_seconds: Number | None = None
    end: str | None = None
    requests: dict[str, int] = msgspec.field(default_factory=dict)


class Event(Record):
    t: str | None = None
    segment: int | None = None
    kind: str = ""
    detail: Any = None


class RunRecord(Record):
    """A run's summary or report. The report's own keys (``run_id`` ... ``events``) are UNSET in
    a summary; a plain ``report --format json`` has no ``windows``, ``slo`` or batch figures."""

    run_id: str | UnsetType = UNSET
    created_at: str | UnsetType | None = UNSET
    finished: bool | UnsetType = UNSET
    finished_at: str | UnsetType | None = UNSET
    throughput_rps: Number | None = None
    duration_seconds: Number | None = None
    requests: dict[str, int] = msgspec.field(default_factory=dict)
    latency_ms: dict[str, Percentiles] = msgspec.field(default_factory=dict)
    segments: list[Segment] | UnsetType = UNSET
    restarts: int | UnsetType = UNSET
    unclean_exits: int | UnsetType = UNSET
    batch_size: BatchSize | UnsetType | None = UNSET
    input_shapes_seen: int | dict[str, Any] | list[Any] | UnsetType = UNSET
    cold_start: dict[str, Any] | UnsetType | None = UNSET
    events: list[Event] | UnsetType = UNSET
    run: dict[str, Any] | UnsetType | None = UNSET  # the fingerprint: model, versions, device, host, config
    schedule_lag_ms: ScheduleLag | UnsetType = UNSET
    offered_rps: Number | UnsetType | None = UNSET
    replay: ReplayBlock | UnsetType = UNSET  # a replayed trace: rows sent, skipped, bad (docs/replay.md)
    model_offline: dict[str, Any] | UnsetType | None = UNSET
    llm: LlmBlock | UnsetType | None = UNSET
    windows: list[WindowRow] | UnsetType | None = UNSET
    memory: dict[str, MemorySeries] | UnsetType = UNSET
    run_duration_seconds: Number | UnsetType | None = UNSET
    target: TargetBlock | UnsetType | None = UNSET
    slo: SloBlock | UnsetType | None = UNSET
    # Present only where the run used them (docs/replay.md, docs/shards.md):
    record_requests: dict[str, Any] | UnsetType = UNSET  # --record-requests: the log's path, rows, bytes
    shard: dict[str, Any] | UnsetType = UNSET  # --shard I/N: which, its clock skew
    workers: list[dict[str, Any]] | UnsetType = UNSET  # --workers N: each worker's restarts and deaths
    merge: dict[str, Any] | UnsetType = UNSET  # report --merge: shards expected, missing, failed
    shards: list[dict[str, Any]] | UnsetType = UNSET  # report --merge: each shard's share and health

    # Reading: every accessor below answers for a summary, a report and older records alike.

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.run if isinstance(self.run, dict) else {}

    @property
    def config(self) -> dict[str, Any]:
        config = self.fingerprint.get("config")
        return config if isinstance(config, dict) else {}

    @property
    def series(self) -> dict[str, MemorySeries]:
        return self.memory if isinstance(self.memory, dict) else {}

    @property
    def rows(self) -> list[WindowRow]:
        return self.windows if isinstance(self.windows, list) else []

    @property
    def replay_block(self) -> ReplayBlock | None:
        return self.replay if isinstance(self.replay, ReplayBlock) else None

    @property
    def llm_block(self) -> LlmBlock | None:
        return self.llm if isinstance(self.llm, LlmBlock) else None

    @property
    def target_block(self) -> TargetBlock | None:
        return self.target if isinstance(self.target, TargetBlock) else None

    @property
    def slo_block(self) -> SloBlock | None:
        return self.slo if isinstance(self.slo, SloBlock) else None

    @property
    def mean_batch(self) -> float | None:
        return float(self.batch_size.mean) if isinstance(self.batch_size, BatchSize) and self.batch_size.mean else None

    def p99(self, stage: str = "e2e") -> float | None:
        stats = self.latency_ms.get(stage)
        return None if stats is None or stats.p99 is None else float(stats.p99)

    @property
    def leaks(self) -> list[str]:
        """Series with a leak suspected, sorted."""
        return sorted(name for name, s in self.series.items() if s.leak is True)

    @property
    def judged_duration(self) -> float | None:
        """The run's whole duration (earlier segments of a resumed run count), else this one's."""
        for v in (self.run_duration_seconds, self.duration_seconds):
            if isinstance(v, int | float):
                return float(v)
        return None


class WorstGpu(Record):
    name: str
    passed: bool
    reasons: list[str]
    p99_e2e_ms: Number | None


class FleetVerdict(Record):
    gpus: int
    passed: bool
    verdict: str
    failed_gpus: list[str]
    worst_gpu: WorstGpu
    merged_latency_exact: bool
    notes: list[str]


class DeviceGroup(Record):
    gpus: list[str]
    failed_gpus: list[str]
    throughput_rps: Number
    latency_ms: dict[str, Percentiles] | None


class GpuEntry(Record, kw_only=True):
    """One GPU's run in a fleet: its figures and verdict, its histograms, its whole record."""

    name: str
    source: str = ""
    run_id: str | None = None
    device_name: str | None = None
    host: str | None = None
    passed: bool = True
    reasons: list[str] = msgspec.field(default_factory=list)
    duration_seconds: Number | None = None
    throughput_rps: Number | None = None
    requests: dict[str, int] = msgspec.field(default_factory=dict)
    error_ratio: Number | None = None
    latency_ms: dict[str, Percentiles] | None = None
    leaks: dict[str, bool | None] = msgspec.field(default_factory=dict)
    slo: SloBlock | None = None
    latency_histograms: dict[str, dict[str, Any]] | None = None
    report: RunRecord


class FleetRecord(Record):
    """``soakd report --fleet``'s JSON: the merged figures and verdict, one entry per GPU."""

    fleet: FleetVerdict
    throughput_rps: Number
    requests: dict[str, int]
    error_ratio: Number | None
    latency_ms: dict[str, Percentiles] | None
    latency_histograms: dict[str, dict[str, Any]] | None
    slo: SloBlock | None
    by_device_name: dict[str, DeviceGroup]
    gpus: list[GpuEntry]

    def merged(self) -> RunRecord:
        """The merged figures as a record, for ``compare`` (no merged percentiles: none there)."""
        return RunRecord(
            throughput_rps=self.throughput_rps,
            requests=dict(self.requests),
            latency_ms=dict(self.latency_ms or {}),
            slo=self.slo,
        )
