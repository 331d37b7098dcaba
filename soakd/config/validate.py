"""Checks across keys, and of the text a key holds (a model spec, a URL, a crontab): :func:`validate`
raises ConfigError naming the key path, the value and the bound. One key's own type and range are
declared on it in :mod:`soakd.config.schema`, and msgspec checks them before this runs.
:func:`validate` changes nothing, and judges a file the same way on every machine (the host's own
bounds are :mod:`soakd.host_limits`)."""

from __future__ import annotations

import re
from pathlib import Path

from soakd.config.bounds import MAX_RATE, MAX_SHARDS
from soakd.config.parse import check_run_id, parse_host_port, parse_instant, parse_output_tokens, parse_shard
from soakd.config.schema import (
    BatcherConfig,
    Config,
    DaemonConfig,
    InputConfig,
    LeakConfig,
    LoadConfig,
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


def validate(cfg: Config) -> None:
    """Cross-field and range checks; raises ConfigError naming the key path, value and bound.

    The sections are checked in this order, so a file with several errors gets the same first
    one every time."""
    _validate_model(cfg.model)
    _validate_load(cfg.load)
    _validate_workers(cfg)
    _validate_batcher(cfg.batcher, cfg.daemon)
    _validate_input(cfg.input, cfg.model)
    parse_host_port(cfg.metrics.addr)
    _validate_leak(cfg.leak)
    _validate_target(cfg)
    _validate_slo(cfg.slo)
    _validate_phases(cfg.phases, cfg.load)
    _validate_state(cfg.state)
    _validate_output(cfg.output)


def _validate_model(md: ModelConfig) -> None:
    check_model_spec(md.spec)
    _require(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", md.device) is not None,
        f"model.device: expected auto, cpu or cuda[:N], got {md.device!r}",
    )


def _validate_replay(ld: LoadConfig) -> None:
    """A trace sets the arrivals (docs/replay.md): no rate or concurrency beside it."""
    if ld.replay is None:
        return
    _require(
        ld.rate is None and ld.concurrency is None,
        "load.replay: the trace sets the arrivals; remove load.rate and load.concurrency (or --rate, --concurrency)",
    )
    _require(bool(ld.replay.strip()), "load.replay: empty path")
    _require(Path(ld.replay).is_file(), f"load.replay: {ld.replay}: no such file")
    # Format, speed, block tokens and sort window: bounds on the keys themselves (schema.py).


def _validate_load(ld: LoadConfig) -> None:
    _require(
        ld.concurrency is None or ld.rate is None,
        "load.concurrency and load.rate: choose one (closed loop or open loop), not both",
    )
    _validate_replay(ld)
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
    stall_ms = daemon.stall_timeout * 1000
    _require(
        b.max_queue_delay_ms < stall_ms,
        f"batcher.max_queue_delay_ms: {b.max_queue_delay_ms:g} is over the bound of daemon.stall_timeout "
        f"({stall_ms:g} ms: a request waiting that long for a batch reads as a hung model)",
    )


def _validate_input(inp: InputConfig, md: ModelConfig) -> None:
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


def _validate_slo(slo: SloConfig) -> None:
    for stage, limit in slo.stage_p99_ms.items():
        _require(stage in STAGES, f"slo.stage_p99_ms.{stage}: unknown stage (known: {', '.join(STAGES)})")
        _require(limit >= 0, f"slo.stage_p99_ms.{stage}: must be >= 0, got {limit}")


def _validate_phases(ph: PhasesConfig, ld: LoadConfig) -> None:
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
    if st.run_id is not None:
        check_run_id(st.run_id)


def _validate_output(out: OutputConfig) -> None:
    for key, value in (
        ("output.log_file", out.log_file),
        ("output.summary_json", out.summary_json),
        ("output.record_requests", out.record_requests),
    ):
        if value is not None:
            _require(bool(value.strip()), f"{key}: empty path")
            _require(not Path(value).is_dir(), f"{key}: {value} is a directory, not a file")
    for key, value in (("output.log_file", out.log_file), ("output.record_requests", out.record_requests)):
        if value is not None:
            parent = Path(value).parent
            _require(parent.is_dir(), f"{key}: {value}: directory {parent} does not exist")


def _validate_target(cfg: Config) -> None:
    tg = cfg.target
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
    if tg.output_tokens is not None:
        parse_output_tokens(tg.output_tokens)
    if cfg.input.samples is None and cfg.load.replay is None:  # a trace gives each prompt's length
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
    _require(lk.trough_span >= lk.bin, f"leak.trough_span: must be >= leak.bin ({lk.bin}s), got {lk.trough_span}s")
    _require(
        lk.min_span >= 4 * lk.bin,
        f"leak.min_span: must hold at least 4 envelope points (>= {4 * lk.bin}s), got {lk.min_span}s",
    )
