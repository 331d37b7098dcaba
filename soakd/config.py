"""Typed configuration: defaults, TOML loading, CLI overrides, validation.

Every key has a default, so an empty file (or none) is a valid config. Every error names
the key path (``load.concurrency``) or the file, and surfaces as :class:`ConfigError`,
which the CLI turns into exit code 2.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


from soakd.errors import ConfigError

__all__ = ["ConfigError"]  # re-exported: most callers meet it here, beside load_config


_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|us|µs|s|m|h|d)?", re.IGNORECASE)
_UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str | float | int) -> float:
    """Parse ``90s``, ``1h30m``, ``250ms`` or a plain number of seconds into seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
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
    drain_timeout: float = _duration(30.0)
    seed: int = 0


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
    alpha: float = 0.01  # false-alarm probability per 24 h of judging a leak-free series
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
    max_error_ratio: float | None = None
    min_throughput_rps: float | None = None
    stage_p99_ms: dict[str, float] = field(default_factory=dict)  # per stage, e.g. {inference = 20.0}
    no_leak: list[str] = field(default_factory=list)  # memory series that must not be judged leaking
    min_duration: float | None = _duration(None)  # a shorter run cannot pass (too short to judge)


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def closed_loop(self) -> bool:
        return self.load.rate is None


# --------------------------------------------------------------------------- loading


def _coerce(value: Any, tp: Any, path: str, meta: typing.Mapping[str, Any]) -> Any:
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
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
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


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read TOML (when given), apply ``{"load.concurrency": 4}``-style overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            with p.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read config file: {exc.strerror}") from None
    overrides = overrides or {}
    # A load mode given on the command line replaces the other mode from the file.
    if "load.concurrency" in overrides and "load.rate" not in overrides:
        data.get("load", {}).pop("rate", None)
    if "load.rate" in overrides and "load.concurrency" not in overrides:
        data.get("load", {}).pop("concurrency", None)
    for key, value in overrides.items():
        _set_path(data, key, value)
    cfg: Config = _build(Config, data, "")
    validate(cfg)
    return cfg


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


_SHAPE_ITEM_RE = re.compile(r"^\d+(x\d+)*(=\d+(\.\d*)?)?$")


def validate(cfg: Config) -> None:
    """Cross-field and range checks; raises ConfigError naming the key path."""
    from soakd.models.spec import check_model_spec  # local: keeps torch out of config import

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
    ld = cfg.load
    _require(
        ld.concurrency is None or ld.rate is None,
        "load.concurrency and load.rate: choose one (closed loop or open loop), not both",
    )
    if ld.concurrency is None and ld.rate is None:
        ld.concurrency = 8
    if ld.concurrency is not None:
        _require(ld.concurrency >= 1, f"load.concurrency: must be >= 1, got {ld.concurrency}")
    if ld.rate is not None:
        _require(ld.rate > 0, f"load.rate: must be > 0 requests/s, got {ld.rate}")
    _require(
        ld.arrival in ("constant", "poisson", "gamma"),
        f"load.arrival: expected constant, poisson or gamma, got {ld.arrival!r}",
    )
    _require(ld.burstiness > 0, f"load.burstiness: must be > 0, got {ld.burstiness}")
    _require(ld.max_inflight >= 1, f"load.max_inflight: must be >= 1, got {ld.max_inflight}")
    b = cfg.batcher
    _require(b.max_batch_size >= 1, f"batcher.max_batch_size: must be >= 1, got {b.max_batch_size}")
    _require(b.max_queue_delay_ms >= 0, f"batcher.max_queue_delay_ms: must be >= 0, got {b.max_queue_delay_ms}")
    _require(b.instances >= 1, f"batcher.instances: must be >= 1, got {b.instances}")
    _require(cfg.input.pool >= 1, f"input.pool: must be >= 1, got {cfg.input.pool}")
    if cfg.input.shapes.replace(" ", "").startswith("seq:"):
        from soakd.workload.seqlen import parse_seq_spec  # local: numpy and torch stay out of config import

        try:
            parse_seq_spec(cfg.input.shapes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    elif cfg.input.shapes:
        for item in cfg.input.shapes.replace(" ", "").split(","):
            _require(
                bool(_SHAPE_ITEM_RE.match(item)),
                f"input.shapes: cannot parse {item!r} (use e.g. 3x224x224 or 3x224x224=0.6,3x96x96=0.4)",
            )
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
    _, sep, port = cfg.metrics.addr.rpartition(":")
    _require(
        bool(sep) and port.isdigit() and 0 <= int(port) <= 65535,
        f"metrics.addr: expected HOST:PORT, got {cfg.metrics.addr!r}",
    )
    _require(cfg.memory.ring_size >= 10, f"memory.ring_size: must be >= 10, got {cfg.memory.ring_size}")
    _validate_leak(cfg.leak)
    _require(
        0.0 <= cfg.otel.trace_sample_ratio <= 1.0,
        f"otel.trace_sample_ratio: must be within [0, 1], got {cfg.otel.trace_sample_ratio}",
    )
    for name in ("p99_ms", "max_error_ratio", "min_throughput_rps"):
        v = getattr(cfg.slo, name)
        _require(v is None or v >= 0, f"slo.{name}: must be >= 0, got {v}")
    from soakd.telemetry.catalogue import STAGES

    for stage, limit in cfg.slo.stage_p99_ms.items():
        _require(stage in STAGES, f"slo.stage_p99_ms.{stage}: unknown stage (known: {', '.join(STAGES)})")
        _require(limit >= 0, f"slo.stage_p99_ms.{stage}: must be >= 0, got {limit}")
    cp = cfg.compare
    _require(0 <= cp.max_throughput_drop < 1,
             f"compare.max_throughput_drop: must be within [0, 1), got {cp.max_throughput_drop}")
    for name in ("max_p99_increase", "max_error_ratio_increase"):
        _require(getattr(cp, name) >= 0, f"compare.{name}: must be >= 0, got {getattr(cp, name)}")
    _require(0.5 <= cp.confidence < 1, f"compare.confidence: must be within [0.5, 1), got {cp.confidence}")
    _require(cp.resamples >= 100, f"compare.resamples: must be >= 100, got {cp.resamples}")
    ph = cfg.phases
    _require(0.0 < ph.ramp_from <= 1.0, f"phases.ramp_from: must be within (0, 1], got {ph.ramp_from}")
    _require(ph.probe_factor > 0, f"phases.probe_factor: must be > 0, got {ph.probe_factor}")
    if ph.probe_schedule:
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(ph.probe_schedule)
        except ValueError as exc:
            raise ConfigError(f"phases.probe_schedule: {ph.probe_schedule!r}: {exc} (use crontab syntax, "
                              "e.g. '0 * * * *')") from None
    _require(cfg.state.window >= cfg.state.flush_interval,
             f"state.window: must be >= state.flush_interval ({cfg.state.flush_interval}s), "
             f"got {cfg.state.window}s")


def _validate_leak(lk: LeakConfig) -> None:
    from soakd.telemetry.catalogue import LEAK_SERIES

    for name, floor in lk.min_slope_bytes_per_hour.items():
        known = ", ".join(("default", *LEAK_SERIES))
        _require(name in LEAK_SERIES or name == "default",
                 f"leak.min_slope_bytes_per_hour.{name}: unknown series (known: {known})")
        _require(floor >= 0, f"leak.min_slope_bytes_per_hour.{name}: must be >= 0, got {floor}")
    _require(0 < lk.alpha < 0.5, f"leak.alpha: must be within (0, 0.5), got {lk.alpha}")
    # A window shorter than 30 evaluations (an accelerated run) is judged that often instead.
    lk.evaluate_interval = min(lk.evaluate_interval, max(1.0, lk.window / 30))
    _require(lk.trough_span >= lk.bin,
             f"leak.trough_span: must be >= leak.bin ({lk.bin}s), got {lk.trough_span}s")
    _require(lk.min_span >= 4 * lk.bin,
             f"leak.min_span: must hold at least 4 envelope points (>= {4 * lk.bin}s), got {lk.min_span}s")
    _require(lk.cuda_history in ("auto", "always", "off"),
             f"leak.cuda_history: expected auto, always or off, got {lk.cuda_history!r}")
    _require(1 <= lk.cuda_history_max_entries <= 10_000_000,
             f"leak.cuda_history_max_entries: must be within [1, 10000000], "
             f"got {lk.cuda_history_max_entries}")
