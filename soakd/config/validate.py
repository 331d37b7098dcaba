"""Range and cross-field checks: :func:`validate` raises ConfigError naming the key path, the
value and the bound. It changes nothing, and judges a file the same way on every machine (the
host's own bounds are :mod:`soakd.host_limits`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from soakd.config.bounds import (
    MAX_BURSTINESS,
    MAX_INT,
    MAX_RATE,
    MAX_RESAMPLES,
    MAX_SHARDS,
    MAX_WORKERS,
    MIN_FLUSH_INTERVAL,
    MIN_MEMORY_INTERVAL,
    MIN_TIMER,
)
from soakd.config.parse import check_run_id, parse_host_port, parse_instant, parse_output_tokens, parse_shard
from soakd.config.schema import (
    BatcherConfig,
    CompareConfig,
    Config,
    DaemonConfig,
    InputConfig,
    LeakConfig,
    LoadConfig,
    MemoryConfig,
    ModelConfig,
    OutputConfig,
    PhasesConfig,
    SloConfig,
    StateConfig,
)
from soakd.errors import ConfigError
from soakd.names import LEAK_SERIES, STAGES, TARGET_METRIC_PREFIX
from soakd.specs import (
    V2_DATATYPES,
    check_crontab,
    check_model_input,
    check_model_spec,
    is_seq_spec,
    parse_seq_spec,
    parse_shape_mix,
)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


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
    """Cross-field and range checks; raises ConfigError naming the key path, value and bound.

    The sections are checked in this order, so a file with several errors gets the same first
    one every time."""
    _validate_model(cfg.model)
    _check_durations(cfg)
    _validate_load(cfg.load)
    _validate_workers(cfg)
    _validate_batcher(cfg.batcher, cfg.daemon)
    _validate_input(cfg.input, cfg.model)
    parse_host_port(cfg.metrics.addr)
    _validate_memory(cfg.memory)
    _validate_leak(cfg.leak)
    _validate_target(cfg)
    _require(
        0.0 <= cfg.otel.trace_sample_ratio <= 1.0,
        f"otel.trace_sample_ratio: must be within [0, 1], got {cfg.otel.trace_sample_ratio}",
    )
    _validate_slo(cfg.slo)
    _validate_compare(cfg.compare)
    _validate_phases(cfg.phases, cfg.load)
    _validate_state(cfg.state)
    _validate_output(cfg.output)


def _validate_model(md: ModelConfig) -> None:
    check_model_spec(md.spec)
    _require(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", md.device) is not None,
        f"model.device: expected auto, cpu or cuda[:N], got {md.device!r}",
    )
    _require(md.warmup >= 0, f"model.warmup: must be >= 0, got {md.warmup}")
    _require(
        md.dtype in ("float32", "float16", "bfloat16"),
        f"model.dtype: expected float32, float16 or bfloat16, got {md.dtype!r}",
    )


def _validate_load(ld: LoadConfig) -> None:
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
    shard = parse_shard(ld.shard)
    parse_instant(ld.start_at)
    if shard is not None:
        _require(shard[1] <= MAX_SHARDS, f"load.shard: at most {MAX_SHARDS} shards, got {ld.shard!r}")
    if shard is not None and ld.concurrency is not None:
        _require(
            ld.concurrency >= shard[1],
            f"load.concurrency: {ld.concurrency} is less than the {shard[1]} shards of load.shard {ld.shard!r} "
            "(each shard drives at least one request in flight)",
        )


def _validate_workers(cfg: Config) -> None:
    ld = cfg.load
    _require(
        1 <= ld.workers <= MAX_WORKERS, f"load.workers: must be within [1, {MAX_WORKERS}] processes, got {ld.workers}"
    )
    if ld.workers > 1:
        _require(
            cfg.target.url is not None,
            "load.workers: driver processes are for a served model (--target); a model in soakd's own "
            "process takes more threads instead (batcher.instances)",
        )
        _require(
            not ld.shard,
            f"load.workers and load.shard: choose one (--workers splits this host's share; got shard {ld.shard!r})",
        )


def _validate_batcher(b: BatcherConfig, daemon: DaemonConfig) -> None:
    _require(b.max_batch_size >= 1, f"batcher.max_batch_size: must be >= 1, got {b.max_batch_size}")
    stall_ms = daemon.stall_timeout * 1000
    _require(b.max_queue_delay_ms >= 0, f"batcher.max_queue_delay_ms: must be >= 0, got {b.max_queue_delay_ms}")
    _require(
        b.max_queue_delay_ms < stall_ms,
        f"batcher.max_queue_delay_ms: {b.max_queue_delay_ms:g} is over the bound of daemon.stall_timeout "
        f"({stall_ms:g} ms: a request waiting that long for a batch reads as a hung model)",
    )
    _require(b.instances >= 1, f"batcher.instances: must be >= 1, got {b.instances}")


def _validate_input(inp: InputConfig, md: ModelConfig) -> None:
    _require(inp.pool >= 1, f"input.pool: must be >= 1, got {inp.pool}")
    if is_seq_spec(inp.shapes):
        try:
            parse_seq_spec(inp.shapes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    elif inp.shapes:
        try:
            parse_shape_mix(inp.shapes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    check_model_input(md.spec, inp.shapes, inp.samples)
    if inp.samples is not None:
        _require(Path(inp.samples).is_dir(), f"input.samples: {inp.samples}: no such directory")
    _require(
        1 <= inp.preprocess_workers <= 256,
        f"input.preprocess_workers: must be within [1, 256], got {inp.preprocess_workers}",
    )
    _require(
        inp.postprocess in ("auto", "none", "classify", "detect"),
        f"input.postprocess: expected auto, none, classify or detect, got {inp.postprocess!r}",
    )
    _require(inp.max_tokens >= 1, f"input.max_tokens: must be >= 1, got {inp.max_tokens}")
    _require(inp.max_sample_bytes >= 1, f"input.max_sample_bytes: must be >= 1, got {inp.max_sample_bytes}")


def _validate_memory(mem: MemoryConfig) -> None:
    _require(mem.ring_size >= 10, f"memory.ring_size: must be >= 10, got {mem.ring_size}")
    _require(
        mem.interval >= MIN_MEMORY_INTERVAL,
        f"memory.interval: must be >= {MIN_MEMORY_INTERVAL:g}s (one round of every memory collector "
        f"takes milliseconds), got {mem.interval:g}s",
    )


def _validate_slo(slo: SloConfig) -> None:
    for name in ("p99_ms", "min_throughput_rps", "ttft_ms", "tpot_ms"):
        v = getattr(slo, name)
        _require(v is None or v >= 0, f"slo.{name}: must be >= 0, got {v}")
    ratio = slo.max_error_ratio
    _require(
        ratio is None or ratio == "none" or 0 <= ratio <= 1,
        f'slo.max_error_ratio: must be within [0, 1] or "none", got {ratio}',
    )
    for stage, limit in slo.stage_p99_ms.items():
        _require(stage in STAGES, f"slo.stage_p99_ms.{stage}: unknown stage (known: {', '.join(STAGES)})")
        _require(limit >= 0, f"slo.stage_p99_ms.{stage}: must be >= 0, got {limit}")


def _validate_compare(cp: CompareConfig) -> None:
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


def _validate_phases(ph: PhasesConfig, ld: LoadConfig) -> None:
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


def _validate_state(st: StateConfig) -> None:
    _require(
        st.window >= st.flush_interval,
        f"state.window: must be >= state.flush_interval ({st.flush_interval}s), got {st.window}s",
    )
    _require(
        st.flush_interval >= MIN_FLUSH_INTERVAL,
        f"state.flush_interval: must be >= {MIN_FLUSH_INTERVAL:g}s (each flush is one SQLite transaction), "
        f"got {st.flush_interval:g}s",
    )
    if st.run_id is not None:
        check_run_id(st.run_id)


def _validate_output(out: OutputConfig) -> None:
    for key, value in (("output.log_file", out.log_file), ("output.summary_json", out.summary_json)):
        if value is not None:
            _require(bool(value.strip()), f"{key}: empty path")
            _require(not Path(value).is_dir(), f"{key}: {value} is a directory, not a file")
    if out.log_file is not None:
        parent = Path(out.log_file).parent
        _require(parent.is_dir(), f"output.log_file: {out.log_file}: directory {parent} does not exist")


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
