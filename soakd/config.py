"""Typed configuration: defaults, TOML loading, CLI overrides, validation.

Every key has a default, so an empty file (or none) is a valid config. Every error names
the key path (``load.concurrency``) or the file, and surfaces as :class:`ConfigError`,
which the CLI turns into exit code 2. Every number has a bound that follows from the machine
or the protocol (see "bounds" below), and the error names the key, the value and the bound.

This module imports nothing of soakd above it: only :mod:`soakd.errors`, :mod:`soakd.names`
and :mod:`soakd.specs` (the pure parsers of the strings a config holds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


from soakd.errors import ConfigError
from soakd.names import LEAK_SERIES, STAGES, TARGET_METRIC_PREFIX
from soakd.specs import (
    SEQ_PREFIX,
    V2_DATATYPES,
    SeqLenSpec,
    check_crontab,
    check_model_input,
    check_model_spec,
    is_seq_spec,
    parse_seq_spec,
    parse_shape_mix,
)

__all__ = ["ConfigError"]  # re-exported: most callers meet it here, beside load_config


_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|us|µs|s|m|h|d)?", re.IGNORECASE)
_UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


# A duration of ten years outlasts any soak and keeps every deadline soakd computes from one
# (the monotonic clock plus the duration) far inside threading.TIMEOUT_MAX (292 years) and
# exact in a float; beyond it, timers overflow (OverflowError) or wait forever.
MAX_DURATION = 10 * 366 * 86400.0


def parse_duration(value: str | float | int) -> float:
    """Parse ``90s``, ``1h30m``, ``250ms`` or a plain number of seconds into seconds.

    ValueError for anything else: text that is no duration, a TOML date or time, inf, nan, or
    more than :data:`MAX_DURATION`."""
    if isinstance(value, (datetime.date, datetime.time)):  # TOML has dates; a duration is not one
        raise ValueError(f"expected a duration such as 90s or 1h30m, got the TOML date/time {value}")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a duration such as 90s or 1h30m, got {value!r}")
    total = float(value) if isinstance(value, (int, float)) else _parse_duration_text(value)
    if not math.isfinite(total):
        raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
    if total > MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than the bound of 10 years ({MAX_DURATION:.0f}s)")
    return total


def _parse_duration_text(value: str) -> float:
    text = value.strip()
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_RE.match(text, pos)
        if not m:
            raise ValueError(f"cannot parse duration {value!r} (use e.g. 90s, 5m, 1h30m, 250ms)")
        unit = (m.group(2) or "s").lower()
        if m.group(2) is None and pos > 0:
            raise ValueError(f"cannot parse duration {value!r}: missing unit after a number")
        total += float(m.group(1)) * _UNIT_SECONDS[unit]
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return total


def _duration(default: float | None, *, positive: bool = True, allow_zero: bool = False) -> Any:
    return field(default=default, metadata={"duration": True, "positive": positive, "zero": allow_zero})


# --------------------------------------------------------------------------- sections


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
    # uptime; slower creep is a finding (summary, report, info alert), not a page.
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


# --------------------------------------------------------------------------- loading


MAX_INT = 2**63 - 1


def _coerce(value: Any, tp: Any, path: str, meta: typing.Mapping[str, Any]) -> Any:
    if meta.get("off_word") is not None and value == meta["off_word"]:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, meta)
    if meta.get("duration"):
        try:
            seconds = parse_duration(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if seconds < 0 or (seconds == 0 and not meta.get("zero")):
            raise ConfigError(f"{path}: duration must be {'>= 0' if meta.get('zero') else '> 0'}, got {value!r}")
        return seconds
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        number: int | None = value if isinstance(value, int) else None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = int(value)
        if number is None:
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        if not -MAX_INT <= number <= MAX_INT:  # the database and numpy hold 64-bit integers
            raise ConfigError(f"{path}: {value} is outside the 64-bit integer range [-{MAX_INT}, {MAX_INT}]")
        return number
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        real: float | None = float(value) if isinstance(value, (int, float)) else None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                real = float(value)
        if real is None:
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(real):  # no setting means anything at inf or nan; reports cannot hold them
            raise ConfigError(f"{path}: must be a finite number, got {value!r}")
        return real
    if tp is str:
        if isinstance(value, str):
            return value
        if meta.get("int_as_text") and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a table, got {value!r}")
        _, vtp = typing.get_args(tp)
        if vtp is Any:
            return dict(value)
        return {k: _coerce(v, vtp, f"{path}.{k}", {}) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        (etp,) = typing.get_args(tp)
        return [_coerce(v, etp, f"{path}[{i}]", {}) for i, v in enumerate(value)]
    raise ConfigError(f"{path}: unsupported type {tp!r}")  # pragma: no cover - programming error


def _build(cls: type[Any], data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            kind = "key" if prefix else "section"
            known = ", ".join(sorted(names))
            raise ConfigError(f"{where}: unknown {kind} (known: {known})")
    kwargs: dict[str, Any] = {}
    for name, f in names.items():
        if name not in data:
            continue
        path = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(data[name], dict):
                raise ConfigError(f"{path}: expected a table [{path}]")
            kwargs[name] = _build(typing.cast(type, tp), data[name], path)
        else:
            kwargs[name] = _coerce(data[name], tp, path, f.metadata)
    return cls(**kwargs)


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    section, key = path.split(".", 1)
    data.setdefault(section, {})[key] = value


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config is a page of keys; a larger file is the wrong file


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's TOML as a dict; ConfigError (one line, naming the file) for anything else:
    missing, unreadable, larger than 4 MiB, not UTF-8, not TOML, or nested too deeply."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a text file (not UTF-8 at byte {exc.start}); expected TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: arrays or tables nested too deeply") from None


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read TOML (when given), apply ``{"load.concurrency": 4}``-style overrides, validate."""
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    overrides = overrides or {}
    # A load mode given on the command line replaces the other mode from the file.
    if "load.concurrency" in overrides and "load.rate" not in overrides:
        data.get("load", {}).pop("rate", None)
    if "load.rate" in overrides and "load.concurrency" not in overrides:
        data.get("load", {}).pop("concurrency", None)
    for key, value in overrides.items():
        _set_path(data, key, value)
    cfg: Config = _build(Config, data, "")
    settle(cfg)
    validate(cfg)
    return cfg


def settle(cfg: Config) -> None:
    """Defaults that depend on other keys, filled in before validation (which changes nothing)."""
    if cfg.load.concurrency is None and cfg.load.rate is None:
        cfg.load.concurrency = 8  # closed loop, 8 in flight: neither mode given
    lk = cfg.leak
    # A window shorter than 30 evaluations (an accelerated run) is judged that often instead.
    lk.evaluate_interval = min(lk.evaluate_interval, max(1.0, lk.window / 30))


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


# --------------------------------------------------------------------------- bounds
#
# Each bound follows from the machine or the protocol, and says so in its error.

# Open-loop arrivals are stamped one at a time by one thread, about 1 µs each (200,000/s
# measured with a flat RSS); above one per microsecond the sender can never catch up, and the
# schedule's lag (and its memory) grows without bound.
MAX_RATE = 1_000_000.0
# Gamma gaps have shape 1/burstiness. At burstiness 100 (shape 0.01) one gap in 2,000 underflows
# to exactly 0 in float64; at 1000, half of them do: arrivals in unbounded bursts at one instant.
MAX_BURSTINESS = 100.0
REQUEST_BYTES = 512  # one request in flight: its record (slots), timings and queue entries
TENSOR_OVERHEAD_BYTES = 1024  # a pooled tensor's Python and torch objects, beside its data
RING_SERIES = 32  # memory series soakd keeps a ring for (its own, the GPU's, scraped gauges)
RING_SAMPLE_BYTES = 16  # one (unix time, value) pair of float64
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
TOKEN_BYTES = 8  # token ids are int64
MIN_TIMER = 0.001  # seconds: finer timers than this are below what a thread's wake-up can keep
MIN_FLUSH_INTERVAL = 0.1  # seconds: each state flush is one SQLite transaction
MIN_MEMORY_INTERVAL = 0.1  # seconds: one round of every memory collector takes milliseconds
MAX_RESAMPLES = 1_000_000  # bootstrap resamples: past 10^6 a 95% interval's third digit holds still
MODEL_THREADS_PER_CPU = 4  # model threads beyond this per core only queue for the cores and the GIL
MAX_RUN_ID = 128  # a run id names a folder and files in the state dir (NAME_MAX is 255)
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def parse_host_port(addr: str, key: str = "metrics.addr") -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT`` or ``:PORT`` (loopback) -> (host, port); ConfigError naming
    ``key`` otherwise. An IPv6 address needs its brackets: ``::1:9464`` is ambiguous."""
    text = addr.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host:
            raise ConfigError(f"{key}: expected [IPV6]:PORT, got {addr!r}")
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ConfigError(f"{key}: expected HOST:PORT, got {addr!r}")
        if ":" in host:
            raise ConfigError(f"{key}: {addr!r}: put an IPv6 address in brackets, e.g. [::1]:9464")
    if not (port.isdigit() and 0 <= int(port) <= 65535):
        raise ConfigError(f"{key}: port must be within [0, 65535], got {addr!r}")
    if host and not re.fullmatch(r"[A-Za-z0-9.:%_-]+", host):
        raise ConfigError(f"{key}: {host!r} is not a host name or address")
    return host or "127.0.0.1", int(port)


def check_run_id(run_id: str, key: str = "state.run_id") -> str:
    """A run id names a folder in the state dir: letters, digits and ``-_.``, no path."""
    if not _RUN_ID_RE.fullmatch(run_id) or ".." in run_id or len(run_id) > MAX_RUN_ID:
        raise ConfigError(
            f"{key}: {run_id!r} is not a run name (letters, digits, '-', '_', '.', starting with a "
            f"letter or digit, no '..', at most {MAX_RUN_ID} characters)"
        )
    return run_id


def _require_range(key: str, value: float, low: float, high: float, why: str = "") -> None:
    if not low <= value <= high:
        reason = f" ({why})" if why else ""
        raise ConfigError(f"{key}: must be within [{low:g}, {high:g}]{reason}, got {value:g}")


def _check_durations(cfg: Config) -> None:
    """Positive durations are at least a millisecond: no timer of soakd's means anything finer."""
    for section in dataclasses.fields(cfg):
        sub = getattr(cfg, section.name)
        for f in dataclasses.fields(sub):
            value = getattr(sub, f.name)
            if f.metadata.get("duration") and value and value < MIN_TIMER:
                raise ConfigError(
                    f"{section.name}.{f.name}: must be 0 or >= {MIN_TIMER * 1000:g}ms "
                    f"(finer than a thread's wake-up), got {value:g}s"
                )


def validate(cfg: Config) -> None:
    """Cross-field and range checks; raises ConfigError naming the key path, value and bound."""
    check_model_spec(cfg.model.spec)
    _require(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.model.device) is not None,
        f"model.device: expected auto, cpu or cuda[:N], got {cfg.model.device!r}",
    )
    _require(cfg.model.warmup >= 0, f"model.warmup: must be >= 0, got {cfg.model.warmup}")
    _require(
        cfg.model.dtype in ("float32", "float16", "bfloat16"),
        f"model.dtype: expected float32, float16 or bfloat16, got {cfg.model.dtype!r}",
    )
    _check_durations(cfg)
    ld = cfg.load
    _require(
        ld.concurrency is None or ld.rate is None,
        "load.concurrency and load.rate: choose one (closed loop or open loop), not both",
    )
    if ld.concurrency is not None:
        _require(ld.concurrency >= 1, f"load.concurrency: must be >= 1, got {ld.concurrency}")
    if ld.open_loop:
        assert ld.rate is not None
        _require(ld.rate > 0, f"load.rate: must be > 0 requests/s, got {ld.rate}")
        _require(
            ld.rate <= MAX_RATE,
            f"load.rate: {ld.rate:g} requests/s is over the bound of {MAX_RATE:g}/s (one arrival per "
            "microsecond: soakd's sender stamps each arrival in about 1 µs and could never catch up)",
        )
    _require(
        ld.arrival in ("constant", "poisson", "gamma"),
        f"load.arrival: expected constant, poisson or gamma, got {ld.arrival!r}",
    )
    _require(ld.burstiness > 0, f"load.burstiness: must be > 0, got {ld.burstiness}")
    _require(
        ld.burstiness <= MAX_BURSTINESS,
        f"load.burstiness: {ld.burstiness:g} is over the bound of {MAX_BURSTINESS:g} (gamma shape "
        f"1/{ld.burstiness:g}: most gaps underflow to exactly 0, one unbounded burst)",
    )
    _require(ld.max_inflight >= 1, f"load.max_inflight: must be >= 1, got {ld.max_inflight}")
    _require(0 <= ld.seed <= MAX_INT, f"load.seed: must be within [0, {MAX_INT}] (numpy seeds), got {ld.seed}")
    b = cfg.batcher
    _require(b.max_batch_size >= 1, f"batcher.max_batch_size: must be >= 1, got {b.max_batch_size}")
    stall_ms = cfg.daemon.stall_timeout * 1000
    _require(b.max_queue_delay_ms >= 0, f"batcher.max_queue_delay_ms: must be >= 0, got {b.max_queue_delay_ms}")
    _require(
        b.max_queue_delay_ms < stall_ms,
        f"batcher.max_queue_delay_ms: {b.max_queue_delay_ms:g} is over the bound of daemon.stall_timeout "
        f"({stall_ms:g} ms: a request waiting that long for a batch reads as a hung model)",
    )
    _require(b.instances >= 1, f"batcher.instances: must be >= 1, got {b.instances}")
    _require(cfg.input.pool >= 1, f"input.pool: must be >= 1, got {cfg.input.pool}")
    if is_seq_spec(cfg.input.shapes):
        try:
            parse_seq_spec(cfg.input.shapes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    elif cfg.input.shapes:
        try:
            parse_shape_mix(cfg.input.shapes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    check_model_input(cfg.model.spec, cfg.input.shapes, cfg.input.samples)
    if cfg.input.samples is not None:
        _require(Path(cfg.input.samples).is_dir(), f"input.samples: {cfg.input.samples}: no such directory")
    _require(
        1 <= cfg.input.preprocess_workers <= 256,
        f"input.preprocess_workers: must be within [1, 256], got {cfg.input.preprocess_workers}",
    )
    _require(
        cfg.input.postprocess in ("auto", "none", "classify", "detect"),
        f"input.postprocess: expected auto, none, classify or detect, got {cfg.input.postprocess!r}",
    )
    _require(cfg.input.max_tokens >= 1, f"input.max_tokens: must be >= 1, got {cfg.input.max_tokens}")
    _require(cfg.input.max_sample_bytes >= 1, f"input.max_sample_bytes: must be >= 1, got {cfg.input.max_sample_bytes}")
    parse_host_port(cfg.metrics.addr)
    _require(cfg.memory.ring_size >= 10, f"memory.ring_size: must be >= 10, got {cfg.memory.ring_size}")
    _require(
        cfg.memory.interval >= MIN_MEMORY_INTERVAL,
        f"memory.interval: must be >= {MIN_MEMORY_INTERVAL:g}s (one round of every memory collector "
        f"takes milliseconds), got {cfg.memory.interval:g}s",
    )
    _validate_leak(cfg.leak)
    _validate_target(cfg)
    _require(
        0.0 <= cfg.otel.trace_sample_ratio <= 1.0,
        f"otel.trace_sample_ratio: must be within [0, 1], got {cfg.otel.trace_sample_ratio}",
    )
    for name in ("p99_ms", "min_throughput_rps", "ttft_ms", "tpot_ms"):
        v = getattr(cfg.slo, name)
        _require(v is None or v >= 0, f"slo.{name}: must be >= 0, got {v}")
    ratio = cfg.slo.max_error_ratio
    _require(
        ratio is None or ratio == "none" or 0 <= ratio <= 1,
        f'slo.max_error_ratio: must be within [0, 1] or "none", got {ratio}',
    )
    for stage, limit in cfg.slo.stage_p99_ms.items():
        _require(stage in STAGES, f"slo.stage_p99_ms.{stage}: unknown stage (known: {', '.join(STAGES)})")
        _require(limit >= 0, f"slo.stage_p99_ms.{stage}: must be >= 0, got {limit}")
    cp = cfg.compare
    _require(
        0 <= cp.max_throughput_drop < 1,
        f"compare.max_throughput_drop: must be within [0, 1), got {cp.max_throughput_drop}",
    )
    for name in ("max_p99_increase", "max_error_ratio_increase"):
        _require(getattr(cp, name) >= 0, f"compare.{name}: must be >= 0, got {getattr(cp, name)}")
    _require(0.5 <= cp.confidence < 1, f"compare.confidence: must be within [0.5, 1), got {cp.confidence}")
    _require_range(
        "compare.resamples", cp.resamples, 100, MAX_RESAMPLES, "past a million a 95% interval no longer moves"
    )
    ph = cfg.phases
    _require(0.0 < ph.ramp_from <= 1.0, f"phases.ramp_from: must be within (0, 1], got {ph.ramp_from}")
    _require(ph.probe_factor > 0, f"phases.probe_factor: must be > 0, got {ph.probe_factor}")
    if ld.open_loop and ld.rate is not None and ph.probe_schedule:
        _require(
            ld.rate * ph.probe_factor <= MAX_RATE,
            f"phases.probe_factor: {ph.probe_factor:g} x load.rate {ld.rate:g} is over the bound of "
            f"{MAX_RATE:g} requests/s (load.rate's)",
        )
    if ph.probe_schedule:
        try:
            check_crontab(ph.probe_schedule)
        except ValueError as exc:
            raise ConfigError(
                f"phases.probe_schedule: {ph.probe_schedule!r}: {exc} (use crontab syntax, e.g. '0 * * * *')"
            ) from None
    _require(
        cfg.state.window >= cfg.state.flush_interval,
        f"state.window: must be >= state.flush_interval ({cfg.state.flush_interval}s), got {cfg.state.window}s",
    )
    _require(
        cfg.state.flush_interval >= MIN_FLUSH_INTERVAL,
        f"state.flush_interval: must be >= {MIN_FLUSH_INTERVAL:g}s (each flush is one SQLite transaction), "
        f"got {cfg.state.flush_interval:g}s",
    )
    if cfg.state.run_id is not None:
        check_run_id(cfg.state.run_id)
    for key, value in (("output.log_file", cfg.output.log_file), ("output.summary_json", cfg.output.summary_json)):
        if value is not None:
            _require(bool(value.strip()), f"{key}: empty path")
            _require(not Path(value).is_dir(), f"{key}: {value} is a directory, not a file")
    if cfg.output.log_file is not None:
        parent = Path(cfg.output.log_file).parent
        _require(parent.is_dir(), f"output.log_file: {cfg.output.log_file}: directory {parent} does not exist")


TARGET_APIS = ("http", "openai", "kserve-v2")


def _validate_target(cfg: Config) -> None:
    tg = cfg.target
    for pid in tg.watch_pid:
        _require(pid >= 1, f"target.watch_pid: expected process ids >= 1, got {pid}")
    for unit in tg.watch_unit:
        _require(
            bool(unit.strip()) and not unit.startswith("-") and "=" not in unit,
            f"target.watch_unit: expected a systemd unit name, got {unit!r}",
        )
    for url in tg.scrape:
        _require(
            re.fullmatch(r"https?://[^/\s]+(/\S*)?", url) is not None,
            f"target.scrape: expected http://HOST:PORT/metrics, got {url!r}",
        )
    for name in tg.scrape_metrics:
        _require(
            re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name) is not None,
            f"target.scrape_metrics: {name!r} is not a Prometheus metric name",
        )
    _require(tg.scrape_timeout <= 30, f"target.scrape_timeout: at most 30s, got {tg.scrape_timeout}s")
    _require(
        tg.max_connections is None or tg.max_connections >= 1,
        f"target.max_connections: must be >= 1, got {tg.max_connections}",
    )
    _require(tg.api in TARGET_APIS, f"target.api: expected {', '.join(TARGET_APIS)}, got {tg.api!r}")
    if tg.url is None:
        return
    from urllib.parse import urlsplit  # local, as the checks above: only a run with a target needs it

    parts = urlsplit(tg.url)
    _require(
        parts.scheme in ("http", "https", "grpc") and bool(parts.hostname),
        f"target.url: expected http://HOST[:PORT]/PATH (or grpc://HOST:PORT for kserve-v2), got {tg.url!r}",
    )
    if tg.api == "kserve-v2":
        grpc_ok = parts.scheme != "grpc" or (parts.port is not None and parts.path in ("", "/"))
        _require(grpc_ok, f"target.url: expected grpc://HOST:PORT (a port, no path), got {tg.url!r}")
        _validate_kserve(cfg)
    else:
        _require(parts.scheme != "grpc", f"target.url: grpc:// is for --api kserve-v2, got --api {tg.api}")
    _require(
        cfg.model.spec == ModelConfig.spec,
        f"model.spec and target.url: choose one (a model in soakd's process, or a served one), "
        f"got {cfg.model.spec!r} and {tg.url!r}",
    )
    if tg.api == "openai":
        _validate_openai(cfg)
        return
    if tg.api == "http":
        _require(
            cfg.input.samples is not None,
            "input.samples: --api http POSTs the .json files of --samples DIR; none given",
        )


def _validate_kserve(cfg: Config) -> None:
    tg = cfg.target
    _require(bool(tg.model), "target.model: --api kserve-v2 needs the served model's name (--target-model NAME)")
    _require(
        tg.datatype is None or tg.datatype in V2_DATATYPES,
        f"target.datatype: expected one of {', '.join(V2_DATATYPES)}, got {tg.datatype!r}",
    )
    _require(
        not is_seq_spec(cfg.input.shapes),
        f"input.shapes: {cfg.input.shapes!r} is a token-length spec; kserve-v2 takes tensor shapes (16, 3x224x224)",
    )


def _validate_openai(cfg: Config) -> None:
    tg = cfg.target
    _require(
        tg.openai_endpoint in ("chat", "completions"),
        f"target.openai_endpoint: expected chat or completions, got {tg.openai_endpoint!r}",
    )
    if tg.output_tokens is not None:
        parse_output_tokens(tg.output_tokens)
    if cfg.input.samples is None:
        _require(
            is_seq_spec(cfg.input.shapes),
            "input.shapes: --api openai needs prompt lengths in tokens (--input-shapes 'seq:fixed(n=128)', "
            f"seq:uniform(...) or seq:lognormal(...)) or prompts in --samples DIR; got {cfg.input.shapes!r}",
        )
    if tg.tokenizer is not None:
        _require(Path(tg.tokenizer).is_dir(), f"target.tokenizer: {tg.tokenizer}: not a directory")


def parse_output_tokens(value: str) -> SeqLenSpec:
    """``--output-tokens``: ``N`` or a ``seq:`` length spec (``seq:uniform(min=16,max=256)``)."""
    text = value.strip()
    if text.isdigit():
        text = f"seq:fixed(n={text})"
    elif not is_seq_spec(text):
        text = SEQ_PREFIX + text  # "uniform(min=16,max=256)" reads the same
    try:
        return parse_seq_spec(text)
    except ValueError as exc:
        raise ConfigError(
            f"target.output_tokens: {value!r}: expected N or a length spec such as seq:uniform(min=16,max=256) "
            f"({str(exc).removeprefix('input.shapes: ')})"
        ) from None


def _validate_leak(lk: LeakConfig) -> None:
    for name, floor in lk.min_slope_bytes_per_hour.items():
        known = ", ".join(("default", *LEAK_SERIES, TARGET_METRIC_PREFIX + "NAME"))
        _require(
            name in LEAK_SERIES or name == "default" or name.startswith(TARGET_METRIC_PREFIX),
            f"leak.min_slope_bytes_per_hour.{name}: unknown series (known: {known})",
        )
        _require(floor >= 0, f"leak.min_slope_bytes_per_hour.{name}: must be >= 0, got {floor}")
    _require(0 < lk.alpha < 0.5, f"leak.alpha: must be within (0, 0.5), got {lk.alpha}")
    _require(lk.trough_span >= lk.bin, f"leak.trough_span: must be >= leak.bin ({lk.bin}s), got {lk.trough_span}s")
    _require(
        lk.min_span >= 4 * lk.bin,
        f"leak.min_span: must hold at least 4 envelope points (>= {4 * lk.bin}s), got {lk.min_span}s",
    )
    _require(
        lk.cuda_history in ("auto", "always", "off"),
        f"leak.cuda_history: expected auto, always or off, got {lk.cuda_history!r}",
    )
    _require(
        1 <= lk.cuda_history_max_entries <= 10_000_000,
        f"leak.cuda_history_max_entries: must be within [1, 10000000], got {lk.cuda_history_max_entries}",
    )


# --------------------------------------------------------------------------- secrets

# Key-name parts that mark a credential. Matched on whole parts (``api_token``, ``apiKey``,
# ``X-Auth-Token``), so ``max_tokens`` or ``keyframes`` stay readable.
SECRET_PARTS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "authorization",
        "auth",
        "credential",
        "credentials",
        "cookie",
        "bearer",
    }
)
REDACTED = "<redacted>"
_KEY_PART_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def is_secret_key(name: str) -> bool:
    """Whether a config key's name says its value is a credential (case-insensitive, by parts)."""
    return any(part.lower() in SECRET_PARTS for part in _KEY_PART_RE.findall(name))


def redact_secrets(data: Any) -> Any:
    """A copy of ``data`` (dicts, lists, scalars) with the value of every credential-like key
    replaced by ``"<redacted>"``, at any depth. The one redaction every output goes through:
    summary.json and the state database (the run fingerprint's ``config``), and the reports."""
    if isinstance(data, dict):
        return {
            k: REDACTED if isinstance(k, str) and is_secret_key(k) and v is not None else redact_secrets(v)
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple)):
        return [redact_secrets(v) for v in data]
    return data
