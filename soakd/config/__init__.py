"""Typed configuration: defaults, TOML loading, CLI overrides, validation.

Every key has a default, so an empty file (or none) is a valid config. Every error names
the key path (``load.concurrency``) or the file, and surfaces as :class:`ConfigError`,
which the CLI turns into exit code 2. Every number has a bound that follows from the machine
or the protocol (:mod:`soakd.config.bounds`), and the error names the key, the value and the bound.

- :mod:`soakd.config.schema`: the sections as dataclasses; each key one declaration of its type,
  default, meaning, unit and bounds
- :mod:`soakd.config.keys`: how a key declares those (``doc``, ``SECONDS``) and ``--help`` from them
- :mod:`soakd.config.read`: :func:`load_config`, a TOML file and overrides to a validated Config
- :mod:`soakd.config.convert`: TOML values and flag strings into the dataclasses (msgspec), errors
  as ``key.path: what is wrong, got VALUE``
- :mod:`soakd.config.validate`: cross-field and text checks, free of side effects and of the host
- :mod:`soakd.config.parse`: durations, ``HOST:PORT``, run ids, ``--output-tokens``
- :mod:`soakd.config.bounds`: the bounds and why each holds
- :mod:`soakd.config.redact`: credential-like values replaced in every output

This package imports nothing of soakd above it: only :mod:`soakd.errors`, :mod:`soakd.names`
and :mod:`soakd.specs` (the pure parsers of the strings a config holds). Every name is
re-exported here: callers import from ``soakd.config``.
"""

from __future__ import annotations

from soakd.config.bounds import (
    DTYPE_BYTES,
    MAX_BURSTINESS,
    MAX_INT,
    MAX_RATE,
    MAX_RESAMPLES,
    MIN_FLUSH_INTERVAL,
    MIN_MEMORY_INTERVAL,
    MIN_TIMER,
    MODEL_THREADS_PER_CPU,
    REQUEST_BYTES,
    RING_SAMPLE_BYTES,
    RING_SERIES,
    TENSOR_OVERHEAD_BYTES,
    TOKEN_BYTES,
    format_bytes,
)
from soakd.config.convert import config_keys
from soakd.config.keys import SECONDS, SECONDS_OR_OFF, KeyInfo, doc, flag_help
from soakd.config.parse import (
    MAX_DURATION,
    MAX_RUN_ID,
    check_run_id,
    parse_duration,
    parse_host_port,
    parse_output_tokens,
)
from soakd.config.read import MAX_CONFIG_BYTES, load_config, read_toml, settle
from soakd.config.redact import REDACTED, SECRET_PARTS, is_secret_key, redact_secrets
from soakd.config.schema import (
    SCRAPE_METRICS,
    TARGET_APIS,
    BatcherConfig,
    CompareConfig,
    Config,
    DaemonConfig,
    InputConfig,
    LeakConfig,
    LoadConfig,
    MemoryConfig,
    MetricsConfig,
    ModelConfig,
    OtelConfig,
    OutputConfig,
    PhasesConfig,
    SloConfig,
    StateConfig,
    TargetConfig,
)
from soakd.config.validate import validate
from soakd.errors import ConfigError  # most callers meet it here, beside load_config

__all__ = [
    "DTYPE_BYTES",
    "MAX_BURSTINESS",
    "MAX_CONFIG_BYTES",
    "MAX_DURATION",
    "MAX_INT",
    "MAX_RATE",
    "MAX_RESAMPLES",
    "MAX_RUN_ID",
    "MIN_FLUSH_INTERVAL",
    "MIN_MEMORY_INTERVAL",
    "MIN_TIMER",
    "MODEL_THREADS_PER_CPU",
    "REDACTED",
    "REQUEST_BYTES",
    "RING_SAMPLE_BYTES",
    "RING_SERIES",
    "SCRAPE_METRICS",
    "SECONDS",
    "SECONDS_OR_OFF",
    "SECRET_PARTS",
    "TARGET_APIS",
    "TENSOR_OVERHEAD_BYTES",
    "TOKEN_BYTES",
    "BatcherConfig",
    "CompareConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "InputConfig",
    "KeyInfo",
    "LeakConfig",
    "LoadConfig",
    "MemoryConfig",
    "MetricsConfig",
    "ModelConfig",
    "OtelConfig",
    "OutputConfig",
    "PhasesConfig",
    "SloConfig",
    "StateConfig",
    "TargetConfig",
    "check_run_id",
    "config_keys",
    "doc",
    "flag_help",
    "format_bytes",
    "is_secret_key",
    "load_config",
    "parse_duration",
    "parse_host_port",
    "parse_output_tokens",
    "read_toml",
    "redact_secrets",
    "settle",
    "validate",
]
